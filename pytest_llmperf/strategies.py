"""Hypothesis strategies for LLM workloads: `lengths`, `requests`, `workloads`.

    from hypothesis import given
    from pytest_llmperf import strategies as lst

    @given(workload=lst.workloads(max_requests=64, prompt_len=lst.lengths(1, 4096)))
    @pytest.mark.max_kv_fragmentation(0.05)
    def test_paging_stays_compact(vllm_engine, llmperf, workload):
        llmperf.run(vllm_engine, workload)
"""

try:
    from ._strategies import ARRIVALS, edges, lengths, requests, workloads
except ModuleNotFoundError as e:
    if e.name != "hypothesis":
        raise
    raise ModuleNotFoundError("pytest_llmperf.strategies builds on Hypothesis: pip install 'pytest-llmperf[hypothesis]'",
                              name="hypothesis") from None

__all__ = ["ARRIVALS", "edges", "lengths", "requests", "workloads"]
