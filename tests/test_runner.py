"""The runner's warm-up: quick, steady (whole passes until two agree on throughput) and auto.

Plugin mechanics only, on a FAKE engine whose passes take the times it is told; that a real engine
warms up this way is checked on vLLM in test_vllm_engine.py and on the GPU in tests/gpu."""

import gc

import pytest
from fake_engine import WORKLOAD, FakeWarmingEngine

from pytest_llmperf import Workload, runner
from pytest_llmperf import baseline as bl
from pytest_llmperf.baseline import result_entry
from pytest_llmperf.runner import STEADY_MAX_PASSES, LLMPerf, Run


def test_quick_warm_up_is_a_few_requests_and_no_whole_pass():
    engine = FakeWarmingEngine([1.0])
    result = LLMPerf(warmup_mode="quick").run(engine, WORKLOAD)
    assert result.warmup == "quick" and result.warmup_passes == 0
    assert [p[0] for p in engine.passes] == [4, 8]  # four warm-up requests, then the measured pass


def test_steady_warm_up_runs_whole_passes_until_two_agree_and_one_more():
    # 2.0 s, 1.5 s, 1.2 s, then 1.19 s: passes 3 and 4 agree within 3%, pass 5 measures the noise, the
    # sixth pass is measured
    engine = FakeWarmingEngine([2.0, 1.5, 1.2, 1.19, 1.19])
    result = LLMPerf(warmup_mode="steady").run(engine, WORKLOAD)
    assert result.warmup == "steady" and result.warmup_passes == 5
    assert [p[0] for p in engine.passes] == [4, 8, 8, 8, 8, 8, 8]
    assert result.throughput.output_tokens_per_s == pytest.approx(80 / 1.19)
    salts = [p[1] for p in engine.passes]
    assert len(set(salts)) == len(salts)  # no pass finds another's prefix cache


def test_every_pass_runs_with_the_heap_before_it_frozen_and_the_heap_is_thawed_after():
    """A full collection over the test process's heap stalled a vLLM front end 0.4-0.7 s per pass; the
    runner freezes what exists before each pass (warm-up passes too) and thaws it after."""
    engine = FakeWarmingEngine([1.0, 1.0])
    before = gc.get_freeze_count()
    LLMPerf(warmup_mode="steady").run(engine, WORKLOAD)
    assert len(engine.frozen) == 5 and min(engine.frozen) > before + 1000
    assert gc.get_freeze_count() == before


def test_an_engine_is_warmed_until_steady_once_and_stays_warm_for_later_runs():
    engine, other = FakeWarmingEngine([2.0, 1.5, 1.2, 1.19]), FakeWarmingEngine([1.0])
    steady = {}  # the session's record, shared by every test's llmperf
    first = LLMPerf(warmup_mode="steady", steady_engines=steady).run(engine, WORKLOAD)
    later = LLMPerf(warmup_mode="steady", steady_engines=steady).run(engine, WORKLOAD)
    assert (first.warmup_passes, later.warmup_passes) == (5, 0) and later.warmup == "steady"
    assert [p[0] for p in engine.passes[-2:]] == [4, 8]  # the later run: quick warm-up, then measured
    assert LLMPerf(warmup_mode="steady", steady_engines=steady).run(other, WORKLOAD).warmup_passes == 3


def test_a_steady_warm_up_of_a_timed_workload_runs_it_offline():
    timed = Workload.poisson(qps=50, n=8, prompt_len=16, output_len=10, seed=1)
    engine = FakeWarmingEngine([1.0])
    LLMPerf(warmup_mode="steady").run(engine, timed)
    assert [p[2] for p in engine.passes] == [True, True, True, True, False]  # warm-up offline, measured as given


def test_an_engine_that_never_settles_is_warned_about_and_recorded():
    engine = FakeWarmingEngine([3.0 - 0.3 * k for k in range(STEADY_MAX_PASSES + 1)])
    with pytest.warns(UserWarning, match=f"still changing after {STEADY_MAX_PASSES} warm-up passes"):
        result = LLMPerf(warmup_mode="steady").run(engine, WORKLOAD)
    assert result.warmup_passes == STEADY_MAX_PASSES


def test_a_warm_up_of_slow_passes_stops_after_three_once_it_has_taken_its_time(monkeypatch):
    # a workload whose pass takes tens of seconds on this engine: three passes give the noise figure
    monkeypatch.setattr(runner, "STEADY_MAX_SECONDS", 0.0)
    engine = FakeWarmingEngine([3.0 - 0.3 * k for k in range(STEADY_MAX_PASSES + 1)])
    # the seconds said are the warm-up's own wall time (under 1 s on an idle machine; a fresh clone's loaded CI ran
    # past 0.5 s and said "1 s"): the three passes are what this checks
    with pytest.warns(UserWarning, match=r"still changing after 3 warm-up passes in \d+ s"):
        result = LLMPerf(warmup_mode="steady").run(engine, WORKLOAD)
    assert result.warmup_passes == 3 and result.noise["output_tokens_per_s"] > 0


def test_a_warm_up_that_never_settles_widens_the_baseline_comparison_of_timing_metrics_only():
    # passes alternate 1.0 s / 1.25 s: never two alike, so the runner cannot tell a regression from
    # this engine's own swing; the last three warm-up passes (1.25, 1.0, 1.25 s) give its noise
    engine = FakeWarmingEngine([1.0, 1.25] * STEADY_MAX_PASSES)
    perf = LLMPerf(warmup_mode="steady")
    with pytest.warns(UserWarning, match="carry ±12% of noise"):
        baseline = perf.run(engine, WORKLOAD)
    swing = (80 / 1.0 - 80 / 1.25) / 2 / (80 / 1.25)
    assert baseline.noise["output_tokens_per_s"] == pytest.approx(swing) == 0.125
    assert baseline.noise["p99_e2e_ms"] >= swing and "kv_preemptions" not in baseline.noise
    later = perf.run(engine, WORKLOAD, warmup=False)  # the engine keeps its noise for later results
    assert later.noise["output_tokens_per_s"] == baseline.noise["output_tokens_per_s"]
    stored = bl.document("t", "any", "model", {}, [result_entry(Run(baseline, WORKLOAD, engine), 0)])
    verdict = bl.compare(stored, [result_entry(Run(later, WORKLOAD, engine), 0)])
    slower = next(r for r in verdict.rows if r.metric == "output_tokens_per_s")
    assert slower.change == pytest.approx(-0.2) and slower.allowed == pytest.approx(0.25) and verdict.status == "pass"


def test_a_settled_warm_up_leaves_the_tolerance_alone():
    engine = FakeWarmingEngine([2.0, 1.2, 1.19])
    result = LLMPerf(warmup_mode="steady").run(engine, WORKLOAD)
    assert result.noise["output_tokens_per_s"] < 0.01  # three passes within 1%
    assert FakeWarmingEngine([1.0]) not in LLMPerf(warmup_mode="quick").steady_engines


def test_two_passes_that_agree_by_chance_do_not_hide_the_engines_noise():
    # 1.2 s and 1.19 s agree, then the pass the rule did not choose takes 1.5 s: the engine swings,
    # and its results carry that swing (half the range of the last three over their median)
    engine = FakeWarmingEngine([1.2, 1.19, 1.5, 1.2])
    result = LLMPerf(warmup_mode="steady").run(engine, WORKLOAD)
    rates = [80 / 1.2, 80 / 1.19, 80 / 1.5]
    assert result.warmup_passes == 3
    assert result.noise["output_tokens_per_s"] == pytest.approx((max(rates) - min(rates)) / 2 / (80 / 1.2), abs=1e-5)


def test_auto_is_quick_without_a_gpu_and_explicit_choices_win():
    engine = FakeWarmingEngine([1.0])
    perf = LLMPerf()  # auto, and no GPU sampled
    assert perf.run(engine, WORKLOAD).warmup == "quick"
    assert perf.run(engine, WORKLOAD, warmup="steady").warmup == "steady"
    off = perf.run(engine, WORKLOAD, warmup=False)
    assert off.warmup == "none" and off.warmup_passes == 0
    with pytest.raises(ValueError, match="warmup='long': choose True, False or one of auto, quick, steady"):
        perf.run(engine, WORKLOAD, warmup="long")


def test_auto_is_steady_on_a_gpu_unless_the_test_gates_no_timing():
    """The steady warm-up serves timing only: a test whose llmperf_gate names no timing metric gets the
    quick one on a GPU too; an explicit choice still wins."""
    assert LLMPerf(gpu_index=0)._warmup(True) == "steady"
    paging_only = LLMPerf(gpu_index=0, timing_gated=False)
    assert paging_only._warmup(True) == "quick" and paging_only._warmup("steady") == "steady"


def test_the_warm_up_option_is_checked_and_reaches_the_session_record(pytester):
    pytester.makepyfile("""
        def test_session_warmup(llmperf_session, llmperf):
            assert llmperf_session.warmup == llmperf.warmup_mode == "steady"
            assert llmperf_session.describe()["warmup"] == "steady"
    """)
    pytester.runpytest("--llmperf-warmup", "steady").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nllmperf_warmup = long\n")
    result = pytester.runpytest()
    result.stderr.fnmatch_lines(["*llmperf_warmup='long': choose one of auto, quick, steady*"])
