"""The paging timeline: its encoding in a baseline, and the first divergence named step by step."""

from pytest_llmperf import baseline
from pytest_llmperf.baseline import Entry
from pytest_llmperf.paging_timeline import Step, Timeline, first_divergence
from pytest_llmperf.trace import KVSample


def sample(running, waiting, blocks, admitted=(), preempted=()):
    return KVSample(0.0, blocks, 48, 32, blocks * 20, running, waiting, admitted=admitted, preempted=preempted)


BASE = [sample(4, 2, 10, admitted=("0", "1", "2", "3")), sample(4, 2, 12), sample(4, 2, 12), sample(4, 2, 12),
        sample(3, 3, 12, preempted=("3",)), sample(4, 1, 14, admitted=("4", "3")), sample(2, 0, 9)]


def test_the_encoding_is_small_and_round_trips():
    t = Timeline.of(BASE)
    d = t.to_dict()
    assert d["steps"] == "4/2/10 4/2/12*3 3/3/12 4/1/14 2/0/9"
    assert d["events"] == ["s0 r4 w2 b10 +0..3", "s4 r3 w3 b12 -3", "s5 r4 w1 b14 +4,3"]
    assert Timeline.from_dict(d) == t and len(d["hash"]) == 16
    assert Timeline.of(BASE).to_dict()["hash"] == d["hash"]  # the same steps, the same hash
    assert t.preemptions == 1


def test_the_first_divergence_names_the_step_and_what_each_side_did():
    moved = list(BASE)
    moved[4] = sample(4, 2, 13)  # the current run did not preempt request 3 at step 4
    moved[5] = sample(4, 1, 14, admitted=("4",))
    text = first_divergence(Timeline.of(BASE), Timeline.of(moved))
    assert text.startswith("paging timeline diverged at step 4: baseline 3 running, 3 waiting, 12 blocks in use, "
                           "preempted 3; current 4 running, 2 waiting, 13 blocks in use;")
    # a preemption that did not happen at all is not one that moved
    assert text.endswith("7 -> 7 steps, 1 -> 0 preemptions, first preemption at step 4 -> -")
    assert first_divergence(Timeline.of(BASE), Timeline.of(BASE)) is None
    longer = first_divergence(Timeline.of(BASE), Timeline.of([*BASE, sample(1, 0, 4)]))
    assert "at step 7: baseline had ended; current 1 running" in longer and "7 -> 8 steps" in longer


def test_preemptions_that_moved_are_counted_even_when_their_number_did_not_change():
    base = [*BASE[:4], sample(3, 3, 12), sample(3, 3, 12, preempted=("3",)), sample(4, 1, 14, admitted=("4", "3")),
            sample(2, 0, 9), sample(3, 0, 10, preempted=("2",)), sample(1, 0, 3)]
    later = list(base)
    later[8] = sample(3, 0, 10)  # request 2 preempted one step later, the count the same
    later[9] = sample(1, 0, 3, preempted=("2",))
    text = first_divergence(Timeline.of(base), Timeline.of(later))
    assert text.startswith("paging timeline diverged at step 8:")
    assert text.endswith("10 -> 10 steps, 2 -> 2 preemptions, 1 of the baseline's preemptions at another step or "
                         "of another request")
    fewer = list(later)
    fewer[5] = sample(3, 3, 12)  # and request 3 no longer preempted at all: one moved, one gone
    text = first_divergence(Timeline.of(base), Timeline.of(fewer))
    assert text.endswith("2 -> 1 preemptions, first preemption at step 5 -> 9, 1 of the baseline's preemptions at "
                         "another step or of another request")


def test_a_moved_timeline_fails_under_strict_and_is_reported_under_summary():
    old = Entry("0", "w", True, {"kv_blocks_peak": 14}, [{}], timeline=Timeline.of(BASE).to_dict())
    moved = [*BASE[:6], sample(1, 0, 9)]  # same summaries, a different last step
    new = Entry("0", "w", True, {"kv_blocks_peak": 14}, [{}], timeline=Timeline.of(moved).to_dict())
    doc = baseline.document("t", "cpu", "m", {}, [old])
    strict = baseline.compare(doc, [new])
    assert strict.status == "regression" and [r.metric for r in strict.regressions] == ["kv_timeline"]
    assert "diverged at step 6: baseline 2 running" in strict.regressions[0].reason
    assert strict.improvements == () and len(strict.timeline_changes) == 1
    summary = baseline.compare(doc, [new], paging="summary")
    assert summary.status == "pass" and summary.timeline_changes[0].verdict == "reported"
    assert baseline.compare(doc, [Entry.from_dict(old.to_dict())]).rows[-1].metric == "kv_blocks_peak"  # silent
    # timed arrivals: no timeline is kept or compared
    timed = Entry("0", "w", False, {"kv_blocks_peak": 14}, [{}], timeline=Timeline.of(moved).to_dict())
    assert baseline.compare(baseline.document("t", "cpu", "m", {}, [Entry("0", "w", False, {"kv_blocks_peak": 14}, [{}])]),
                            [timed]).timeline_changes == ()


def test_steps_compare_as_values():
    assert Step(1, 0, 2) == Step(1, 0, 2) and Step(1, 0, 2, ("3",)) != Step(1, 0, 2)


def test_the_picture_overlays_both_timelines(tmp_path):
    from pytest_llmperf import plots
    from pytest_llmperf.paging_timeline import divergence_step

    old, new = Timeline.of(BASE), Timeline.of([*BASE[:4], sample(4, 2, 13)])
    assert divergence_step(old, new) == 4 and divergence_step(old, old) is None
    path = plots.timelines_overlaid("0", old, new, tmp_path / "t.png", divergence_step(old, new))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pictures_drawn_side_by_side_and_one_that_fails_loses_no_other(tmp_path):
    """The session's pictures are drawn at its end in child processes; a picture that cannot be drawn
    is named, and the others are still drawn."""
    from pytest_llmperf import plots

    old, new = Timeline.of(BASE), Timeline.of([*BASE[:4], sample(4, 2, 13)])
    good = [plots.Picture("timelines_overlaid", tmp_path / "sub" / f"t{k}.png", ("0", old, new), {"diverged_at": 4})
            for k in range(3)]
    bad = plots.Picture("kv_timeline", tmp_path / "bad.png", ("not a result",))
    errors = plots.draw_all([*good, bad], workers=2)
    assert all(p.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in good)
    (error,) = errors
    assert error.startswith("bad.png: AttributeError") and not (tmp_path / "bad.png").exists()


def test_a_run_whose_paging_is_no_longer_exact_fails_where_paging_is_gated():
    """The baseline's KV pool was fixed (num_gpu_blocks_override), this run's is not (a change dropped the override):
    every paging row turned to "reported" and the timeline went unchecked, so 0 -> 33 preemptions passed, the
    shipped paging module's `llmperf_gate("paging", "memory")` gating memory alone, silently."""
    paging = {"kv_blocks_peak": 47, "kv_preemptions": 0}
    old = Entry("0", "w", True, paging, [{}], timeline=Timeline.of(BASE).to_dict())
    worse = Entry("0", "w", False, {"kv_blocks_peak": 80, "kv_preemptions": 33}, [{}])
    doc = baseline.document("t", "cpu", "m", {}, [old])
    for gate in (None, baseline.gated_metrics(["paging", "memory"])):
        v = baseline.compare(doc, [worse], gated=gate)
        assert v.status == "regression" and [r.metric for r in v.regressions] == ["kv_timeline"], v
        assert v.regressions[0].reason.startswith("the baseline's paging was exact (a fixed KV pool")
        assert v.regressions[0].baseline == 7 and v.regressions[0].current is None
        assert v.timelines == {}  # no picture of where two timelines part: the run has none (it crashed the report)
    assert baseline.compare(doc, [worse], gated=baseline.gated_metrics(["timing"])).status == "pass"  # paging not gated
    # a baseline of timed paging against an exact run: nothing was gated exactly before, nothing is lost
    timed = baseline.document("t", "cpu", "m", {}, [Entry("0", "w", False, paging, [{}])])
    assert baseline.compare(timed, [Entry("0", "w", True, paging, [{}])]).status == "pass"
