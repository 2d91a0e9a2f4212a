"""Hypothesis property tests: strategies, the settings profile, inline judging with re-measurement,
and shrinking to the exact minimal workload on a real engine."""

import pytest
from hypothesis import given, settings

from pytest_llmperf import Workload
from pytest_llmperf import strategies as lst
from pytest_llmperf.assertions import parse
from pytest_llmperf.engine_limits import published
from pytest_llmperf.metrics import summarize
from pytest_llmperf.properties import PerfLimitExceeded, checker
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace


def test_edges_are_block_multiples_either_side_one_and_the_limit():
    assert lst.edges(1, 100, (16,), 90) == [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 89, 90, 100]


@settings(max_examples=60, deadline=None)
@given(w=lst.workloads(min_requests=1, max_requests=8, arrivals=("offline", "poisson", "closed_loop"),
                       shared_prefix=True))
def test_workloads_fit_the_engine_and_are_valid(w):
    assert 1 <= len(w) <= 8 and w.max_total_len <= 4096
    assert all(r.prefix_len == w.requests[0].prefix_len for r in w.requests)
    assert Workload.from_dict(w.to_dict()) == w


def test_strategies_ask_the_published_engine_limits():
    @settings(max_examples=40, deadline=None)
    @given(w=lst.workloads(max_requests=4))
    def inner(w):
        assert w.max_total_len <= 300

    with published(max_model_len=300, block_size=32):
        inner()


def test_workloads_shrink_to_fewest_shortest_offline_requests():
    from hypothesis import find

    minimal = find(lst.workloads(max_requests=10, arrivals=("offline", "poisson")),
                   lambda w: any(r.prompt_len > 100 for r in w.requests), settings=settings(database=None))
    assert minimal.kind == "offline" and len(minimal) == 1
    assert minimal.requests[0].prompt_len == 101 and minimal.requests[0].output_len == 1


def _result(ttft_s):
    seq = SequenceTrace(0, 0, 10, 2, 0.0, (Chunk(ttft_s, 1), Chunk(ttft_s + 0.01, 1)))
    return summarize([RunTrace("fake", (seq,), 0.0, ttft_s + 0.01)], "h", 1)


def test_a_noisy_violation_is_measured_again_before_it_counts():
    """Pure mechanics with hand-built results: no engine involved."""
    limits = parse("max_p99_ms", (), {"ttft": 100}, "cpu")
    timed = Workload.poisson(qps=5, n=1, prompt_len=10, output_len=2, seed=1)
    check = checker(limits, retries=2)
    again = iter([_result(0.05)])
    check(_result(0.5), timed, lambda n: next(again))  # slow once, fine when measured again: passes
    slow = iter([_result(0.4), _result(0.3)])
    with pytest.raises(PerfLimitExceeded, match="violated in all 3 measurements") as info:
        check(_result(0.5), timed, lambda n: next(slow))
    assert "reproduce as a plain test: llmperf.run(engine, Workload.from_dict(" in str(info.value)


def test_an_example_no_valid_measurement_is_measured_again_and_fails_if_it_never_is():
    """Pure mechanics with hand-built results: no engine involved."""
    from dataclasses import replace

    from pytest_llmperf.properties import PerfExampleInvalid

    limits = parse("max_p99_ms", (), {"ttft": 100}, "cpu")
    timed = Workload.poisson(qps=5, n=1, prompt_len=10, output_len=2, seed=1)
    check = checker(limits, retries=2)
    behind = replace(_result(0.05), invalid="the client fell behind its arrival schedule")
    again = iter([_result(0.05)])
    check(behind, timed, lambda n: next(again))  # a stall of the host once: valid when measured again, and fast
    never = iter([behind, behind])
    with pytest.raises(PerfExampleInvalid, match="not a valid measurement in any of 3 passes of this workload: the "
                                                 "client fell behind") as info:
        check(behind, timed, lambda n: next(never))
    assert "reproduce as a plain test: llmperf.run(engine, Workload.from_dict(" in str(info.value)
    # valid on the second pass, then slow: the re-measurements of the limit take the passes after it
    salts, passes = [], iter([_result(0.4), _result(0.3), _result(0.2)])
    with pytest.raises(PerfLimitExceeded, match="violated in all 3 measurements"):
        check(behind, timed, lambda n: salts.append(n) or next(passes))
    assert salts == [1, 2, 3]


LATE = """
from hypothesis import given, strategies as st
from fake_engine import FakeWarmingEngine
from pytest_llmperf import Workload
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace


class Late(FakeWarmingEngine):  # a FAKE engine (plugin mechanics) whose client sends each request 0.5 s late
    def run(self, workload, salt=0):
        seqs = tuple(SequenceTrace(i, 0, r.prompt_len, r.output_len, r.arrival_s + 0.5,
                                   (Chunk(r.arrival_s + 0.6, r.output_len),)) for i, r in enumerate(workload.requests))
        return RunTrace("fake", seqs, 0.0, 3.0)


@given(qps=st.sampled_from([2.0, 3.0]))
def test_late(llmperf, qps):
    llmperf.run(Late([1.0]), Workload.poisson(qps=qps, n=4, prompt_len=8, output_len=2, seed=1), warmup=False)
"""


def test_a_property_test_whose_examples_are_never_valid_is_perf_invalid(pytester):
    pytester.makepyfile(test_late=LATE)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=off")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "not a valid measurement in any of 3 passes of this workload: the client fell behind" in out, out
    assert "PERF-INVALID" in out, out


CURVES = """
import pytest
from hypothesis import given, strategies as st
from fake_engine import FakeWarmingEngine
from pytest_llmperf import Workload

# a FAKE engine (plugin mechanics)
@pytest.mark.min_capacity(concurrency=2, under={"p99_ttft_ms": 500})
@given(n=st.just(8))
def test_capacity(llmperf, n):
    llmperf.run(FakeWarmingEngine([0.01]), Workload.offline(n, prompt_len=16, output_len=10), warmup=False)

@given(n=st.just(8))
def test_sweep(llmperf, n):
    llmperf.sweep(FakeWarmingEngine([0.01]), lambda c: Workload.closed_loop(int(c), n, 16, 10), concurrency=[1, 2],
                  warmup=False)
"""


def test_a_property_test_holds_no_curve_and_says_so_before_it_measures(pytester):
    """A `@given` test judged `min_capacity` at each example's first sweep point as if it were a point metric (an
    error that blamed a missing GPU) and each overloaded point by the point limits; a property test keeps one
    example's result at a time, so it can hold no curve: both are refused, saying where they belong."""
    pytester.makepyfile(test_curves=CURVES)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=off")
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.str()
    assert "@pytest.mark.min_capacity(concurrency=2" in out and "put the sweep and its min_capacity in a plain test" in out
    assert "llmperf.sweep and find_capacity measure a curve" in out and "sweep in a plain test" in out, out


PLANTED = """
import pytest
from hypothesis import given, strategies as st
from pytest_llmperf import strategies as lst

# One request at a time, blocks of 32, 159 usable blocks: a request holds ceil(prompt / 32) blocks at
# its prefill, so usage exceeds 2/159 exactly when some prompt is longer than 64 tokens.
@pytest.mark.llmperf_engine(max_num_seqs=1, num_gpu_blocks_override=160)
@pytest.mark.max_kv_usage(0.015)
@given(workload=lst.workloads(max_requests=6, prompt_len=lst.lengths(1, 400), output_len=st.just(1)))
def test_planted(vllm_engine, llmperf, workload):
    llmperf.run(vllm_engine, workload, warmup=False)
"""


def test_a_planted_paging_bound_shrinks_to_the_exact_minimal_workload(pytester):
    pytest.importorskip("vllm")
    pytester.makepyfile(test_planted=PLANTED)
    result = pytester.runpytest_subprocess("--llmperf-engine=vllm", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "kv_usage_peak = " in out and "(from @pytest.mark.max_kv_usage(0.015))" in out
    assert "#0: prompt 65, output 1" in out and "#1:" not in out  # one request, one token over 64
    assert "'requests': [{'prompt_len': 65, 'output_len': 1}]" in out
    assert "Falsifying example" in out or "Failing test case" in out  # wording of newer Hypothesis
    assert "PERF-FAILED" in out  # a limit broken inside a property test is a performance failure like any other
    # the fixtures of the failing case printed short, not the thousands of lines of the runs they hold
    assert "<llmperf fixture of test_planted.py::test_planted: " in out and "steady_engines=" not in out, out


@pytest.mark.parametrize(("ci", "derandomized"), [("true", True), ("1", True), ("", False), ("false", False),
                                                   ("0", False)])
def test_the_profile_is_derandomized_under_ci_only(monkeypatch, ci, derandomized):
    """A gate must be reproducible under CI; a developer's `CI=false` asks for the usual random search."""
    from pytest_llmperf.properties import PROFILE, register_profile

    monkeypatch.setenv("CI", ci)
    try:
        register_profile()
        assert settings.get_profile(PROFILE).derandomize is derandomized
    finally:  # the profile as this session's own environment asks
        monkeypatch.undo()
        register_profile()
