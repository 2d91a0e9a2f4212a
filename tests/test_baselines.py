"""Baselines: comparison rules on hand-made entries, and the gate end to end on real transformers runs."""

import dataclasses
import json
import os

import pytest

from pytest_llmperf import baseline
from pytest_llmperf.baseline import BaselineError, Entry


def entry(per_repeat, deterministic=True, wl="w1"):
    keys = per_repeat[0].keys()
    median = {k: sorted(p[k] for p in per_repeat)[len(per_repeat) // 2] for k in keys}
    return Entry("0", wl, deterministic, median, per_repeat)


def stored(e):
    return baseline.document("t", "cpu", "m", {"engine_version": "1"}, [e])


def test_paging_metrics_compare_exactly_and_name_the_change():
    old = entry([{"kv_blocks_peak": 412, "output_tokens_per_s": 100.0}])
    new = entry([{"kv_blocks_peak": 436, "output_tokens_per_s": 100.0}])
    v = baseline.compare(stored(old), [new])
    assert v.status == "regression"
    assert v.regressions[0].reason == "paging changed: kv_blocks_peak 412 -> 436"
    close = baseline.compare(stored(entry([{"kv_fragmentation_mean": 0.0351512}])), [entry([{"kv_fragmentation_mean": 0.0351548}])])
    assert close.regressions[0].reason.startswith("paging changed: kv_fragmentation_mean 0.0351512 -> 0.0351548")
    # an explicit tolerance turns the exact rule off
    assert baseline.compare(stored(old), [new], tolerances={"kv_blocks_peak": 0.1}).status == "pass"
    # timed arrivals make paging timing-dependent: compared with the tolerance then
    timed = baseline.compare(stored(entry([{"kv_blocks_peak": 412}], False)), [entry([{"kv_blocks_peak": 436}], False)])
    assert timed.status == "pass"


def test_a_tests_gate_replaces_the_default_choice_of_what_fails():
    """`llmperf_gate("paging", "memory")`: timing is reported however far it moves (even where the command
    line names a tolerance for it), paging still compares exactly; naming a tail opts it in."""
    old = entry([{"kv_blocks_peak": 412, "output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0, "p99_ttft_ms": 80.0}])
    slow = entry([{"kv_blocks_peak": 412, "output_tokens_per_s": 50.0, "p50_ttft_ms": 100.0, "p99_ttft_ms": 80.0}])
    paging_and_memory = baseline.gated_metrics(["paging", "memory"])
    assert baseline.compare(stored(old), [slow]).status == "regression"  # the default gates throughput
    quiet = baseline.compare(stored(old), [slow], {"output_tokens_per_s": 0.05}, gated=paging_and_memory)
    assert quiet.status == "pass"
    assert {r.metric: r.verdict for r in quiet.rows}["output_tokens_per_s"] == "reported"
    moved = entry([{"kv_blocks_peak": 413, "output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0, "p99_ttft_ms": 80.0}])
    paged = baseline.compare(stored(old), [moved], gated=paging_and_memory)
    assert paged.status == "regression" and paged.regressions[0].reason == "paging changed: kv_blocks_peak 412 -> 413"
    tail = entry([{"kv_blocks_peak": 412, "output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0, "p99_ttft_ms": 120.0}])
    assert baseline.compare(stored(old), [tail]).status == "pass"  # p99 is reported by default
    opted = baseline.compare(stored(old), [tail], gated=baseline.gated_metrics(["ttft_p99", "paging"]))
    assert opted.status == "regression" and opted.regressions[0].metric == "p99_ttft_ms"
    with pytest.raises(ValueError, match="unknown metric or group 'speed'"):
        baseline.gated_metrics(["speed"])


def test_timing_tolerance_direction_and_improvements():
    old = entry([{"output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0}])
    assert baseline.compare(stored(old), [entry([{"output_tokens_per_s": 91.0, "p50_ttft_ms": 54.0}])]).status == "pass"
    slow = baseline.compare(stored(old), [entry([{"output_tokens_per_s": 85.0, "p50_ttft_ms": 50.0}])])
    assert slow.status == "regression" and slow.regressions[0].metric == "output_tokens_per_s"
    assert slow.regressions[0].reason == "down 15.0%, allowed 10.0%"
    better = baseline.compare(stored(old), [entry([{"output_tokens_per_s": 150.0, "p50_ttft_ms": 20.0}])])
    assert better.status == "pass" and {r.verdict for r in better.rows} == {"improvement"}


def test_a_throughput_allowed_to_fall_100_percent_or_more_reads_not_gated_not_ok():
    """A fall is at most 100%: a throughput whose allowance (its tolerance, or its baseline's pass spread on a
    loaded runner) reaches that cannot fail, and says so rather than "ok"; below it, it gates as before."""
    old = entry([{"output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0}])
    gone = entry([{"output_tokens_per_s": 1.0, "p50_ttft_ms": 50.0}])
    v = baseline.compare(stored(old), [gone], tolerances={"output_tokens_per_s": 1.5})
    row = {r.metric: r for r in v.rows}["output_tokens_per_s"]
    assert v.status == "pass" and row.verdict == "not-gated"
    assert row.reason == ("not gated: it could not fail: allowed 150% and a fall is at most 100% (its tolerance; "
                          "give this metric one below 1 (e.g. output_tokens_per_s=0.65) to gate it)")
    # the same allowance from the baseline's own passes (a loaded runner) asks for a quieter recording instead
    spread = Entry("0", "w1", True, {"output_tokens_per_s": 100.0}, [{"output_tokens_per_s": 100.0}], passes=4,
                   pass_metrics=[{"output_tokens_per_s": v} for v in (10.0, 20.0, 50.0, 100.0)])  # 10 left out
    (row,) = baseline.compare(stored(spread), [entry([{"output_tokens_per_s": 1.0}])]).rows
    assert row.verdict == "not-gated" and "its passes or engine starts spread that wide; record the baseline again" in row.reason
    assert baseline.compare(stored(old), [gone], tolerances={"output_tokens_per_s": 0.9}).status == "regression"
    # an allowance that wide from a calibration says to calibrate again, not to lower a tolerance
    calibrated = baseline.compare(stored(dataclasses.replace(old, calibration={"output_tokens_per_s": 1.2})), [gone])
    (row,) = [r for r in calibrated.rows if r.metric == "output_tokens_per_s"]
    assert calibrated.status == "pass" and row.verdict == "not-gated"
    assert row.reason.endswith("(its calibration: unchanged runs landed that far apart; calibrate again from runs on "
                               "quiet runners (python -m pytest_llmperf calibrate))")
    tripled = entry([{"output_tokens_per_s": 300.0, "p50_ttft_ms": 50.0}])
    rise = baseline.compare(stored(old), [tripled], tolerances={"output_tokens_per_s": 1.5})
    assert {r.metric: r.verdict for r in rise.rows}["output_tokens_per_s"] == "improvement"  # +200%, beyond 150%
    # latency has no such ceiling: a 150% allowance still fails a 3x rise
    slow = entry([{"output_tokens_per_s": 100.0, "p50_ttft_ms": 150.0}])
    assert baseline.compare(stored(old), [slow], tolerances={"p50_ttft_ms": 1.5}).status == "regression"
    from pytest_llmperf.report import TestRecord, baseline_counts

    rec = TestRecord("t", "passed", v.status, [{**r.__dict__, "change": r.change} for r in v.rows])
    assert "1 metric not gated (allowed a fall of 100% or more: could not fail)" in baseline_counts([rec])


def test_a_gated_metric_the_run_did_not_measure_fails_and_a_reported_one_is_left_out(tmp_path):
    """A check of nothing never passes: the baseline holds a value the run has none of (a sweep whose every load
    broke its limits has no capacity, NVML gave no memory peak, a paging number went missing)."""
    old = entry([{"capacity": 8.0, "gpu_memory_peak_gib": 10.0, "kv_blocks_peak": 40, "p99_itl_ms": 3.0,
                  "output_tokens_per_s": 100.0}])
    new = entry([{"capacity": None, "gpu_memory_peak_gib": None, "kv_blocks_peak": None, "p99_itl_ms": None,
                  "output_tokens_per_s": 100.0}])
    v = baseline.compare(stored(old), [new])
    assert v.status == "regression"
    failed = {r.metric: r for r in v.regressions}
    assert set(failed) == {"capacity", "gpu_memory_peak_gib", "kv_blocks_peak"}  # p99 ITL: reported, so left out
    assert failed["capacity"].reason == "no load held the latency limits this run (the baseline's capacity 8)"
    assert failed["gpu_memory_peak_gib"].reason.startswith("not measured this run (the baseline holds 10): a gated")
    assert failed["kv_blocks_peak"].current is None and failed["kv_blocks_peak"].change is None
    assert "  0       capacity             8         -        -       10.0%    no load held" in baseline.format_table(v)
    # a test's gate that names none of them, or a baseline that holds none, leaves them out too
    assert baseline.compare(stored(old), [new], gated=frozenset({"output_tokens_per_s"})).status == "pass"
    assert baseline.compare(stored(new), [new]).status == "pass"
    # the report and results.json write the missing value as none
    from pytest_llmperf import report

    rec = report.TestRecord("t", "failed", v.status, [{**dataclasses.asdict(r), "change": r.change} for r in v.rows])
    assert "3 metrics regressed or changed" in report.baseline_counts([rec])
    report.write(tmp_path, [rec], {})
    rows = json.loads((tmp_path / "results.json").read_text())["tests"][0]["baseline_rows"]
    assert {(r["metric"], r["current"], r["change"]) for r in rows if r["verdict"] == "regression"} == {
        ("capacity", None, None), ("gpu_memory_peak_gib", None, None), ("kv_blocks_peak", None, None)}
    assert "| `t` | 0 | capacity | 8.0 | - | - | 10.0% | no load held" in (tmp_path / "summary.md").read_text()


def test_tails_are_reported_not_gated_unless_a_tolerance_names_them():
    old = entry([{"p99_ttft_ms": 50.0, "p99_itl_ms": 5.0, "p50_ttft_ms": 20.0}])
    new = entry([{"p99_ttft_ms": 90.0, "p99_itl_ms": 9.0, "p50_ttft_ms": 20.0}])
    v = baseline.compare(stored(old), [new])
    assert v.status == "pass"
    assert {r.metric: r.verdict for r in v.rows} == {"p99_ttft_ms": "reported", "p99_itl_ms": "reported",
                                                      "p50_ttft_ms": "ok"}
    asked = baseline.compare(stored(old), [new], tolerances={"p99_ttft_ms": 0.2})
    assert asked.status == "regression" and [r.metric for r in asked.regressions] == ["p99_ttft_ms"]


def test_a_reasoning_models_time_to_its_answer_is_compared_reported_unless_a_tolerance_gates_it():
    """Longer reasoning moves the time to the answer (TTFO) and not TTFT: the comparison left TTFO out, so a
    reasoning model that now thinks twice as long before answering showed no row at all."""
    old = entry([{"p50_ttft_ms": 20.0, "p50_ttfo_ms": 400.0, "p99_ttfo_ms": 600.0}])
    new = entry([{"p50_ttft_ms": 20.0, "p50_ttfo_ms": 800.0, "p99_ttfo_ms": 1200.0}])
    v = baseline.compare(stored(old), [new])
    assert v.status == "pass"
    assert {r.metric: r.verdict for r in v.rows} == {"p50_ttft_ms": "ok", "p50_ttfo_ms": "reported",
                                                      "p99_ttfo_ms": "reported"}
    asked = baseline.compare(stored(old), [new], tolerances={"p50_ttfo_ms": 0.2})
    assert asked.status == "regression" and [r.metric for r in asked.regressions] == ["p50_ttfo_ms"]


def test_a_gated_percentile_of_too_few_samples_says_so_and_never_fails():
    few = {"ttft": 16, "tpot": 16, "itl": 900, "e2e": 16}
    old = Entry("0", "w1", True, {"p99_ttft_ms": 50.0, "p50_ttft_ms": 20.0}, [{}], samples=few)
    new = Entry("0", "w1", True, {"p99_ttft_ms": 99.0, "p50_ttft_ms": 40.0}, [{}], samples=few)
    v = baseline.compare(stored(old), [new], tolerances={"p99_ttft_ms": 0.1})
    rows = {r.metric: r for r in v.rows}
    assert rows["p99_ttft_ms"].verdict == "not-gated"
    assert rows["p99_ttft_ms"].reason == "not gated: 16 samples, a p99 needs about 368"
    assert rows["p50_ttft_ms"].verdict == "regression"  # 16 samples are plenty for a median
    assert "not gated: 16 samples" in baseline.format_table(v)
    # four requests cannot gate even a median (the shipped long-generation test)
    four = {"ttft": 4}
    v = baseline.compare(stored(Entry("0", "w1", True, {"p50_ttft_ms": 20.0}, [{}], samples=four)),
                         [Entry("0", "w1", True, {"p50_ttft_ms": 26.0}, [{}], samples=four)])
    assert v.status == "pass" and v.rows[0].reason == "not gated: 4 samples, a p50 needs about 6"
    assert Entry.from_dict(new.to_dict()).samples == few


def test_order_statistic_intervals_know_their_sample_size():
    from pytest_llmperf import quantiles

    assert [quantiles.needed(q) for q in (0.5, 0.9, 0.95, 0.99)] == [6, 36, 72, 368]
    values = list(range(1, 17))
    assert quantiles.interval(values, 0.99) == (15.0, None)  # no upper end: a p99 of 16 bounds nothing
    lo, hi = quantiles.interval(values, 0.5)
    assert lo < 8.5 < hi
    rng = __import__("numpy").random.default_rng(0)
    # the interval holds the true median in about 95% of samples (at least 95%: the ends are discrete)
    hits = sum(lo <= 1.0 <= hi for lo, hi in (quantiles.interval(rng.lognormal(0, 1, 40), 0.5) for _ in range(2000)))
    assert 0.94 <= hits / 2000 <= 0.995
    assert quantiles.relative_halfwidth(values, 0.99) is None


def test_the_tolerance_option_takes_a_default_and_fractions_per_metric():
    assert baseline.parse_tolerance("0.10") == (0.10, {})
    assert baseline.parse_tolerance(" 0.2, output_tokens_per_s=0.05,ttft_p99=0.3") == (
        0.2, {"output_tokens_per_s": 0.05, "p99_ttft_ms": 0.3})
    assert baseline.parse_tolerance("requests_per_s=0") == (baseline.DEFAULT_TOLERANCE, {"requests_per_s": 0.0})
    # a rate falls at most 100%: a tolerance of 1 or more lets it never fail (a warning at configure names them)
    assert baseline.unfailable(0.1, {}) == {}
    assert baseline.unfailable(1.5, {"output_tokens_per_s": 0.65}) == {"requests_per_s": 1.5, "capacity": 1.5}
    assert baseline.unfailable(0.1, {"kv_prefix_hit_rate": 1.0, "p99_ttft_ms": 3}) == {"kv_prefix_hit_rate": 1.0}
    for bad, says in [("ten", "give a fraction >= 0"), ("0.1,tokens=0.05", "unknown metric 'tokens'"),
                      ("p99_ttft_ms=-1", "give a fraction >= 0"), ("nan", "give a fraction >= 0")]:
        with pytest.raises(ValueError, match=says):
            baseline.parse_tolerance(bad)


def test_tolerance_is_never_tighter_than_the_noise_of_the_current_repeats():
    old = entry([{"p50_ttft_ms": 50.0}])
    noisy = entry([{"p50_ttft_ms": 40.0}, {"p50_ttft_ms": 58.0}, {"p50_ttft_ms": 60.0}])  # spread 20/58 = 34%
    v = baseline.compare(stored(old), [noisy])
    assert v.status == "pass" and v.rows[0].allowed == pytest.approx(20 / 58)


def test_one_noisy_repeat_cannot_fail_when_repeats_overlap():
    old = entry([{"p50_ttft_ms": v} for v in (50.0, 51.0, 49.0, 50.5, 70.0)])
    new = entry([{"p50_ttft_ms": v} for v in (50.2, 49.5, 50.8, 75.0, 49.9)])
    v = baseline.compare(stored(old), [new], default_tolerance=0.0)
    assert v.status == "pass"
    # a consistent shift, every repeat slower than every baseline repeat, is significant
    steady = entry([{"p50_ttft_ms": v} for v in (50.0, 51.0, 49.0, 50.5, 50.2)])
    shifted = entry([{"p50_ttft_ms": v} for v in (60.0, 61.0, 60.5, 62.0, 61.5)])
    assert baseline.compare(stored(steady), [shifted], default_tolerance=0.05).status == "regression"
    # but not when one baseline repeat was as slow: the shift is not significant across repeats
    assert baseline.compare(stored(old), [shifted], default_tolerance=0.05).status == "pass"


def test_changed_workload_is_stale_not_compared():
    v = baseline.compare(stored(entry([{"p99_ttft_ms": 1.0}])), [entry([{"p99_ttft_ms": 9.0}], wl="w2")])
    assert v.status == "stale" and "w1 -> w2" in v.message


def test_files_are_sorted_atomic_and_corrupt_ones_are_errors(tmp_path):
    path = baseline.path_for(tmp_path, "perf_tests/test_a.py::test_x[4]", "a100", "shape:llama-3.1-8b")
    assert path.relative_to(tmp_path).parts[:2] == ("a100", "shape_llama-3.1-8b")
    doc = stored(entry([{"p99_ttft_ms": 1.234567891, "kv_blocks_peak": 3}]))
    baseline.write(path, doc)
    text = path.read_text()
    assert json.loads(text)["entries"][0]["metrics"]["p99_ttft_ms"] == 1.23457
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind
    path.write_text('{"entries": [')
    with pytest.raises(BaselineError, match=str(path)):
        baseline.load(path)
    path.write_text('{"schema": 99, "entries": []}')
    with pytest.raises(BaselineError, match="not a pytest-llmperf schema-1 baseline"):
        baseline.load(path)
    # valid JSON of the right schema, a result missing a key: a KeyError inside the gate named no file
    path.write_text('{"schema": 1, "entries": [{"label": "0", "deterministic": false, "metrics": {}}]}')
    with pytest.raises(BaselineError, match=f"baseline {path} has a malformed result .entry 0: KeyError: 'workload_hash'"):
        baseline.load(path)
    path.write_text('{"schema": 1, "entries": [{"label": "0", "workload_hash": "w", "deterministic": false, '
                    '"metrics": {"output_tokens_per_s": "10"}}]}')
    with pytest.raises(BaselineError, match="entry 0: ValueError: output_tokens_per_s='10' is not a number"):
        baseline.load(path)


GATED = """
import pytest
from pytest_llmperf import Workload

@pytest.mark.llmperf_tolerance(p99_ttft_ms=5.0, p50_ttft_ms=5.0, p50_tpot_ms=5.0, p99_tpot_ms=5.0, p99_itl_ms=5.0,
                               p99_e2e_ms=5.0, output_tokens_per_s=0.9, requests_per_s=0.9)
@pytest.mark.llmperf_engine(max_batch_size=BATCH)
def test_gated(hf_engine, llmperf):
    llmperf.run(hf_engine, Workload.offline(12, prompt_len=(16, 64), output_len=(4, 24), seed=1))
"""


def test_the_gate_end_to_end(pytester):
    """Record, rerun unchanged (passes), degrade the engine (fails naming the metric), then a
    corrupt and a foreign-hardware baseline. Timing tolerances are wide: this CPU is shared, and the
    paging metrics (exact) are what must catch the changed batch size."""
    pytester.makepyfile(test_gate=GATED.replace("BATCH", "2"))
    args = ["--llmperf-engine=hf", "-p", "no:randomly"]
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    files = list((pytester.path / "baselines").rglob("*.json"))
    assert len(files) == 1 and files[0].parts[-3:-1] == ("cpu", "shape_tiny-llama")
    recorded = files[0].read_text()

    again = pytester.runpytest_inprocess(*args)
    again.assert_outcomes(passed=1)
    assert "pass" in again.stdout.str()

    # a bigger static batch pads more: the contiguous cache wastes more of what it reserves
    pytester.makepyfile(test_gate=GATED.replace("BATCH", "8"))
    degraded = pytester.runpytest_inprocess(*args)
    degraded.assert_outcomes(failed=1)
    out = degraded.stdout.str()
    assert "regression against the stored baseline" in out and "paging changed: kv_fragmentation" in out
    assert "changed since the baseline: engine_config.max_batch_size: 2 -> 8" in out
    assert files[0].read_text() == recorded  # compare never writes

    files[0].write_text(recorded[: len(recorded) // 2])
    corrupt = pytester.runpytest_inprocess(*args)
    corrupt.assert_outcomes(errors=1)  # at setup: before any engine starts and measures
    assert "is unreadable" in corrupt.stdout.str() and str(files[0]) in corrupt.stdout.str()
    assert "test_gate.py::test_gated  0 " not in corrupt.stdout.str()  # nothing was measured
    assert files[0].read_text() == recorded[: len(recorded) // 2]  # never silently replaced

    foreign = pytester.runpytest_inprocess(*args, "--llmperf-hardware=a100")
    foreign.assert_outcomes(passed=1)
    assert "no-baseline" in foreign.stdout.str()


PINNED = """
import pytest
from pytest_llmperf import Workload

W = Workload.offline(6, prompt_len=(16, 64), output_len=(4, 16), seed=1)

@pytest.mark.llmperf_model("shape:tiny-llama")
@pytest.mark.llmperf_gate("paging")  # timing of a few requests on a shared CPU is not what this test is about
def test_pinned(hf_engine, hf_engine_factory, llmperf):
    llmperf.run(hf_engine, W, label="fixture")
    other = hf_engine_factory(max_batch_size=2)
    llmperf.run(other, W, label="factory")
    assert {hf_engine.model.name, other.model.name} == {"shape:tiny-llama"}
"""


def test_a_test_pinned_to_a_model_of_its_own_keeps_its_baseline_in_the_sessions_folder_and_names_the_model(pytester):
    """`llmperf_model` gives every engine of the test (fixture and factory) that model, whatever
    --llmperf-model says; the baseline stays in the session model's folder (the suite is judged as one)
    and its environment names the pinned model, so a failure says it. The session's own model (a 1B shape
    here) is never loaded: no test asks for it (the test's body asserts what each engine loaded)."""
    pytester.makepyfile(test_pin=PINNED)
    args = ["--llmperf-engine=hf", "--llmperf-model=shape:llama-3.2-1b", "-p", "no:randomly"]
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    files = list((pytester.path / "baselines").rglob("*.json"))
    assert len(files) == 1 and files[0].parts[-3:-1] == ("cpu", "shape_llama-3.2-1b")
    doc = json.loads(files[0].read_text())
    assert doc["model"] == "shape:llama-3.2-1b"
    assert {e["model"] for e in doc["environment"]["engines"].values()} == {"shape:tiny-llama"}
    again = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    again.assert_outcomes(passed=1)
    assert "baselines: 1 test: 1 passed" in again.stdout.str()  # compared with the pinned model's baseline


GATE_MARKED = """
import pytest
from pytest_llmperf import Workload

MARK

@pytest.mark.llmperf_engine(max_batch_size=2)
def test_gated(hf_engine, llmperf):
    llmperf.run(hf_engine, Workload.offline(6, prompt_len=(16, 64), output_len=(4, 16), seed=1))
"""


def test_a_gate_marker_reports_what_it_does_not_name_end_to_end(pytester):
    """A baseline whose throughput was a thousand times today's and its latencies a thousandth (as if recorded on
    a far faster machine; a shared 2-core runner swings 5x between two sessions, so ten times was not always a
    failure): the default gate fails on it; under `llmperf_gate("paging")` it is reported and the test passes,
    and results.json records the gate so that `python -m pytest_llmperf compare` judges alike."""
    args = ["--llmperf-engine=hf", "-p", "no:randomly"]
    pytester.makepyfile(test_g=GATE_MARKED.replace("MARK", ""))
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    (path,) = (pytester.path / "baselines").rglob("*.json")
    doc = json.loads(path.read_text())

    def faster(values: dict) -> dict:
        # latencies too: on a loaded 2-core runner a run's own passes can land more than 100% apart on throughput,
        # an allowance no fall (at most 100%) can exceed, so throughput alone could not fail (seen in a fresh clone)
        return {k: v * 1000 if k == "output_tokens_per_s" else v / 1000 if k.endswith("_ms") and v else v
                for k, v in values.items()}

    for e in doc["entries"]:
        e["metrics"] = faster(e["metrics"])
        e["per_repeat"] = [faster(p) for p in e["per_repeat"]]
        e["pass_metrics"] = [faster(p) for p in e.get("pass_metrics", [])]
    path.write_text(json.dumps(doc))
    failing = pytester.runpytest_inprocess(*args, "--llmperf-retries=0")
    failing.assert_outcomes(failed=1)
    assert "regression against the stored baseline" in failing.stdout.str()
    pytester.makepyfile(test_g=GATE_MARKED.replace("MARK", 'pytestmark = pytest.mark.llmperf_gate("paging")'))
    passing = pytester.runpytest_inprocess(*args, "--llmperf-retries=0", f"--llmperf-report={pytester.path / 'r'}")
    passing.assert_outcomes(passed=1)
    (record,) = json.loads((pytester.path / "r" / "results.json").read_text())["tests"]
    assert "kv_timeline" in record["gated"] and "output_tokens_per_s" not in record["gated"]
    assert {r["metric"]: r["verdict"] for r in record["baseline_rows"]}["output_tokens_per_s"] == "reported"
    # a baseline that gates no timing keeps its first pass: the extra passes and fresh start serve timing
    recorded = pytester.runpytest_inprocess(*args, "--llmperf-baseline=update")
    recorded.assert_outcomes(passed=1)
    assert [e["passes"] for e in json.loads(path.read_text())["entries"]] == [1]
    assert "engines started: 1;" in recorded.stdout.str()


def _hammer(path, value, rounds):
    for i in range(rounds):
        baseline.write(path, stored(entry([{"p99_ttft_ms": float(value), "kv_blocks_peak": i}])))


def test_concurrent_writers_never_leave_a_partial_file(tmp_path):
    """Two xdist workers updating one baseline at once: each write is whole, the last one wins."""
    import multiprocessing

    path = tmp_path / "cpu" / "m" / "t.json"
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_hammer, args=(path, v, 200)) for v in (1, 2)]
    for w in writers:
        w.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        if path.exists():
            doc = baseline.load(path)  # raises on a torn or partial file
            seen.add(doc["entries"][0]["metrics"]["p99_ttft_ms"])
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert baseline.load(path)["entries"][0]["metrics"]["kv_blocks_peak"] == 199
    assert seen <= {1.0, 2.0} and [p.name for p in path.parent.iterdir()] == ["t.json"]


def test_percentiles_of_few_requests_get_their_statistical_uncertainty():
    import numpy as np

    from pytest_llmperf.stats import percentile_noise

    rng = np.random.default_rng(1)
    few, many = rng.lognormal(3, 0.3, 24), rng.lognormal(3, 0.3, 5000)
    assert percentile_noise(few, 50) > 2 * percentile_noise(many, 50)
    assert percentile_noise(few, 50) == percentile_noise(few, 50)  # deterministic
    old = Entry("0", "w1", True, {"p50_ttft_ms": 100.0}, [{"p50_ttft_ms": 100.0}], {"p50_ttft_ms": 0.1})
    near = Entry("0", "w1", True, {"p50_ttft_ms": 115.0}, [{"p50_ttft_ms": 115.0}], {"p50_ttft_ms": 0.1})
    far = Entry("0", "w1", True, {"p50_ttft_ms": 125.0}, [{"p50_ttft_ms": 125.0}], {"p50_ttft_ms": 0.1})
    assert baseline.compare(stored(old), [near]).status == "pass"  # 15% < 10% + 10% of uncertainty
    v = baseline.compare(stored(old), [far])
    assert v.status == "regression" and v.rows[0].allowed == pytest.approx(0.2)


def test_an_unwritable_baselines_folder_is_a_clear_error(tmp_path):
    # a file where the folder should be: unwritable even for root, which ignores permission bits
    root = tmp_path / "baselines"
    root.write_text("not a folder")
    with pytest.raises(BaselineError, match="cannot write baseline .* make the baselines folder writable"):
        baseline.write(baseline.path_for(root, "t", "cpu", "m"), stored(entry([{"p50_ttft_ms": 1.0}])))
    assert root.read_text() == "not a folder"


def test_best_of_takes_each_metrics_best_pass_and_the_largest_noise():
    a = Entry("0", "w1", True, {"output_tokens_per_s": 90.0, "p50_ttft_ms": 40.0, "error_rate": 0.0},
              [{"output_tokens_per_s": 90.0, "p50_ttft_ms": 40.0}], {"p50_ttft_ms": 0.05})
    b = Entry("0", "w1", True, {"output_tokens_per_s": 100.0, "p50_ttft_ms": 55.0, "error_rate": 0.0},
              [{"output_tokens_per_s": 100.0, "p50_ttft_ms": 55.0}], {"p50_ttft_ms": 0.08}, passes=2)
    best = baseline.best_of([a, b])
    assert best.metrics == {"output_tokens_per_s": 100.0, "p50_ttft_ms": 40.0, "error_rate": 0.0}
    assert best.per_repeat == [{"output_tokens_per_s": 100.0, "p50_ttft_ms": 40.0}]
    assert best.noise == {"p50_ttft_ms": 0.08} and best.passes == 3
    assert Entry.from_dict(best.to_dict()).passes == 3
    with pytest.raises(ValueError, match="same label and workload"):
        baseline.best_of([a, Entry("0", "w2", True, {}, [{}])])


def test_only_regressions_that_could_be_noise_are_worth_measuring_again():
    old = [Entry("a", "w", True, {"kv_blocks_peak": 10, "p50_ttft_ms": 50.0}, [{}]),
           Entry("b", "w", True, {"kv_blocks_peak": 10, "p50_ttft_ms": 50.0}, [{}])]
    new = [Entry("a", "w", True, {"kv_blocks_peak": 12, "p50_ttft_ms": 80.0}, [{}]),  # paging changed: fails anyway
           Entry("b", "w", True, {"kv_blocks_peak": 10, "p50_ttft_ms": 80.0}, [{}])]
    v = baseline.compare(baseline.document("t", "cpu", "m", {}, old), new)
    assert {r.label for r in v.regressions} == {"a", "b"}
    assert v.worth_measuring_again() == {"b"}
    # memory is no noise either: a best pass would hide memory that grew in one
    old = [Entry("m", "w", False, {"gpu_memory_peak_gib": 10.0, "p50_ttft_ms": 50.0}, [{}])]
    new = [Entry("m", "w", False, {"gpu_memory_peak_gib": 13.0, "p50_ttft_ms": 50.0}, [{}])]
    v = baseline.compare(baseline.document("t", "cpu", "m", {}, old), new)
    assert [r.metric for r in v.regressions] == ["gpu_memory_peak_gib"] and v.worth_measuring_again() == set()


# -- the gate's second look, on a FAKE engine (fake_engine.py) whose passes take the times it is told ----
def gated(tmp_path, mode, durations, retries=2):
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf

    engine, broken = FakeWarmingEngine(durations), []
    perf = LLMPerf(on_broken=broken.append)
    perf.run(engine, WORKLOAD, warmup=False)
    verdict = gate("t", perf, GateConfig(mode, tmp_path, 0.10, "cpu", "m", retries), {}, {})
    return verdict, engine, perf, broken


def stored_entry(tmp_path):
    return baseline.load(baseline.path_for(tmp_path, "t", "cpu", "m"))["entries"][0]


def test_a_baseline_is_the_best_of_three_passes(tmp_path):
    verdict, engine, perf, _ = gated(tmp_path, "update", [1.3, 1.0, 1.1])
    assert verdict.status == "updated" and engine.full_passes == 3
    entry = stored_entry(tmp_path)
    assert entry["passes"] == 3 and entry["metrics"]["output_tokens_per_s"] == 80.0  # 80 tokens in the 1.0 s pass
    assert len({p[1] for p in engine.passes}) == 3  # each pass its own salt: none finds another's prefix cache
    assert perf.times.seconds["re-measurement"] > 0
    # every pass's timing metrics are kept: how far the passes (the last in a fresh engine start) landed apart
    assert sorted(p["output_tokens_per_s"] for p in entry["pass_metrics"]) == pytest.approx([80 / 1.3, 80 / 1.1, 80.0])


def test_the_baselines_own_spread_across_engine_starts_widens_the_allowance():
    # the fresh start's pass (the last) 20% off the best; the worst before it, which never set the baseline's value,
    # is left out (next test)
    passes = [{"output_tokens_per_s": v} for v in (100.0, 70.0, 80.0)]
    old = Entry("0", "w1", True, {"output_tokens_per_s": 100.0}, [{}], passes=3, pass_metrics=passes)
    assert Entry.from_dict(old.to_dict()).pass_metrics == passes
    near = baseline.compare(stored(old), [Entry("0", "w1", True, {"output_tokens_per_s": 85.0}, [{}])])
    assert near.status == "pass" and near.rows[0].allowed == pytest.approx(20 / 100)
    far = baseline.compare(stored(old), [Entry("0", "w1", True, {"output_tokens_per_s": 75.0}, [{}])])
    assert far.status == "regression"
    merged = baseline.best_of([old, Entry("0", "w1", True, {"output_tokens_per_s": 70.0}, [{}])])
    assert [p["output_tokens_per_s"] for p in merged.pass_metrics] == [100.0, 70.0, 80.0, 70.0]


def test_one_stalled_recording_pass_does_not_widen_the_allowance_past_any_regression():
    """The baseline is the best of its passes, so its worst pass never set its value; one pass stalled 100x
    (p50 TTFT 1 s among passes of 10 ms) widened the allowance to 9,900%, and TTFT going 10 -> 1,000 ms read "ok"."""
    passes = [{"p50_ttft_ms": v} for v in (1000.0, 10.0, 12.0)]  # the first pass stalled; the last, a fresh start
    old = Entry("0", "w1", True, {"p50_ttft_ms": 10.0}, [{}], passes=3, pass_metrics=passes)
    slow = baseline.compare(stored(old), [Entry("0", "w1", True, {"p50_ttft_ms": 1000.0}, [{}])])
    assert slow.status == "regression" and slow.rows[0].allowed == pytest.approx(2 / 12)
    # the rest still widen it beyond the 10% tolerance: the fresh start's pass landed 2 ms off the best
    near = baseline.compare(stored(old), [Entry("0", "w1", True, {"p50_ttft_ms": 11.5}, [{}])])
    assert near.status == "pass" and near.rows[0].allowed == pytest.approx(2 / 12)


def test_a_regression_in_one_pass_only_is_measured_again_and_passes_as_noise(tmp_path):
    gated(tmp_path, "update", [1.0])
    verdict, engine, _, _ = gated(tmp_path, "compare", [1.5, 1.02, 9.0])  # a busy host slowed the first pass
    assert verdict.status == "pass" and engine.full_passes == 2  # the second pass cleared it: no third
    assert "'0' regressed in its first pass and was measured again: the best of 2 passes" in verdict.message


def test_a_regression_in_every_pass_fails_and_says_so(tmp_path):
    gated(tmp_path, "update", [1.0])
    verdict, engine, _, _ = gated(tmp_path, "compare", [1.3, 1.25, 1.3])
    assert verdict.status == "regression" and engine.full_passes == 3
    row = next(r for r in verdict.regressions if r.metric == "output_tokens_per_s")
    assert row.current == 64.0 and row.reason == "down 20.0%, allowed 10.0%, in every one of 3 passes"


def test_a_suspected_regression_is_measured_again_in_a_fresh_engine_start(tmp_path):
    """A baseline is compared across engine starts, and one start can sit off the next: the second
    look starts the engine again (the pool's `restart`), once per round for all of its results."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf

    gated(tmp_path, "update", [1.0])
    slow_start, restarts = FakeWarmingEngine([1.3, 1.3, 1.3]), []

    def restart(engine):
        restarts.append(engine)
        return FakeWarmingEngine([1.01])  # the next start is as fast as the baseline's

    perf = LLMPerf(restart=restart)
    perf.run(slow_start, WORKLOAD, warmup=False)
    verdict = gate("t", perf, GateConfig("compare", tmp_path, 0.10, "cpu", "m", 2), {}, {})
    assert verdict.status == "pass" and restarts == [slow_start] and slow_start.full_passes == 1
    assert perf.runs[0].engine is not slow_start
    assert "'0' regressed in its first pass and was measured again" in verdict.message


@pytest.mark.parametrize("warmup, session_mode, expected", [
    (False, "steady", (1, 0)),  # measured without one (its shared engine may have been warm): the quick one
    ("quick", "steady", (1, 0)),  # a quick warm-up, not the session's steady one (whole passes)
    (True, "steady", (1, 3)),  # the session's mode, as it was first warmed (three whole passes)
])
def test_an_engine_started_again_is_warmed_up_as_its_run_was(tmp_path, warmup, session_mode, expected):
    """The second look's fresh engine got the session's warm-up whatever its run had taken: a run measured
    cold was compared again after a steady warm-up, better warmed than its baseline. FAKE engines."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf

    gated(tmp_path, "update", [1.0])
    started = []

    def restart(engine):
        started.append(FakeWarmingEngine([1.01]))
        return started[-1]

    perf = LLMPerf(restart=restart, warmup_mode=session_mode)
    perf.run(FakeWarmingEngine([1.3]), WORKLOAD, warmup=warmup)
    gate("t", perf, GateConfig("compare", tmp_path, 0.10, "cpu", "m", 2), {}, {})
    quick = sum(n < len(WORKLOAD) for n, _, _ in started[0].passes)
    steady = sum(n == len(WORKLOAD) and salt >= 10_000 for n, salt, _ in started[0].passes)
    assert (quick, steady) == expected, started[0].passes


def test_retries_zero_judges_the_first_pass_alone(tmp_path):
    gated(tmp_path, "update", [1.0], retries=0)
    assert stored_entry(tmp_path)["passes"] == 1
    verdict, engine, _, _ = gated(tmp_path, "compare", [1.5, 1.0], retries=0)
    assert verdict.status == "regression" and engine.full_passes == 1


def test_an_engine_that_breaks_while_measured_again_loses_nothing(tmp_path):
    gated(tmp_path, "update", [1.0])
    written = stored_entry(tmp_path)
    verdict, _, _, broken = gated(tmp_path, "compare", [1.5, RuntimeError("engine died")])
    assert verdict.status == "regression" and broken  # judged on the pass it has; the pool restarts the engine
    assert "could not measure 0 again (RuntimeError: engine died); judged on the passes measured" in verdict.message
    with pytest.raises(BaselineError, match="could not measure again for the baseline .*engine died.*nothing written"):
        gated(tmp_path, "update", [0.5, RuntimeError("engine died")])
    assert stored_entry(tmp_path) == written


GATED_FAKE = """
from fake_engine import WORKLOAD, FakeWarmingEngine

def test_fake(llmperf):  # a FAKE engine (plugin mechanics): each pass takes the time it is told
    llmperf.run(FakeWarmingEngine(DURATIONS), WORKLOAD, warmup=False)
"""


def test_the_gate_says_what_measuring_again_found(pytester):
    pytester.makepyfile(test_g=GATED_FAKE.replace("DURATIONS", "[1.0]"))
    pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=update").assert_outcomes(passed=1)
    assert '"passes": 3' in next((pytester.path / "baselines").rglob("*.json")).read_text()

    pytester.makepyfile(test_g=GATED_FAKE.replace("DURATIONS", "[1.5, 1.0]"))
    noise = pytester.runpytest_inprocess("-p", "no:randomly", "-rA")
    noise.assert_outcomes(passed=1)
    noise.stdout.fnmatch_lines(["*llmperf baseline*", "*'0' regressed in its first pass and was measured again: "
                                "the best of 2 passes is within tolerance (noise, not a regression)*"])

    pytester.makepyfile(test_g=GATED_FAKE.replace("DURATIONS", "[1.5]"))
    slower = pytester.runpytest_inprocess("-p", "no:randomly")
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*output_tokens_per_s*down 33.3%, allowed 10.0%, in every one of 3 passes*",
                                 "*current: per metric, the best value any pass reached (the summary table and "
                                 "results.json show the first pass)*"])


def test_a_tolerance_per_metric_for_the_whole_session_and_the_marker_over_it(pytester):
    pytester.makepyfile(test_g=GATED_FAKE.replace("DURATIONS", "[1.0]"))
    pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=update").assert_outcomes(passed=1)
    pytester.makepyfile(test_g=GATED_FAKE.replace("DURATIONS", "[1.08]"))  # 7.4% slower in every pass
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=1)  # within the default 10%
    tight = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-tolerance=0.10,output_tokens_per_s=0.05")
    tight.assert_outcomes(failed=1)
    tight.stdout.fnmatch_lines(["*output_tokens_per_s*down 7.4%, allowed 5.0%, in every one of 3 passes*"])
    marked = GATED_FAKE.replace("DURATIONS", "[1.08]").replace(
        "def test_fake", "import pytest\n@pytest.mark.llmperf_tolerance(output_tokens_per_s=0.2, requests_per_s=0.2)\n"
        "def test_fake")
    pytester.makepyfile(test_g=marked)
    pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-tolerance=output_tokens_per_s=0.05",
                                 "--llmperf-report=rep").assert_outcomes(passed=1)
    (record,) = json.loads((pytester.path / "rep" / "results.json").read_text())["tests"]
    assert record["tolerances"] == {"output_tokens_per_s": 0.2, "requests_per_s": 0.2}  # for compare and calibrate
    bad = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-tolerance=0.1,tokens=0.05")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--llmperf-tolerance/llmperf_tolerance: tolerance 'tokens=0.05': unknown metric*"])


# -- every label judged on its own; paging exact in both directions, and only where it is deterministic --
def test_a_stale_label_never_hides_another_labels_regression():
    old = [Entry("a", "w", True, {"output_tokens_per_s": 100.0}, [{}]),
           Entry("b", "w", True, {"output_tokens_per_s": 100.0}, [{}])]
    new = [Entry("a", "w", True, {"output_tokens_per_s": 10.0}, [{}]),  # 90% slower
           Entry("b", "w-changed", True, {"output_tokens_per_s": 100.0}, [{}])]
    v = baseline.compare(baseline.document("t", "cpu", "m", {}, old), new)
    assert v.status == "regression" and [r.label for r in v.regressions] == ["a"]
    assert v.labels == {"a": "compared", "b": "stale"} and v.uncompared == {"b": "stale"}
    assert "stale baseline: workload of 'b' changed (w -> w-changed)" in v.message
    only_stale = baseline.compare(baseline.document("t", "cpu", "m", {}, old), new[1:])
    assert only_stale.status == "stale" and not only_stale.rows
    # a result the baseline holds and the run did not produce is named, never passed over unseen
    dropped = baseline.compare(baseline.document("t", "cpu", "m", {}, old), old[:1])
    assert dropped.status == "pass" and dropped.uncompared == {"b": baseline.NOT_PRODUCED}
    assert dropped.message.startswith("the baseline holds result 'b', which this run did not produce")


def test_deterministic_paging_that_moves_the_better_way_fails_too_and_is_named_an_improvement():
    old = Entry("0", "w", True, {"kv_blocks_peak": 47, "kv_preemptions": 33}, [{}])
    new = Entry("0", "w", True, {"kv_blocks_peak": 39, "kv_preemptions": 32}, [{}])
    v = baseline.compare(stored(old), [new], default_tolerance=5.0)  # a loose timing tolerance changes nothing
    assert v.status == "regression" and {r.verdict for r in v.regressions} == {"changed"}
    row = next(r for r in v.regressions if r.metric == "kv_blocks_peak")
    assert row.reason.startswith("paging changed: kv_blocks_peak 47 -> 39 (lower is better: an improvement")
    assert {r.metric for r in v.improvements} == {"kv_blocks_peak", "kv_preemptions"}


def test_paging_under_timed_arrivals_is_reported_not_gated_unless_a_tolerance_asks():
    old = Entry("0", "w", False, {"kv_fragmentation_max": 0.2344, "kv_usage_peak": 0.007222}, [{}])
    new = Entry("0", "w", False, {"kv_fragmentation_max": 0.2708, "kv_usage_peak": 0.007236}, [{}])
    v = baseline.compare(stored(old), [new])
    assert v.status == "pass" and {r.verdict for r in v.rows} == {"reported"}
    assert "kv_fragmentation_max" not in baseline.format_table(v)
    asked = baseline.compare(stored(old), [new], tolerances={"kv_fragmentation_max": 0.10})
    assert asked.status == "regression" and asked.regressions[0].reason == "up 15.5%, allowed 10.0%"


def test_a_baseline_of_another_engine_is_not_comparable():
    old = Entry("0", "w", True, {"kv_blocks_peak": 19}, [{}], engine="vllm")
    v = baseline.compare(stored(old), [Entry("0", "w", True, {"kv_blocks_peak": 600}, [{}], engine="hf")])
    assert v.status == "other-engine" and not v.rows
    assert "'0': the baseline was recorded with engine vllm, this run used hf: no comparable baseline" in v.message
    assert Entry.from_dict(old.to_dict()).engine == "vllm"


REQUIRED = """
import pytest
from fake_engine import WORKLOAD, FakeWarmingEngine
from pytest_llmperf import Workload

def test_two(llmperf):  # a FAKE engine (plugin mechanics): each pass takes the time it is told
    engine = FakeWarmingEngine(DURATIONS)
    llmperf.run(engine, WORKLOAD, warmup=False, label="a")
    llmperf.run(engine, Workload.offline(8, prompt_len=16, output_len=SECOND, seed=1), warmup=False, label="b")
"""


def test_require_mode_fails_what_was_not_compared_with_the_command_that_records_it(pytester):
    """The pull-request gate's strict mode, on a FAKE engine: a missing, stale, foreign-hardware or
    corrupt baseline fails in one line; compare mode passes the same, and the summary counts them."""
    pytester.makepyfile(test_r=REQUIRED.replace("DURATIONS", "[1.0]").replace("SECOND", "10"))
    args = ["-p", "no:randomly", "--llmperf-retries=0"]
    missing = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*llmperf: --llmperf-baseline=require: no baseline for cpu/shape:tiny-llama at "
                                  "*baselines/cpu/shape_tiny-llama/test_r.py_test_two.json; record it with: "
                                  "pytest 'test_r.py::test_two' --llmperf-baseline=update*",
                                  "*baselines: 1 test: 1 had no baseline*"])
    lenient = pytester.runpytest_inprocess(*args)
    lenient.assert_outcomes(passed=1)
    lenient.stdout.fnmatch_lines(["*baselines: 1 test: 1 had no baseline; 0 metrics regressed or changed, 0 improved*"])
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=require").assert_outcomes(passed=1)

    # the test stopped recording label b: require fails it with the command that records what it measures now
    pytester.makepyfile(test_r=REQUIRED.replace("DURATIONS", "[1.0]").split("    llmperf.run(engine, Workload.offline")[0])
    dropped = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    dropped.assert_outcomes(failed=1)
    dropped.stdout.fnmatch_lines(["*--llmperf-baseline=require: the baseline holds result 'b', which this run did not "
                                  "produce (or its engine died during it); record it with: pytest 'test_r.py::test_two'"
                                  " --llmperf-baseline=update*"])
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)  # compare mode: named, a judged

    # label b's workload changed, label a is 50% slower: the regression of a is judged and shown
    pytester.makepyfile(test_r=REQUIRED.replace("DURATIONS", "[1.5]").replace("SECOND", "11"))
    both = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    both.assert_outcomes(failed=1)
    both.stdout.fnmatch_lines(["*a *output_tokens_per_s*down 33.3%*", "*stale baseline: workload of 'b' changed*"])
    pytester.makepyfile(test_r=REQUIRED.replace("DURATIONS", "[1.0]").replace("SECOND", "11"))
    stale = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    stale.assert_outcomes(failed=1)
    stale.stdout.fnmatch_lines(["*--llmperf-baseline=require: stale baseline: workload of 'b' changed * record it "
                                "with: pytest 'test_r.py::test_two' --llmperf-baseline=update*",
                                "*1 compared in part*"])
    assert "rerun with" not in stale.stdout.str()  # the command, not the general hint as well
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)  # compare mode: b reported, a judged

    foreign = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require", "--llmperf-hardware=a100")
    foreign.assert_outcomes(failed=1)
    foreign.stdout.fnmatch_lines(["*no baseline for a100/shape:tiny-llama at *; recorded for other hardware only: cpu;"
                                  " record it with: pytest 'test_r.py::test_two' --llmperf-hardware=a100 "
                                  "--llmperf-baseline=update*"])
    path = next((pytester.path / "baselines").rglob("*.json"))
    path.write_text("{")
    corrupt = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    corrupt.assert_outcomes(errors=1)  # at setup, before the engine runs
    corrupt.stdout.fnmatch_lines([f"*baseline {path} is unreadable*"])
    # the summary counts it with the baselines, not as if that test did not exist
    corrupt.stdout.fnmatch_lines(["baselines: 1 test: 1 had an unreadable baseline (an error before the test ran)*"])


TWO_ENGINES = """
from pytest_llmperf import Workload

def test_two_engines(hf_engine_factory, llmperf):
    w = Workload.offline(6, prompt_len=(8, 32), output_len=(2, 8), seed=3)
    llmperf.run(hf_engine_factory(max_batch_size=2), w, label="first")
    llmperf.run(hf_engine_factory(max_batch_size=3), w, label="second")  # the pool closes the first engine
"""


def test_update_records_a_test_that_used_two_engines(pytester):
    """Real transformers: the recording's last pass runs in a fresh start of each engine, once per engine
    (the closed one included), never once per result."""
    pytester.makepyfile(test_t=TWO_ENGINES)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=update", "--llmperf-retries=1")
    result.assert_outcomes(passed=1)
    doc = json.loads(next((pytester.path / "baselines").rglob("*.json")).read_text())
    assert [(e["label"], e["passes"], e["engine"]) for e in doc["entries"]] == [("first", 2, "hf"), ("second", 2, "hf")]
    assert all(e["deterministic"] for e in doc["entries"])
    # the environment of each engine the test used, not only the last one's
    engines = doc["environment"]["engines"]
    assert {label: e["engine_config"]["max_batch_size"] for label, e in engines.items()} == {"first": 2, "second": 3}
    assert doc["environment"]["hardware"] == "cpu" and "engine_config" not in doc["environment"]
    # first, second, then each started afresh for its second pass
    result.stdout.fnmatch_lines(["*engines started: 4;*"])
    # both results compared; the timing of six tiny requests is not what this judges (it moved by more
    # than 10% when other tests shared the two cores)
    loose = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=require", "--llmperf-tolerance=100")
    loose.assert_outcomes(passed=1)
    loose.stdout.fnmatch_lines(["*PytestConfigWarning: llmperf: --llmperf-tolerance/llmperf_tolerance gives "
                                "output_tokens_per_s 100, requests_per_s 100, capacity 100: a rate falls at most 100%*"])


def test_a_run_whose_engine_died_is_kept_partial_and_never_becomes_a_baseline(tmp_path):
    """A FAKE engine (plugin mechanics) dies in its second pass the way the vLLM adapter reports it: an
    EngineError carrying what the pass measured. The result is kept, partial, with its failed requests
    counted; in a test that caught the error it is never written as a baseline, nor compared."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.engines.base import EngineError
    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf
    from pytest_llmperf.trace import RunTrace, SequenceTrace

    dead = RunTrace("fake", tuple(SequenceTrace(i, 0, r.prompt_len, r.output_len, 0.0, (), "EngineDeadError")
                                  for i, r in enumerate(WORKLOAD.requests)), 0.0, 1.0)
    engine, broken = FakeWarmingEngine([1.0, EngineError("the engine core died during this run", trace=dead)]), []
    perf = LLMPerf(on_broken=broken.append)
    perf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False)  # result '0', whole
    with pytest.raises(EngineError, match="died during this run"):
        perf.run(engine, WORKLOAD, repeats=2, warmup=False)  # result '1', its second pass died
    kept = perf.results[-1]
    assert kept.partial and kept.failed == len(WORKLOAD) and broken == [engine]
    with pytest.raises(BaselineError, match=r"result '1' is partial \(its engine died during the run\); nothing written"):
        gate("t", perf, GateConfig("update", tmp_path, 0.10, "cpu", "m", 2), {}, {})
    assert not list(tmp_path.rglob("*.json"))
    verdict = gate("t", perf, GateConfig("compare", tmp_path, 0.10, "cpu", "m", 2), {}, {})
    assert verdict.labels == {"0": baseline.NO_BASELINE}  # '1' is not even looked up


def test_the_environment_comes_from_every_run_and_a_change_is_named_down_to_the_setting():
    """FAKE engines (plugin mechanics): one engine configuration gives the flat environment of every
    baseline file; two give one per result, and the failure text names the setting that changed."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.cpu import cpu_name
    from pytest_llmperf.gating import environment, failure_text
    from pytest_llmperf.runner import LLMPerf

    class Configured(FakeWarmingEngine):  # a FAKE engine with options
        def __init__(self, **config):
            super().__init__([0.01])
            self._config = config

        @property
        def config(self):
            return self._config

    one = LLMPerf()
    one.run(Configured(max_num_seqs=8), WORKLOAD, warmup=False, label="a")
    one.run(Configured(max_num_seqs=8), WORKLOAD, warmup=False, label="b")
    # without a GPU the environment names the CPU (timing is gated only against a baseline of the same one)
    assert environment(one, "cpu", None) == {"engine": "fake", "engine_version": "0", "cpu": cpu_name(),
                                             "engine_config": {"max_num_seqs": 8}, "hardware": "cpu"}
    two = LLMPerf()
    two.run(Configured(max_num_seqs=8), WORKLOAD, warmup=False, label="a")
    two.run(Configured(max_num_seqs=16), WORKLOAD, warmup=False, label="b")
    env = environment(two, "cpu", None)
    assert env["engines"]["b"]["engine_config"] == {"max_num_seqs": 16} and "engine" not in env
    old = {**env, "engines": {**env["engines"], "b": {**env["engines"]["b"], "engine_config": {"max_num_seqs": 32}}}}
    text = failure_text(baseline.Verdict("regression", environment=old), env)
    assert "changed since the baseline: engines.b.engine_config.max_num_seqs: 32 -> 16" in text
    assert "engines.a" not in text


def test_the_failure_header_counts_metrics_and_timelines_as_the_summary_does():
    """`(1 metric, 1 paging timeline)`, as the session's summary line counts them, not one total of both."""
    from pytest_llmperf.gating import failure_text

    blocks = baseline.Row("b32", "kv_blocks_peak", 547, 280, 0.0, "changed", exact=True, reason="paging changed")
    steps = baseline.Row("b32", baseline.TIMELINE, 293, 636, 0.0, "regression", exact=True, reason="diverged at step 2")
    heads = [failure_text(baseline.Verdict("regression", rows=rows), {}).splitlines()[0]
             for rows in ((blocks, steps), (blocks,), (steps,))]
    assert heads == [f"llmperf: regression against the stored baseline ({n})"
                     for n in ("1 metric, 1 paging timeline", "1 metric", "1 paging timeline")]


def test_a_test_failing_before_its_comparison_still_says_what_changed_since_its_baseline(tmp_path):
    """An invalid result or a broken limit never reaches the comparison; the settings changed since the
    stored baseline (often the reason) are still named, where the session compares at all."""
    from pytest_llmperf.gating import GateConfig, changes_before_comparing

    test_id, now = "perf_tests/test_x.py::test_a", {"engine_config": {"max_num_seqs": 8}}
    cfg = GateConfig("compare", tmp_path, 0.1, "cpu", "shape:tiny-llama")
    assert changes_before_comparing(cfg, test_id, now) == []  # no baseline yet
    baseline.write(baseline.path_for(tmp_path, test_id, "cpu", "shape:tiny-llama"),
                   baseline.document(test_id, "cpu", "shape:tiny-llama", {"engine_config": {"max_num_seqs": 128}}, []))
    said = ["  changed since the baseline: engine_config.max_num_seqs: 128 -> 8"]
    assert changes_before_comparing(cfg, test_id, now) == said
    assert changes_before_comparing(dataclasses.replace(cfg, mode="require"), test_id, now) == said
    for mode in ("update", "off"):
        assert changes_before_comparing(dataclasses.replace(cfg, mode=mode), test_id, now) == []


def test_the_selection_says_how_many_of_its_tests_have_a_baseline_before_any_engine_starts(pytester):
    """The header counts the baseline folder; after collection one line says how many of the selected tests
    that measure will be compared (collected only here: no engine starts)."""
    pytester.makepyfile(test_sel="""
        def test_a(llmperf):
            pass

        def test_b(llmperf):
            pass

        def test_plain():
            pass

        from hypothesis import given, strategies as st

        @given(st.integers())
        def test_property(llmperf, n):  # judged example by example, never against a baseline: not counted
            pass
    """)
    folder = pytester.path / "baselines"
    baseline.write(baseline.path_for(folder, "test_sel.py::test_a", "cpu", "shape:tiny-llama"),
                   baseline.document("test_sel.py::test_a", "cpu", "shape:tiny-llama", {}, []))
    opts = ("--co", "--llmperf-hardware=cpu", "--llmperf-model=shape:tiny-llama")
    compare = pytester.runpytest_inprocess(*opts)
    compare.stdout.fnmatch_lines(["llmperf: 1 of the 2 selected tests that measure have a stored baseline; the others "
                                  "have nothing to be compared with (their limits still apply)"])
    require = pytester.runpytest_inprocess(*opts, "--llmperf-baseline=require", "-k", "test_a or test_plain")
    require.stdout.fnmatch_lines(["llmperf: 1 of the 1 selected tests that measure have a stored baseline"])
    assert "the others" not in require.stdout.str()
    for quiet in (pytester.runpytest_inprocess(*opts, "--llmperf-baseline=update"),
                  pytester.runpytest_inprocess(*opts, "-k", "test_plain")):
        assert "selected tests that measure" not in quiet.stdout.str()


def test_timing_measured_on_another_cpu_is_reported_and_paging_still_gates():
    """A CPU run names its CPU; against a baseline of another CPU (or one that names none) timing and capacity
    are reported, not gated, whatever a test's gate or tolerances say, and paging still compares exactly. A GPU
    run (no `cpu` in its environment: its hardware class names the card) is left as it was."""
    here = {"hardware": "cpu", "cpu": "AMD EPYC (AVX2)"}
    assert baseline.other_cpu(here, here) == ""
    assert baseline.other_cpu({"hardware": "h200"}, {"hardware": "h200", "gpu_name": "H200"}) == ""
    why = baseline.other_cpu({"cpu": "Intel Xeon (AMX)"}, here)
    assert "measured on Intel Xeon (AMX), this run on AMD EPYC (AVX2)" in why and "--llmperf-baseline=update" in why
    assert "a CPU it does not name" in baseline.other_cpu({"hardware": "cpu"}, here)
    old = entry([{"kv_blocks_peak": 412, "output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0}])
    slow = entry([{"kv_blocks_peak": 412, "output_tokens_per_s": 10.0, "p50_ttft_ms": 500.0}])
    untimed = baseline.untimed(None, {"p99_ttft_ms": 0.1})
    assert "capacity" not in untimed and not untimed & baseline.TIMING and baseline.TIMELINE in untimed
    assert untimed >= baseline.PAGING and "gpu_memory_peak_gib" in untimed
    passed = baseline.compare(stored(old), [slow], {"p99_ttft_ms": 0.1}, gated=untimed)
    assert passed.status == "pass" and {r.metric: r.verdict for r in passed.rows}["output_tokens_per_s"] == "reported"
    moved = entry([{"kv_blocks_peak": 413, "output_tokens_per_s": 10.0, "p50_ttft_ms": 500.0}])
    paged = baseline.compare(stored(old), [moved], gated=untimed)
    assert paged.status == "regression" and [r.metric for r in paged.regressions] == ["kv_blocks_peak"]
    # a test's own gate loses its timing metrics only
    assert baseline.untimed(baseline.gated_metrics(["timing", "paging"]), {}) == baseline.GATE_GROUPS["paging"]


def test_a_baseline_of_another_cpu_gates_no_timing_end_to_end(pytester):
    """The same planted baseline as above (a thousand times today's throughput), recorded on a CPU this machine
    is not: the test passes, its timing rows reported, the note says which CPUs and what to do; results.json
    names this machine's CPU."""
    args = ["--llmperf-engine=hf", "-p", "no:randomly", "--llmperf-retries=0"]
    pytester.makepyfile(test_g=GATE_MARKED.replace("MARK", ""))
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    (path,) = (pytester.path / "baselines").rglob("*.json")
    doc = json.loads(path.read_text())
    mine = doc["environment"]["cpu"]
    assert mine
    for e in doc["entries"]:
        for values in (e["metrics"], *e["per_repeat"], *e.get("pass_metrics", [])):
            values.update({k: v * 1000 if k == "output_tokens_per_s" else v / 1000 if k.endswith("_ms") and v else v
                           for k, v in values.items()})
    doc["environment"]["cpu"] = "Some Other CPU (AMX)"
    path.write_text(json.dumps(doc))
    result = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require", f"--llmperf-report={pytester.path / 'r'}",
                                          "-rA")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert f"the baseline was measured on Some Other CPU (AMX), this run on {mine}" in out
    assert "1 with timing reported, not gated (a baseline of another CPU, or one naming none)" in out
    (record,) = json.loads((pytester.path / "r" / "results.json").read_text())["tests"]
    assert record["environment"]["cpu"] == mine
    verdicts = {r["metric"]: r["verdict"] for r in record["baseline_rows"]}
    assert verdicts["output_tokens_per_s"] == "reported" and verdicts["p50_ttft_ms"] == "reported"
    # a result `require` cannot compare (its workload changed): the failure names that, not the other CPU
    doc["entries"][0]["workload_hash"] = "0" * 16
    path.write_text(json.dumps(doc))
    result = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*llmperf: --llmperf-baseline=require: stale baseline: workload of * changed "
                                 "(0000000000000000 -> *; record it with: *"])


SHARED_NAME = """
import pytest
from fake_engine import WORKLOAD, FakeWarmingEngine

# a FAKE engine (plugin mechanics): ids alike but for characters a file name cannot hold, and two ids alike in
# their first 200 characters
@pytest.mark.parametrize("speed", [1.0, 2.0], ids=["a b", "a/b"])
def test_fake(llmperf, speed):
    llmperf.run(FakeWarmingEngine([speed]), WORKLOAD, warmup=False)

@pytest.mark.parametrize("speed", [1.0, 2.0], ids=["x" * 200 + "-one", "x" * 200 + "-two"])
def test_long(llmperf, speed):
    llmperf.run(FakeWarmingEngine([speed]), WORKLOAD, warmup=False)
"""


def test_two_test_ids_never_share_a_baseline_file_in_silence(pytester):
    """Two ids that map to one file name: the second is refused where it would write over the first's
    baseline, and compared never with the first's numbers; long ids get a file each."""
    pytester.makepyfile(test_s=SHARED_NAME)
    update = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=update", "--llmperf-retries=0")
    update.assert_outcomes(passed=3, failed=1)
    out = update.stdout.str()
    assert "was written for 'test_s.py::test_fake[a b]', not 'test_s.py::test_fake[a/b]'" in out, out
    files = sorted(p.name for p in (pytester.path / "baselines").rglob("*.json"))
    assert len(files) == 3 and all(len(name) <= 185 for name in files), files
    compare = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-retries=0")
    compare.assert_outcomes(passed=3, errors=1)  # the other id's file: refused before its body runs
    assert "give one of them another id" in compare.stdout.str()


def test_a_label_names_one_result_of_a_test(pytester):
    """Two results of one name would share a baseline entry and the engine measured again for it (the
    second's regression was measured again on the first's engine and passed as noise): refused before it runs.
    FAKE engine (plugin mechanics)."""
    pytester.makepyfile(test_l="""
from fake_engine import WORKLOAD, FakeWarmingEngine

def test_twice(llmperf):
    llmperf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False, label="throughput")
    slow = FakeWarmingEngine([8.0])
    llmperf.run(slow, WORKLOAD, warmup=False, label="throughput")

def test_place(llmperf):
    llmperf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False)  # named "0" by its place
    llmperf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False, label="0")
""")
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=off")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "llmperf.run(label='throughput'): this test already recorded a result named 'throughput'" in out, out
    assert "llmperf.run(label='0'): this test already recorded a result named '0'" in out, out


def test_a_test_that_produced_none_of_its_baselines_results_never_passes_require_unseen(pytester):
    """A test whose run was skipped (a condition in its body), or whose only result was cut short, has
    results in its baseline and none now: each is named not produced, and require fails it. FAKE engine."""
    body = """
import os
from fake_engine import WORKLOAD, FakeWarmingEngine

def test_maybe(llmperf):
    if not os.environ.get("SKIP_RUN"):
        llmperf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False, label="chat")
"""
    pytester.makepyfile(test_m=body)
    args = ("-p", "no:randomly", "--llmperf-retries=0", "--llmperf-report=rep")
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    os.environ["SKIP_RUN"] = "1"
    try:
        required = pytester.runpytest_inprocess(*args, "--llmperf-baseline=require")
        compared = pytester.runpytest_inprocess(*args, "--llmperf-baseline=compare")
    finally:
        del os.environ["SKIP_RUN"]
    required.assert_outcomes(failed=1)
    assert "the baseline holds result 'chat', which this run did not produce" in required.stdout.str()
    assert "record it with: pytest 'test_m.py::test_maybe' --llmperf-baseline=update" in required.stdout.str()
    compared.assert_outcomes(passed=1)
    assert "baselines: 1 test: 1 produced none of the results its baseline holds" in compared.stdout.str()
    doc = json.loads((pytester.path / "rep" / "results.json").read_text())
    assert doc["tests"][0]["results"] == [] and doc["tests"][0]["test"] == "test_m.py::test_maybe"


def test_a_pass_measured_again_that_failed_a_request_clears_nothing():
    """The gate's second look takes the best of the valid passes: a faster pass that failed a request is no
    evidence that the first pass's slowness was noise. FAKE engine (plugin mechanics, fake_engine.py)."""
    from dataclasses import replace

    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.remeasure import best_of_more_passes
    from pytest_llmperf.runner import LLMPerf

    slow, fast = LLMPerf(), LLMPerf()
    slow.run(FakeWarmingEngine([2.0]), WORKLOAD, warmup=False)
    quick = fast.run(FakeWarmingEngine([0.5]), WORKLOAD, warmup=False)
    first = baseline.result_entry(slow.runs[0], 0)
    slow.remeasure = lambda i, salt: replace(quick, failed=1)
    (kept,) = best_of_more_passes(slow, [first], {first.label}, 2)
    assert kept.metrics["output_tokens_per_s"] == first.metrics["output_tokens_per_s"]
    slow.remeasure = lambda i, salt: quick  # a clean faster pass is what may clear it
    (kept,) = best_of_more_passes(slow, [first], {first.label}, 1)
    assert kept.metrics["output_tokens_per_s"] > first.metrics["output_tokens_per_s"]


def test_compare_leaves_out_results_that_were_no_valid_measurement():
    """A point over capacity (saturated) or a result cut short is never compared, by the gate or by `compare`."""
    def doc(tok_s, invalid=""):
        entry = Entry("s@8", "w", False, {"output_tokens_per_s": tok_s}, [{"output_tokens_per_s": tok_s}]).to_dict()
        kept = Entry("s@1", "w1", False, {"output_tokens_per_s": 100.0}, [{"output_tokens_per_s": 100.0}]).to_dict()
        return {"tests": [{"test": "t", "results": [kept, {**entry, "summary": {"invalid": invalid}}]}]}

    text, regressed, compared = baseline.compare_results(doc(100.0), doc(10.0, "the engine saturated ..."), 0.1)
    assert not regressed and compared == 1 and "t: pass" in text
    text, regressed, compared = baseline.compare_results(doc(100.0), doc(10.0), 0.1)
    assert regressed


def test_a_tests_own_tolerances_travel_in_results_json_to_compare_and_calibrate(tmp_path):
    """`@pytest.mark.llmperf_tolerance(p99_ttft_ms=0.15)` gates a tail in the live gate; results.json did not keep
    it, so `python -m pytest_llmperf compare` passed the +20% the gate failed, and `calibrate` never learnt the
    tail's spread."""
    from pytest_llmperf import calibration

    timing = {"output_tokens_per_s": 100.0, "p50_ttft_ms": 20.0, "p99_ttft_ms": 30.0}
    samples = {"ttft": 400, "tpot": 400, "itl": 4000, "e2e": 400}

    def doc(p99, tolerances):
        e = Entry("r", "w", False, {**timing, "p99_ttft_ms": p99}, [], samples=samples).to_dict()
        return {"session": {"tolerance": [0.1, {}]}, "tests": [
            {"test": "t", "outcome": "passed", "gated": None, "tolerances": tolerances, "environment": {},
             "baseline_rows": [{"label": "r", "metric": m, "baseline": v} for m, v in timing.items()],
             "results": [{**e, "summary": {}}]}]}

    text, regressed, _ = baseline.compare_results(doc(30.0, {}), doc(36.0, {"ttft_p99": 0.15}), 0.1)
    assert regressed and "p99_ttft_ms" in text and "allowed 15.0%" in text, text
    assert not baseline.compare_results(doc(30.0, {}), doc(36.0, {}), 0.1)[1]  # a tail no tolerance names: reported
    baseline.write(baseline.path_for(tmp_path, "t", "h100", "m"),
                   baseline.document("t", "h100", "m", {}, [Entry.from_dict(doc(30.0, {})["tests"][0]["results"][0])]))
    runs = [doc(p99, {"p99_ttft_ms": 0.15}) for p99 in (33.0, 36.0, 31.0)]
    found = calibration.deviations(tmp_path, "h100", "m", runs, {})
    assert ("t", "r", "p99_ttft_ms") in found and len(found["t", "r", "p99_ttft_ms"]) == 3


def test_a_gated_metric_the_baseline_holds_no_value_of_fails_where_the_run_measured_it():
    """A baseline recorded while NVML (or the paging recorder) could not read stores null: the gate on it was off
    for good, with no row and no message, under `require` too."""
    timing = {"output_tokens_per_s": 100.0, "p50_ttft_ms": 50.0}
    old = Entry("0", "w1", True, {**timing, "gpu_memory_peak_gib": None, "kv_preemptions": None}, [timing])
    now = Entry("0", "w1", True, {**timing, "gpu_memory_peak_gib": 150.0, "kv_preemptions": 40}, [timing])
    for gate in (None, baseline.gated_metrics(["paging", "memory"])):
        v = baseline.compare(stored(old), [now], gated=gate)
        assert v.status == "regression", v
        assert sorted(r.metric for r in v.regressions) == ["gpu_memory_peak_gib", "kv_preemptions"]
        assert all(r.baseline is None and r.change is None for r in v.regressions)
        assert v.regressions[0].reason.startswith("the baseline holds no value of this gated metric")
    assert "  -  " in baseline.format_table(v)  # the missing side printed as "-"
    # a metric only reported, or one neither side holds, says nothing
    assert baseline.compare(stored(old), [now], gated=baseline.gated_metrics(["timing"])).status == "pass"
    assert baseline.compare(stored(old), [old]).status == "pass"
    # a capacity of none is a result (no load held the limits), and a metric a baseline never named is no null
    held_none = Entry("s:capacity", "c", False, {"capacity": None}, [])
    assert baseline.compare(stored(held_none), [dataclasses.replace(held_none, metrics={"capacity": 2.0})]).status == "pass"
    older = Entry("0", "w1", True, timing, [timing])  # written before gpu_memory_peak_gib was recorded
    assert baseline.compare(stored(older), [now]).status == "pass"
