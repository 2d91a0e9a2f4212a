"""Limit markers end to end: real runs of the tiny shape on transformers (CPU), judged by the plugin."""

import pytest

HEADER = """
import pytest
from pytest_llmperf import Workload

WORKLOAD = Workload.offline(6, prompt_len=(16, 64), output_len=(4, 12), seed=1)
"""


@pytest.fixture
def run(pytester):
    def run(body, *args):
        pytester.makepyfile(HEADER + body)
        return pytester.runpytest_inprocess("--llmperf-engine=hf", "-p", "no:randomly", *args)

    return run


def test_generous_limits_pass_and_tight_limits_fail_with_every_violation(run):
    result = run("""
@pytest.mark.max_p99_ms(ttft=60_000, tpot=10_000, itl=10_000, e2e=60_000)
@pytest.mark.min_throughput(output_tokens_per_s=1)
@pytest.mark.max_preemptions(0)
def test_ok(llm_engine, llmperf):
    r = llmperf.run(llm_engine, WORKLOAD)
    assert r.ttft.count == 6

@pytest.mark.max_p99_ms(ttft=0.001, e2e=0.001)
@pytest.mark.min_throughput(output_tokens_per_s=1e9)
@pytest.mark.max_kv_fragmentation(0.0001, stat="mean")
def test_tight(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)
""")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "llmperf: 4 performance limits violated" in out
    for text in ("p99_ttft_ms = ", "> limit 0.001 ms", "(from @pytest.mark.max_p99_ms(ttft=0.001))",
                 "p99_e2e_ms", "output_tokens_per_s", "< limit 1000000000", "kv_fragmentation_mean",
                 "measured on 6 requests", "worst requests: #"):
        assert text in out, text
    assert "PERF-FAILED" in out
    assert "engines started: 1" in out  # both tests shared one engine
    # the summary shows every limit beside its value: the margin a passing test had, how far a failing one was over
    ok = next(line for line in out.splitlines() if line.startswith("  limits of ") and "::test_ok:" in line)
    assert "p99_ttft_ms " in ok and " ms <= 60000 ms (" in ok and "to spare)" in ok, ok
    assert "kv_preemptions 0 <= 0" in ok, ok
    tight = next(line for line in out.splitlines() if line.startswith("  limits of ") and "::test_tight:" in line)
    assert "< 1000000000 output_tokens/s (short by 100%)" in tight, tight
    assert "p99_ttft_ms " in tight and "> 0.001 ms (over by " in tight, tight


@pytest.mark.parametrize("mode, also", [
    ("require", "--llmperf-baseline=require: no baseline for cpu/shape:tiny-llama either; record it with: pytest "),
    ("update", "no baseline written: a test whose limits fail is not recorded"),
])
def test_a_failed_limit_also_says_what_the_baseline_gate_would_have(run, mode, also):
    """Limits are judged first and a failed one ends the test: the baseline it never reached is still named
    (missing under require, not recorded under update), so a user does not learn of it one fix later."""
    result = run("""
@pytest.mark.min_throughput(output_tokens_per_s=1e9)
def test_slow(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)
""", f"--llmperf-baseline={mode}")
    result.assert_outcomes(failed=1)
    assert also in result.stdout.str(), result.stdout.str()


def test_repeats_and_worst_requests_are_reported(run):
    result = run("""
@pytest.mark.max_p50_ms(e2e=0.001)
def test_it(hf_engine, llmperf):
    r = llmperf.run(hf_engine, WORKLOAD, repeats=2, warmup=False)
    assert r.repeats == 2 and r.n_sequences == 12
""")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "x 2 repeats" in out and out.count("#") >= 3


@pytest.mark.parametrize("marker, message", [
    ("max_p99_ms(ttfx=3)", "unexpected keyword argument 'ttfx'; did you mean ttft=3?"),
    ("max_p99_ms(zzz=3)", "unexpected keyword argument 'zzz'; usage: max_p99_ms("),  # nothing close: no guess
    ("max_p99_ms()", "give at least one of ttft="),
    ("max_p95_ms(ttft=-1)", "must be a finite number >= 0"),
    ("max_p90_ms(ttft='fast')", "is not a number"),
    ("max_kv_fragmentation(1.5)", "must be within [0, 1]"),
    # limits that could never fail
    ("min_throughput(output_tokens_per_s=0)", "output_tokens_per_s=0 must be above 0: a floor of 0 always holds"),
    ("min_prefix_cache_hit_rate(0.0)", "rate=0.0 must be above 0"),
    ("min_throughput_per_gib(tokens_per_s={'cpu': 0, 'default': 50})", "tokens_per_s=0 must be above 0"),
    ("max_kv_usage(1.0)", "limit=1.0 must be below 1: a share never exceeds 1"),
    ("max_kv_fragmentation(1, stat='mean')", "limit=1 must be below 1"),
    ("max_gpu_memory(fraction=1)", "fraction=1 must be below 1"),
    ("max_kv_fragmentation(0.1, stat='median')", "must be 'max' or 'mean'"),
    ("min_prefix_cache_hit_rate(2)", "must be within [0, 1]"),
    ("max_preemptions(1.5)", "whole number"),
    ("max_p99_ms(ttft={'a100': 5})", "no value for hardware class 'cpu'"),
    ("max_p99_ms(ttft={'h20o': 5, 'default': 9})", "names hardware class 'h20o', which is none of the classes known "
                                                   "here (a100, a10g, b200, cpu, gh200, h100, h200, l4, l40s, mi300x)"),
    ("llmperf_engine(32)", "keyword options only"),
    ("llmperf_engine(tensor_parallel_size='two')", "tensor_parallel_size='two' must be a whole number of GPUs"),
    ("llmperf_engine(pipeline_parallel_size=0)", "pipeline_parallel_size=0 must be a whole number of GPUs, 1 or more"),
    ("llmperf_model()", "takes one model as --llmperf-model takes it"),
    ("llmperf_gate()", "names nothing: give groups (paging, memory, timing, capacity)"),
    ("llmperf_gate('speed')", "unknown metric or group 'speed'"),
    ("llmperf_model(model='shape:tiny-llama')", "takes one model as --llmperf-model takes it"),
    ("llmperf_model('shape:tiny-lama')", "llmperf_model('shape:tiny-lama'): unknown model shape 'tiny-lama'"),
    ("min_capacity(concurrency=0, under={'p99_ttft_ms': 1000})", "concurrency=0 must be above 0"),
    ("min_capacity(concurrency=4, under={'ttft_p99_ms': 1000})",
     "under= names 'ttft_p99_ms', not a latency metric: choose among mean_ttft_ms, p50_ttft_ms"),
])
def test_bad_marker_input_errors_before_running(run, marker, message):
    result = run(f"""
@pytest.mark.{marker}
def test_it(hf_engine, llmperf):
    raise AssertionError("the body must not run")
""")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert message in out and "test_it" in out and "the body must not run" not in out
    # one line: not printed again as the context of the failure that reports it
    assert "During handling of the above exception" not in out and "direct cause" not in out, out


@pytest.mark.parametrize("mode", ["off", "update", "compare"])
@pytest.mark.parametrize("tolerance, message", [
    ("ttft_p99=-1", "llmperf_tolerance(ttft_p99=-1): give a finite fraction >= 0"),
    ("ttft_p99=float('inf')", "llmperf_tolerance(ttft_p99=inf): give a finite fraction >= 0"),
    ("ttft_p42=0.1", "llmperf_tolerance(ttft_p42=...): unknown metric"),
])
def test_a_bad_tolerance_errors_before_running_in_every_baseline_mode(pytester, mode, tolerance, message):
    """Under update the body would otherwise measure first and the error then lose what it measured."""
    pytester.makepyfile(f"""
import pytest

@pytest.mark.llmperf_tolerance({tolerance})
def test_it(llmperf):
    raise AssertionError("the body must not run")
""")
    result = pytester.runpytest_inprocess("-p", "no:randomly", f"--llmperf-baseline={mode}",
                                          f"--llmperf-baseline-dir={pytester.path / 'baselines'}")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert message in out and "the body must not run" not in out, out


def test_an_engine_option_the_engine_does_not_take_is_one_line_naming_where_it_came_from(run):
    result = run("""
@pytest.mark.llmperf_engine(blok_size=32)
def test_typo(hf_engine, llmperf):
    raise AssertionError("the body must not run")

def test_after(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)
""")
    result.assert_outcomes(passed=1, errors=1)
    out = result.stdout.str()
    assert "llmperf: hf engine does not take ['blok_size']" in out, out
    assert "(options given: @pytest.mark.llmperf_engine {'blok_size': 32})" in out, out
    # the message alone: no traceback through the plugin's fixtures, and not printed again as a context
    assert "the body must not run" not in out and "fixtures.py" not in out and "During handling" not in out, out


def test_a_bad_marker_errors_its_test_and_the_session_goes_on(run):
    result = run("""
@pytest.mark.min_capacity(concurrency=4, under={"ttft_p99_ms": 1000})
def test_bad(hf_engine, llmperf):
    pass

@pytest.mark.max_p99_ms(e2e=60_000)
def test_after(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)
""")
    result.assert_outcomes(passed=1, errors=1)
    assert "INTERNALERROR" not in result.stdout.str()


def test_marker_without_result_and_unmeasurable_metric_fail(run):
    result = run("""
@pytest.mark.max_p99_ms(ttft=100)
def test_no_result(hf_engine, llmperf):
    pass

@pytest.mark.max_gpu_memory(gib=10)
def test_cpu_has_no_gpu_memory(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)
""")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "recorded no result: call llmperf.run" in out
    assert "max_gpu_memory(gib=10) cannot be checked" in out and "gpu_memory_peak_gib" in out


def test_hardware_mapping_uses_the_class_or_default(run):
    result = run("""
@pytest.mark.max_p99_ms(ttft={"h100": 0.001, "default": 60_000})
def test_default_applies(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)

@pytest.mark.max_p99_ms(ttft={"cpu": 0.001, "default": 60_000})
def test_class_applies(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD)
""")
    result.assert_outcomes(passed=1, failed=1)
    assert "test_class_applies" in result.stdout.str().split("short test summary")[1]


def test_a_class_of_the_projects_own_may_key_a_limit_once_declared(run, pytester):
    # no engine runs: a rejected key errors before the body, an accepted one reaches the body
    body = """
@pytest.mark.max_p99_ms(ttft={"a100-80gb": 5, "default": 9})
def test_it(llmperf):
    raise AssertionError("reached the body")
"""
    result = run(body)
    result.assert_outcomes(errors=1)
    assert "names hardware class 'a100-80gb'" in result.stdout.str()
    pytester.makeini("[pytest]\nllmperf_hardware_classes = A100-80GB pool-b\n")
    result = run(body)
    result.assert_outcomes(failed=1)
    assert "reached the body" in result.stdout.str()


def test_workload_longer_than_the_model_is_a_clear_error(run):
    result = run("""
def test_it(hf_engine, llmperf):
    llmperf.run(hf_engine, Workload.offline(2, prompt_len=4000, output_len=200))
""")
    result.assert_outcomes(failed=1)
    assert "do not fit the engine's max_model_len=4096" in result.stdout.str()


def test_markers_are_documented_from_their_signatures(pytester):
    out = pytester.runpytest("--markers").stdout.str()
    assert "@pytest.mark.max_p99_ms(ttft: float | None = None" in out
    assert "@pytest.mark.max_kv_fragmentation(limit: float, stat: str = max): llmperf:" in out
    assert "@pytest.mark.llmperf_engine(**options)" in out


def test_junit_properties_carry_headline_metrics(run, pytester):
    run("""
def test_it(hf_engine, llmperf):
    llmperf.run(hf_engine, WORKLOAD, label="chat")
""", "--junitxml=out.xml")
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="llmperf.chat.p99_ttft_ms"' in xml and 'name="llmperf.chat.output_tokens_per_s"' in xml


NOISY = """
import pytest
from fake_engine import WORKLOAD, FakeWarmingEngine

# a FAKE engine (plugin mechanics): each pass's TTFT is the duration it is told
@pytest.mark.max_p99_ms(ttft=1200)
def test_noisy(llmperf):
    llmperf.run(FakeWarmingEngine(DURATIONS), WORKLOAD, warmup=False)
"""


@pytest.mark.parametrize("durations, outcome, said", [
    ([1.5, 1.0, 9.0], "passed", "result 0 violated a limit in its first pass and none when measured again (2 passes)"),
    ([1.5, 1.4, 1.3], "failed", "result 0 violated limits in all 3 measurements"),
])
def test_a_violated_timing_limit_is_measured_again_before_it_fails(pytester, durations, outcome, said):
    pytester.makepyfile(NOISY.replace("DURATIONS", repr(durations)))
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rA", "--llmperf-baseline=off")
    result.assert_outcomes(**{outcome: 1})
    out = result.stdout.str()
    assert said in out
    if outcome == "failed":  # the failure shows the first pass, the one the summary table shows
        assert "p99_ttft_ms = 1500 ms > limit 1200 ms" in out and "1300 ms" not in out
        row = next(line for line in out.splitlines() if "::test_noisy " in line and " failed" in line)
        assert " 1500.0 " in row, row


FAILS_ONCE = """
from dataclasses import replace

from fake_engine import WORKLOAD, FakeWarmingEngine


class FailsFirst(FakeWarmingEngine):  # a FAKE engine (plugin mechanics): its first full pass loses a request
    def run(self, workload, salt=0):
        trace = super().run(workload, salt)
        if self.full_passes == 1 and len(workload) == len(WORKLOAD):
            lost = replace(trace.sequences[0], error="HTTP 500: upstream reset", chunks=())
            return replace(trace, sequences=(lost, *trace.sequences[1:]))
        return trace


class Drops(FakeWarmingEngine):  # a FAKE engine that returns nothing for the workload's last request
    def run(self, workload, salt=0):
        trace = super().run(workload, salt)
        return replace(trace, sequences=trace.sequences[:-1])


def test_fails_once(llmperf):
    llmperf.run(FailsFirst([1.0]), WORKLOAD, warmup=False)


def test_drops(llmperf):
    r = llmperf.run(Drops([1.0]), WORKLOAD, warmup=False)
    assert r.n_sequences == len(WORKLOAD) and r.failed == 1
"""


def test_a_failed_request_is_never_measured_again_as_noise_and_a_dropped_one_counts_as_failed(pytester):
    """A pass whose request failed fails its test even when the next pass would have none (a failure is
    not noise), and a request an engine returned nothing for is a failed request, not one fewer."""
    pytester.makepyfile(FAILS_ONCE)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-rA", "--llmperf-baseline=off")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "error_rate = 0.125 > limit 0" in out and "HTTP 500: upstream reset" in out, out
    assert "noise, not a regression" not in out and "measurements" not in out, out
    assert "request 7.0: the engine returned nothing for this request" in out, out


def test_a_pass_whose_client_fell_behind_clears_no_violation_nor_does_a_pass_after_a_failed_request():
    """Measured again, a pass that was not a valid measurement (the client offered less load than asked)
    cannot show the first pass's violation was noise; the next valid one can."""
    from dataclasses import replace

    from pytest_llmperf import assertions, remeasure
    from pytest_llmperf.metrics import summarize
    from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace

    def result(ttft_s, invalid=""):
        seqs = tuple(SequenceTrace(i, 0, 10, 2, 0.0, (Chunk(ttft_s, 1), Chunk(ttft_s + 0.01, 1))) for i in range(8))
        return replace(summarize([RunTrace("fake", seqs, 0.0, 1.0)], "h", 8), invalid=invalid)

    limits = assertions.parse("max_p50_ms", (), {"ttft": 250}, None)
    first = assertions.check(limits, [result(0.5)])
    assert [v.limit.metric for v in first] == ["p50_ttft_ms"]
    behind = result(0.1, invalid="the client fell behind its arrival schedule")
    assert remeasure.violations_that_hold(limits, first, False, lambda n: behind, 2) == (first, 3)
    passes = iter([behind, result(0.1)])
    assert remeasure.violations_that_hold(limits, first, False, lambda n: next(passes), 2) == ([], 3)
    # a retry that fails a request holds it: a later pass within every limit does not clear a failure
    both = limits + assertions.parse("max_error_rate", (0,), {}, None)
    failing = replace(result(0.5), failed=1)
    passes = iter([failing, result(0.1)])
    left, measured = remeasure.violations_that_hold(both, first, False, lambda n: next(passes), 2)
    assert sorted(v.limit.metric for v in left) == ["error_rate", "p50_ttft_ms"] and measured == 2


def test_every_marker_the_plugin_registers_comes_from_one_catalogue(pytester):
    """`pytest --markers` lists exactly the catalogue's lines: limits, engine options, tolerance and every
    hardware class, with nothing registered elsewhere."""
    from pytest_llmperf import markers

    result = pytester.runpytest_inprocess("--markers", "--llmperf-hardware=cpu")
    listed = [line.removeprefix("@pytest.mark.") for line in result.stdout.lines if "llmperf:" in line]
    assert listed == [line.splitlines()[0] for line in markers.catalogue("cpu")]
    assert markers.is_plugin_marker("max_p99_ms") and markers.is_plugin_marker(markers.TOLERANCE)
    assert not markers.is_plugin_marker("h200")  # a hardware class alone does not make a test a plugin user
