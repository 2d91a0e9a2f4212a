"""Real vLLM engines side by side (--llmperf-side-by-side): started together in one pytest session, each with
vLLM's default topology (an engine-core process of its own), each recording its own paging."""

import pytest

pytest.importorskip("vllm")

PAGING_TESTS = """
import pytest
from pytest_llmperf import Workload

pytestmark = pytest.mark.llmperf_gate("paging", "memory")
LONG = Workload.offline(32, prompt_len=(64, 256), output_len=(128, 256), seed=22)


def neighbours(session, engine):
    mine, beside = engine.device_pids(), session.pool.beside(engine)
    assert mine and beside and not mine & beside, (mine, beside)
    return beside


@pytest.mark.llmperf_engine(num_gpu_blocks_override=48, max_model_len=1024)
def test_tight(vllm_engine, llmperf, llmperf_session):
    neighbours(llmperf_session, vllm_engine)  # the other engine is up beside this one before it measures
    assert llmperf.run(vllm_engine, LONG).kv.preemptions > 0


@pytest.mark.llmperf_engine(num_gpu_blocks_override=1024)
def test_roomy(vllm_engine, llmperf, llmperf_session):
    neighbours(llmperf_session, vllm_engine)
    result = llmperf.run(vllm_engine, LONG)
    assert result.kv.preemptions == 0 and result.kv.blocks_peak > 48
"""


def test_engines_started_side_by_side_each_record_their_own_paging(pytester, monkeypatch):
    """Two engines of different KV budgets start at once (two engine-core processes inherit one environment
    while they start) and each one's recorder still sees its own engine: the tight one preempts, the
    roomy one does not and holds more blocks than the tight one has. Each test sees the other engine's
    processes beside its own, distinct from them."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # vLLM's default topology, the one a GPU user runs
    pytester.makepyfile(test_paging_side_by_side=PAGING_TESTS)
    result = pytester.runpytest_subprocess("--llmperf-side-by-side=on", "--llmperf-baseline=off", "-p", "no:randomly",
                                           timeout=600)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["time to verdict: * engine start * (2 starts)*"])


def test_a_bad_side_by_side_value_is_a_usage_error(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_inprocess("--llmperf-side-by-side=always")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-side-by-side*invalid choice*'always'*"])
