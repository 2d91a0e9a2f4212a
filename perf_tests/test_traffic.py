"""Production traffic replayed: two minutes of the Mooncake conversation trace (a slice ships in
perf_tests/data/), with its arrival times and the prefix sharing its hash_ids record.

Sized for the tiny shape on a CPU (marked `cpu`, with a CPU baseline only): 1/64 of the trace's lengths
(8-token blocks) and 1/10 of its time, 339 requests in 12 s. At 1/40 of its time (3 s) the window offered
about 26,000 prompt tokens a second, more than the 2-core CPU serves: requests queued, and its latencies
measured the queue, 2-5 times apart between unchanged runs (docs/performance.md, false alarms); at 1/10
the engine keeps up and the latencies are the engine's.
"""

from pathlib import Path

import pytest

from pytest_llmperf import Workload

pytest.importorskip("vllm")

TRACE = Path(__file__).parent / "data" / "mooncake_conversation_head400.jsonl"


@pytest.mark.cpu
# room for every block of the window, so that nothing the trace shares is evicted before it is asked for
@pytest.mark.llmperf_engine(enable_prefix_caching=True, num_gpu_blocks_override=8192)
# the window's hash_ids predict 0.071 of its prompt tokens served from the cache
# (trace_replay.predicted_prefix_hit_rate; offline, vLLM serves exactly that): half of it is the floor,
# so arrival timing may move a few hits, and a broken prefix cache (0) fails
@pytest.mark.min_prefix_cache_hit_rate(0.035)
@pytest.mark.max_preemptions(0)
def test_replay_of_a_production_chat_trace(vllm_engine, llmperf):
    """Later turns of a conversation resend the earlier ones: the cache serves them."""
    window = Workload.from_trace(TRACE, start=0, duration_s=120, length_scale=1 / 64, time_scale=1 / 10)
    result = llmperf.run(vllm_engine, window)
    assert result.failed == 0 and result.n_requests == 339
