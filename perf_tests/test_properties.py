"""Property suites: limits that must hold for every workload Hypothesis can find, not just one.
A failure prints the smallest workload that still breaks the limit, as a plain test to paste.

One engine configuration for the module (block size 32 runs on CPUs and GPUs alike), so it starts once.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmperf import strategies as lst

pytest.importorskip("vllm")
pytestmark = pytest.mark.llmperf_engine(block_size=32, num_gpu_blocks_override=256, enable_prefix_caching=True)


@pytest.mark.max_kv_fragmentation(0.25)
@given(workload=lst.workloads(max_requests=16, prompt_len=lst.lengths(128, 1024), output_len=lst.lengths(1, 128)))
def test_fragmentation_is_bounded_for_any_length_mix(vllm_engine, llmperf, workload):
    """Prompts of at least 4 blocks: each request wastes less than its last block, under 25%."""
    llmperf.run(vllm_engine, workload, warmup=False)


@pytest.mark.max_preemptions(0)
@given(workload=lst.workloads(max_requests=8, prompt_len=lst.lengths(1, 256), output_len=lst.lengths(1, 128)))
def test_no_preemption_below_the_stated_load(vllm_engine, llmperf, workload):
    """At most 8 x 384 tokens (96 blocks of 32, plus one partial block each) fit 255 blocks: nothing is preempted."""
    llmperf.run(vllm_engine, workload, warmup=False)


@pytest.mark.max_p99_ms(ttft=3_000)
@given(workload=lst.workloads(max_requests=16, arrivals="poisson", max_qps=4, prompt_len=lst.lengths(1, 512),
                              output_len=lst.lengths(1, 64)))
def test_ttft_is_bounded_under_any_poisson_load_below_4_qps(vllm_engine, llmperf, workload):
    """Timing limit: a failing example is measured again (--llmperf-retries) before it counts."""
    llmperf.run(vllm_engine, workload, warmup=False)


@pytest.mark.min_prefix_cache_hit_rate(0.5)
@given(workload=lst.workloads(min_requests=4, max_requests=16, shared_prefix=lst.lengths(256, 512),
                              prompt_len=lst.lengths(1, 64), output_len=st.integers(1, 16)))
def test_shared_prompts_hit_the_prefix_cache(vllm_engine, llmperf, workload):
    """n >= 4 requests sharing >= 256 prefix tokens (suffix <= 64): at least 3/4 of them hit 256 of 320."""
    llmperf.run(vllm_engine, workload, warmup=False)
