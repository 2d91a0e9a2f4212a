"""Curves: capacity, Pareto front, best balance on hand-built results; sweeps, bisection, the
min_capacity marker, plots and curve baselines end to end on real transformers runs."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from pytest_llmperf.metrics import Throughput, summarize
from pytest_llmperf.sweep import Sweep, SweepPoint
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace


def point(value, tokens_per_s, tpot_ms):
    """A result with exactly this TPOT (11 tokens, evenly spaced) and this output throughput."""
    seq = SequenceTrace(0, 0, 8, 11, 0.0, tuple(Chunk(0.001 + k * tpot_ms / 1000, 1) for k in range(11)))
    r = summarize([RunTrace("fake", (seq,), 0.0, 1.0)], "h", 1, label=f"s@{value}")
    return SweepPoint(value, replace(r, throughput=Throughput(tokens_per_s, tokens_per_s, 1.0)))


def test_capacity_is_cut_at_the_first_point_that_breaks_a_limit():
    s = Sweep("concurrency", "s", (point(1, 100, 10), point(2, 180, 20), point(4, 300, 45), point(8, 320, 30)),
              under={"p99_tpot_ms": 40})
    assert s.capacity() == 2  # 8 holds again, but 4 broke the limit first
    assert s.capacity({"p99_tpot_ms": 50}) == 8
    assert s.capacity({"p99_tpot_ms": 5}) is None
    with pytest.raises(ValueError, match="not a measured metric"):
        s.capacity({"p99_latency": 5})


def test_a_bisection_whose_every_load_now_breaks_its_limits_fails_its_baseline():
    """A `find_capacity` curve is compared by its capacity alone (its points' loads differ run to run): where no
    load holds the limits any more there is no capacity, and the gate fails it instead of comparing nothing."""
    from pytest_llmperf import baseline
    from pytest_llmperf.gating import entries

    def curve(tpot_ms):
        return Sweep("rate", "cap", (point(1, 100, tpot_ms), point(2, 180, tpot_ms)), {"p99_tpot_ms": 40}, searched=True)

    before, after = (entries(SimpleNamespace(runs=[], sweeps=[curve(t)])) for t in (10, 90))
    assert before[0].metrics == {"capacity": 2} and after[0].metrics == {"capacity": None}
    stored = baseline.document("t", "cpu", "m", {"engine_version": "1"}, before)
    verdict = baseline.compare(stored, after)
    assert verdict.status == "regression"
    assert verdict.regressions[0].reason == "no load held the latency limits this run (the baseline's capacity 2)"


def test_a_curve_whose_largest_load_held_says_its_capacity_is_only_a_lower_bound():
    from pytest_llmperf.judging import _capped_note

    held = Sweep("rate", "cap", (point(1, 100, 10), point(8, 180, 20)), {"p99_tpot_ms": 40}, searched=True)
    assert held.capped and held.summary()["capped"] is True and held.max_rate == 8
    ((title, text),) = _capped_note(SimpleNamespace(sweeps=[held]))
    assert "sweep 'cap': its largest rate, 8, held every limit: the capacity is at least that, not found; raise hi" in text
    cut = Sweep("rate", "cap", (point(1, 100, 10), point(8, 180, 90)), {"p99_tpot_ms": 40}, searched=True)
    assert not cut.capped and _capped_note(SimpleNamespace(sweeps=[cut])) == ()


def test_pareto_front_and_best_balance():
    s = Sweep("concurrency", "s", (point(1, 100, 10), point(2, 180, 20), point(4, 170, 45), point(8, 320, 30)))
    assert [p.value for p in s.pareto()] == [1, 2, 8]  # 4 is beaten by 8 on both axes
    assert s.best_balance().value == 8  # 320/30 > 100/10 > 180/20


def test_a_sweep_point_without_the_latency_is_left_off_its_picture_not_drawn_at_0(tmp_path, monkeypatch):
    from pytest_llmperf import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    one_token = SequenceTrace(0, 0, 8, 1, 0.0, (Chunk(0.001, 1),))  # no TPOT: a single output token
    no_tpot = SweepPoint(2, summarize([RunTrace("fake", (one_token,), 0.0, 1.0)], "h", 1, label="s@2"))
    plots.sweep_curve(Sweep("concurrency", "s", (point(1, 100, 10), no_tpot, point(4, 300, 30))), tmp_path / "c.png")
    line = drawn[0].axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [100, 300] and list(line.get_ydata()) == pytest.approx([10, 30], rel=0.01)
    plots._pyplot().close(drawn[0])


SWEEP_TEST = """
import pytest
from pytest_llmperf import Workload

def chat(concurrency):
    return Workload.closed_loop(concurrency=int(concurrency), n=2 * int(concurrency), prompt_len=(16, 48),
                                output_len=(4, 8), seed=1)

@pytest.mark.min_capacity(concurrency=CAP, under={"p99_tpot_ms": 60_000})
@pytest.mark.max_p99_ms(ttft=0.001)  # judges plain runs only: sweep points are judged as a curve
def test_curve(hf_engine, llmperf):
    llmperf.run(hf_engine, chat(1), label="plain", warmup=False)
    sweep = llmperf.sweep(hf_engine, chat, concurrency=[1, 2, 4], under={"p99_tpot_ms": 60_000})
    assert sweep.values == [1, 2, 4] and len(sweep.points) == 3
"""


def test_min_capacity_passes_and_fails_on_a_real_sweep(pytester):
    pytester.makepyfile(test_c=SWEEP_TEST.replace("CAP", "4").replace("@pytest.mark.max_p99_ms(ttft=0.001)", ""))
    passed = pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-report=rep", "-p", "no:cacheprovider")
    passed.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "rep" / "results.json").read_text())
    (sweep,) = doc["tests"][0]["sweeps"]
    assert sweep["capacity"] == 4 and sweep["values"] == [1, 2, 4] and sweep["kind"] == "concurrency"
    plots = doc["tests"][0]["plots"]
    assert any(p.endswith("-sweep-curve.png") for p in plots) and any(p.endswith("-latency-cdf.png") for p in plots)
    assert all((pytester.path / "rep" / p).stat().st_size > 10_000 for p in plots)
    summary = (pytester.path / "rep" / "summary.md").read_text()
    assert "### Sweeps" in summary and "### Plots" in summary
    assert "| >= 4 |" in summary  # every load held: the capacity is at least the largest, not found
    # the curve limit has its margin line and its row in results.json, as a point limit has
    (margin,) = doc["tests"][0]["limits"]
    assert margin["metric"] == "capacity_concurrency" and margin["measured"] == 4 and margin["result"] == "sweep"
    passed.stdout.fnmatch_lines(["  limits of test_c.py::test_curve: capacity_concurrency 4 >= 4 (at the limit) [sweep]"])

    pytester.makepyfile(test_c=SWEEP_TEST.replace("CAP", "8"))
    failed = pytester.runpytest_inprocess("--llmperf-engine=hf", "-p", "no:cacheprovider")
    failed.assert_outcomes(failed=1)
    out = failed.stdout.str()
    assert "capacity_concurrency = 4 < limit 8" in out and "sweep 'sweep' over concurrency 1, 2, 4" in out
    assert "p99_ttft_ms" in out and "[plain]" in out  # the plain run is judged, the sweep points are not
    assert "[sweep@" not in out
    failed.stdout.fnmatch_lines(["  limits of test_c.py::test_curve: *capacity_concurrency 4 < 8 (short by 50%)*"])


def test_find_capacity_bisects_within_its_run_budget(hf_engine_factory, llmperf):
    from pytest_llmperf import Workload

    engine = hf_engine_factory(max_batch_size=4)
    sweep = llmperf.find_capacity(
        engine, lambda r: Workload.poisson(qps=r, n=6, prompt_len=(16, 32), output_len=(2, 4), seed=1),
        under={"p99_ttft_ms": 60_000}, lo=1, hi=64, max_runs=4)
    assert sweep.searched and len(sweep.points) == 2 and sweep.max_rate == 64  # hi already holds: stop
    tight = llmperf.find_capacity(
        engine, lambda r: Workload.poisson(qps=r, n=6, prompt_len=(16, 32), output_len=(2, 4), seed=1),
        under={"p99_ttft_ms": 0.001}, lo=1, hi=64, max_runs=4, label="tight")  # a label of its own: results named apart
    assert tight.max_rate is None and len(tight.points) == 1  # even lo breaks the limit


def test_a_point_over_capacity_or_behind_its_schedule_does_not_hold_and_only_saturation_leaves_the_test_valid():
    """Overload is what a capacity search looks for: a point the engine could not keep up with (saturated) is over
    capacity, not a measurement gone wrong, so it cuts the curve and compares through the capacity alone; a point
    whose client fell behind its schedule never offered its load: it holds nothing and the test is not valid."""
    from pytest_llmperf.gating import entries
    from pytest_llmperf.judging import _invalid
    from pytest_llmperf.validity import SATURATED

    saturated = point(4, 300, 10)
    saturated = SweepPoint(4, replace(saturated.result, invalid=f"{SATURATED}: median TTFT rose from 1 ms to 90 ms"))
    behind = point(2, 180, 10)
    behind = SweepPoint(2, replace(behind.result, invalid="the client fell behind its arrival schedule: ..."))
    over = Sweep("rate", "s", (point(1, 100, 10), point(2, 180, 10), saturated), {"p99_tpot_ms": 40})
    assert over.capacity() == 2  # TPOT 10 ms at rate 4 was under the bound: the queue, not the limit, says over
    assert [p.value for p in over.pareto()] == [2]
    perf = SimpleNamespace(sweeps=[over], results=[p.result for p in over.points], sweep_labels={"s@1", "s@2", "s@4"},
                           runs=[SimpleNamespace(result=p.result, engine=None, workload=None) for p in over.points])
    assert _invalid("t", perf) == ""
    assert [e.label for e in entries(SimpleNamespace(runs=[], sweeps=[over]))] == ["s:capacity"]

    # a sweep without under= has no capacity to judge its overload: a saturated point leaves it invalid
    plain = Sweep("rate", "s", (point(1, 100, 10), saturated))
    perf = SimpleNamespace(sweeps=[plain], results=[p.result for p in plain.points], sweep_labels={"s@1", "s@4"})
    assert "result 's@4': the engine saturated" in _invalid("t", perf) and not plain.capped
    late = Sweep("rate", "s", (point(1, 100, 10), behind), {"p99_tpot_ms": 40})
    assert late.capacity() == 1
    perf = SimpleNamespace(sweeps=[late], results=[p.result for p in late.points], sweep_labels={"s@1", "s@2"})
    assert "result 's@2': the client fell behind its arrival schedule" in _invalid("t", perf)


def test_sweep_limits_and_loads_are_refused_before_the_first_point():
    """A NaN bound held at every load; a bound given as text, a repeated load or a misspelled metric of
    find_capacity failed only after points had run."""
    from fake_engine import FakeWarmingEngine

    from pytest_llmperf import Workload
    from pytest_llmperf.runner import LLMPerf

    engine = FakeWarmingEngine([0.05])
    perf = LLMPerf()

    def rate(r):
        return Workload.poisson(r, 8, prompt_len=16, output_len=10, seed=1)

    for under, match in (({"p99_ttft_ms": float("nan")}, "finite number"), ({"p99_ttft_ms": "500"}, "finite number"),
                         ({"ttft_p99_ms": 500}, "not a latency metric"), ({}, "must name latency limits")):
        with pytest.raises(ValueError, match=match):
            perf.find_capacity(engine, rate, under=under, lo=1, hi=8)
    with pytest.raises(ValueError, match="finite number"):
        perf.sweep(engine, rate, rates=[1, 2], under={"p99_ttft_ms": float("inf")})
    for rates, match in (([1, 2, 2], "repeat a value"), ([1, float("nan")], "finite positive"), ([True, 2], "finite positive")):
        with pytest.raises(ValueError, match=match):
            perf.sweep(engine, rate, rates=rates)
    with pytest.raises(ValueError, match="whole numbers"):
        perf.sweep(engine, rate, concurrency=[1, 2.5])
    assert engine.passes == [] and perf.runs == []


def test_a_bisection_stops_where_its_points_could_no_longer_be_named_apart():
    """A tiny rel_tol bisected to rates whose labels were equal, and the second of them was refused mid-test as a
    label already recorded. FAKE engine (plugin mechanics, fake_engine.py): a full workload of 8 requests answers in
    1 s, a shorter one at once, so only the higher rate breaks the TTFT bound."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf import Workload
    from pytest_llmperf.runner import LLMPerf

    def rate(r):
        return Workload.poisson(r, len(WORKLOAD) if r > 1.000001 else 4, prompt_len=16, output_len=10, seed=1)

    perf = LLMPerf()
    sweep = perf.find_capacity(FakeWarmingEngine([1.0]), rate, under={"p99_ttft_ms": 100}, lo=1, hi=1.00001,
                               rel_tol=0, max_runs=8)
    assert [p.result.label for p in sweep.points] == ["capacity@1", "capacity@1.00001"] and sweep.max_rate == 1
    with pytest.raises(ValueError, match="too close to name apart"):
        perf.find_capacity(FakeWarmingEngine([1.0]), rate, under={"p99_ttft_ms": 100}, lo=1, hi=1.0000001, label="close")


def test_a_sweep_judged_by_the_markers_limits_is_a_capacity_curve(pytester):
    """`min_capacity(rate=..., under=...)` on a sweep given no `under=` ("default: the sweep's own under=", the other
    way round): the sweep had no limits of its own, so its saturated top point made the whole test PERF-INVALID
    instead of being over capacity, and its capacity was never compared with a baseline. FAKE engine (plugin
    mechanics): the fixture hands the marker's limits to a sweep of that kind that names none (what fails on the
    code before); the rest shows what a sweep with limits then gets, a saturated point over capacity."""
    pytester.makepyfile(test_c="""
import pytest
from fake_engine import FakeWarmingEngine
from pytest_llmperf import Workload

@pytest.mark.min_capacity(rate=1, under={"p99_ttft_ms": 1e6})
def test_curve(llmperf):
    rate = lambda r: Workload.poisson(r, 4, prompt_len=16, output_len=4, seed=1)  # noqa: E731
    sweep = llmperf.sweep(FakeWarmingEngine([0.01]), rate, rates=[1, 2], warmup=False)
    assert sweep.under == {"p99_ttft_ms": 1e6}
    own = llmperf.sweep(FakeWarmingEngine([0.01]), rate, rates=[1], warmup=False, label="own",
                        under={"p99_tpot_ms": 5e5})
    assert own.under == {"p99_tpot_ms": 5e5}  # a sweep's own limits stand
    conc = llmperf.sweep(FakeWarmingEngine([0.01]), lambda c: Workload.closed_loop(int(c), 4, 16, 4), concurrency=[1],
                         warmup=False, label="conc")
    assert conc.under == {}  # the marker judges rate sweeps only
""")
    pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=off").assert_outcomes(passed=1)

    from pytest_llmperf.judging import _invalid
    from pytest_llmperf.validity import SATURATED

    top = point(4, 300, 10)
    top = SweepPoint(4, replace(top.result, invalid=f"{SATURATED}: median TTFT rose from 1 ms to 90 ms"))
    curve = Sweep("rate", "s", (point(1, 100, 10), top), {"p99_ttft_ms": 1e6})
    perf = SimpleNamespace(sweeps=[curve], results=[p.result for p in curve.points], sweep_labels={"s@1", "s@4"})
    assert _invalid("t", perf) == ""


NOISY_CURVE = """
import pytest
from fake_engine import FakeWarmingEngine
from pytest_llmperf import Workload

# a FAKE engine (plugin mechanics): each point's pass of 8 requests answers in the time it is told, in order
@pytest.mark.min_capacity(concurrency=4, under={"p99_ttft_ms": 500})
def test_curve(llmperf):
    engine = FakeWarmingEngine(DURATIONS)
    llmperf.sweep(engine, lambda c: Workload.closed_loop(int(c), 8, 16, 10), concurrency=[1, 2, 4, 8], warmup=False)
"""


@pytest.mark.parametrize("durations, outcome, said", [
    # the point at 4 slow once: measured again, it holds, and the capacity reaches the limit
    ([0.01, 0.01, 1.0, 1.0, 0.01], "passed", "in its first pass and held it when the points that cut it were measured "
     "again (2 passes): noise, not a regression"),
    ([0.01, 0.01, 1.0, 1.0, 1.0, 1.0], "failed", "in all 3 measurements of the points that cut it (the value above is "
     "the first pass's)"),
])
def test_a_capacity_cut_short_by_one_noisy_point_is_measured_again_before_it_fails(pytester, durations, outcome, said):
    """One slow pass at a point under the limit lowered the capacity by a whole step and failed min_capacity at once:
    the points that cut the curve short (up to the limit, not past it) are measured again, as a violated latency
    limit is. FAKE engine (plugin mechanics, fake_engine.py)."""
    pytester.makepyfile(NOISY_CURVE.replace("DURATIONS", repr(durations)))
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rA", "--llmperf-baseline=off")
    result.assert_outcomes(**{outcome: 1})
    out = result.stdout.str()
    assert "sweep 'sweep': its capacity fell short of @pytest.mark.min_capacity(concurrency=4" in out and said in out, out


def _curve_gate(tmp_path, mode, durations):
    """The baseline gate on a concurrency curve of a FAKE engine (plugin mechanics): its points' passes of 8 requests
    answer in the times given, in order."""
    from fake_engine import FakeWarmingEngine

    from pytest_llmperf import Workload
    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf

    engine, perf = FakeWarmingEngine(durations), LLMPerf()
    perf.sweep(engine, lambda c: Workload.closed_loop(int(c), 8, 16, 10), concurrency=[1, 2, 4, 8], warmup=False,
               under={"p99_ttft_ms": 500})
    return gate("t", perf, GateConfig(mode, tmp_path, 0.10, "cpu", "m", 2), {}, {}), engine


def test_a_capacity_that_regressed_in_one_pass_is_judged_again_on_its_points_measured_again(tmp_path):
    """A capacity is derived from its points, and the gate's second look measured only results again: a capacity
    one noisy point had cut short failed at once, even when that point's own entry passed as noise."""
    _curve_gate(tmp_path, "update", [0.01, 0.01, 0.01, 1.0])  # capacity 4: the point at 8 breaks the limit
    verdict, engine = _curve_gate(tmp_path, "compare", [0.01, 0.01, 1.0, 1.0, 0.01])  # 4 slow once
    assert verdict.status == "pass", verdict
    assert engine.full_passes == 5  # 4 points, then the point at 4 once more: its entry and the capacity share it
    assert "'sweep:capacity' regressed in its first pass and was measured again" in verdict.message
    verdict, engine = _curve_gate(tmp_path, "compare", [0.01, 0.01, 1.0])  # 4 slow in every pass
    assert verdict.status == "regression" and engine.full_passes == 6
    row = next(r for r in verdict.regressions if r.metric == "capacity")
    assert (row.baseline, row.current) == (4, 2) and "in every one of 3 passes" in row.reason


def test_only_points_whose_passes_could_lift_a_capacity_are_measured_again():
    """Measuring a curve's points again cannot lift its capacity past a point that failed a request (never noise),
    nor bring back the loads a bisection steered away from: those are not measured again (each round used to start
    the engine afresh for them and count a pass that was never made)."""
    from pytest_llmperf.remeasure import _points_that_cut

    slow, fine = point(4, 300, 90), point(8, 320, 10)
    curve = Sweep("concurrency", "s", (point(1, 100, 10), point(2, 180, 10), slow, fine), {"p99_tpot_ms": 40})
    assert [p.value for p in _points_that_cut(curve, 8)] == [4]  # up to the first load of 8 or more
    assert _points_that_cut(curve, 2) == []  # the capacity already reaches 2
    failed = SweepPoint(2, replace(point(2, 180, 10).result, failed=1))
    assert _points_that_cut(replace(curve, points=(curve.points[0], failed, slow, fine)), 8) == []
    assert _points_that_cut(replace(curve, searched=True), 8) == []


def test_a_baseline_capacity_is_judged_on_its_recording_passes_as_the_comparison_is(tmp_path):
    """`update` measured each point again but stored the first pass's capacity, while the comparison lets a point hold
    where any of its passes held: a capacity cut short by noise at recording became the baseline, and a real fall to
    it passed. FAKE engine (plugin mechanics): the point at 4 is slow in its first pass only."""
    from pytest_llmperf import baseline

    verdict, _ = _curve_gate(tmp_path, "update", [0.01, 0.01, 1.0, 1.0, 0.01])
    assert verdict.status == "updated"
    stored = baseline.load(baseline.path_for(tmp_path, "t", "cpu", "m"))
    (capacity,) = [e for e in stored["entries"] if e["label"] == "sweep:capacity"]
    assert capacity["metrics"]["capacity"] == 8 and capacity["passes"] == 3  # the first pass alone gave 2


def test_two_sweeps_of_one_label_are_refused_before_the_second_runs():
    """Their points' names differ (a concurrency and a rate sweep), but both capacities were stored as
    'sweep:capacity' and one was never compared. FAKE engine (plugin mechanics)."""
    from fake_engine import FakeWarmingEngine

    from pytest_llmperf import Workload
    from pytest_llmperf.runner import LLMPerf

    engine, perf = FakeWarmingEngine([0.01]), LLMPerf()
    perf.sweep(engine, lambda c: Workload.closed_loop(int(c), 8, 16, 10), concurrency=[1], warmup=False)
    before = len(engine.passes)
    with pytest.raises(ValueError, match="already recorded a sweep labelled 'sweep'"):
        perf.sweep(engine, lambda r: Workload.poisson(r, 8, prompt_len=16, output_len=10, seed=1), rates=[3], warmup=False)
    with pytest.raises(ValueError, match="already recorded a sweep labelled 'sweep'"):
        perf.find_capacity(engine, lambda r: Workload.poisson(r, 8, prompt_len=16, output_len=10, seed=1),
                           under={"p99_ttft_ms": 100}, lo=1, hi=4, label="sweep")
    assert len(engine.passes) == before


def test_a_point_past_the_knee_saturated_on_one_side_only_is_compared_through_the_capacity(tmp_path):
    """A point over capacity has no entry when its engine saturated there and one when it was merely slow; which
    it is near the knee is noise, and the point named as missing (or as having no baseline) failed `require`
    although its curve's capacity and every other point compared unchanged. FAKE engine (plugin mechanics)."""
    from fake_engine import FakeScriptedEngine

    from pytest_llmperf import Workload, baseline
    from pytest_llmperf.gating import GateConfig, gate, unmet_requirement
    from pytest_llmperf.runner import LLMPerf

    def run(mode, top, root, script=None, gated=None):
        perf = LLMPerf()
        perf.sweep(FakeScriptedEngine(script or {2: ["ok"], 4: ["ok"], 8: ["ok"], 16: [top]}),
                   lambda q: Workload.poisson(qps=q, n=24, prompt_len=16, output_len=10, seed=int(q)),
                   rates=[2, 4, 8, 16], warmup=False, under={"p99_ttft_ms": 500})
        cfg = GateConfig(mode, root, 0.10, "cpu", "m", 2)
        return gate("t", perf, cfg, {"engine": "fake"}, {}, gated), cfg, perf

    for recorded, now in (("slow", "saturated"), ("saturated", "slow")):
        run("update", recorded, tmp_path / recorded)
        verdict, cfg, perf = run("require", now, tmp_path / recorded)
        assert perf.sweeps[0].capacity() == 8 and verdict.status == "pass", verdict
        assert verdict.labels["sweep:capacity"] == "compared" and "sweep@16" not in verdict.labels, verdict.labels
        assert unmet_requirement(verdict, cfg, "t") is None
    # below the knee it is a loss: a point the baseline's capacity covered that saturates now is named (under a gate
    # of timing alone, nothing else would fail it)
    from pytest_llmperf.baseline import gated_metrics

    run("update", "ok", tmp_path / "all")
    verdict, cfg, _ = run("require", "ok", tmp_path / "all", {2: ["saturated"], 4: ["ok"], 8: ["ok"], 16: ["ok"]},
                          gated_metrics(["timing"]))
    assert verdict.labels["sweep@2"] == "not-produced" and unmet_requirement(verdict, cfg, "t") is not None
    # and recording measures a point that saturated once again too: its capacity is not cut short there
    verdict, _, _ = run("update", "ok", tmp_path / "once", {2: ["ok"], 4: ["saturated", "ok"], 8: ["ok"], 16: ["ok"]})
    stored = baseline.load(baseline.path_for(tmp_path / "once", "t", "cpu", "m"))
    assert [e["metrics"]["capacity"] for e in stored["entries"] if e["label"] == "sweep:capacity"] == [16]
