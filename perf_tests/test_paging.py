"""vLLM's KV-cache paging: fragmentation, preemption, prefix caching, paged vs contiguous waste.

Paging metrics are deterministic for an offline workload with a fixed KV budget
(num_gpu_blocks_override), so these limits are exact on any hardware, a CPU included. They depend on the
KV budget, block size and scheduler limits, not on the model's size or on CUDA graphs (the tiny shape
in eager mode pages step for step as the Llama-3.1-8B shape with CUDA graphs does: docs/performance.md),
so this module runs on the tiny shape without compilation, whatever --llmperf-model says: its engines
start in seconds, after the session's model, and on a GPU side by side (--llmperf-side-by-side). The
timing of so small a model without CUDA graphs measures the host's Python more than the GPU (unchanged
H200 runs moved its medians by 0.6-2x), so the baselines gate paging (exactly) and memory here, and report
timing; the latency tests gate timing on the session's model.
"""

import pytest

from pytest_llmperf import Workload

pytest.importorskip("vllm")

EAGER = {"enforce_eager": True}  # no compilation, no CUDA-graph capture: paging does not change
pytestmark = [pytest.mark.llmperf_model("shape:tiny-llama"), pytest.mark.llmperf_engine(**EAGER),
              pytest.mark.llmperf_gate("paging", "memory")]

BUDGET = 512  # blocks; fixed so the paging fingerprint does not depend on the machine's memory
VARIABLE = Workload.offline(48, prompt_len=(8, 600), output_len=(8, 300), seed=21)


@pytest.mark.max_kv_fragmentation(0.25)
@pytest.mark.max_kv_fragmentation(0.15, stat="mean")
@pytest.mark.max_preemptions(0)
def test_fragmentation_under_variable_lengths(vllm_engine, llmperf, block_size):
    """Internal fragmentation is bounded by the last, partly filled block of each request. Each block size's
    engine has 32k token slots (conftest.py): the whole batch fits, so fragmentation is measured without
    preemption."""
    llmperf.run(vllm_engine, VARIABLE, label=f"block{block_size}")


@pytest.mark.llmperf_engine(block_size=32, num_gpu_blocks_override=48, max_model_len=1024)
def test_preemption_under_a_tight_budget(vllm_engine, llmperf):
    """48 blocks cannot hold 32 long requests at once: vLLM preempts, and the count is reproducible."""
    w = Workload.offline(32, prompt_len=(64, 256), output_len=(128, 256), seed=22)
    first = llmperf.run(vllm_engine, w)
    again = llmperf.run(vllm_engine, w, warmup=False)
    assert first.kv.preemptions > 0
    assert again.kv.preemptions == first.kv.preemptions and again.kv.blocks_peak == first.kv.blocks_peak


@pytest.mark.llmperf_engine(enable_prefix_caching=True, num_gpu_blocks_override=BUDGET)
@pytest.mark.min_prefix_cache_hit_rate(0.8)
def test_prefix_caching_with_shared_system_prompts(vllm_engine, llmperf):
    """Four system prompts of 1k tokens shared by 64 requests: almost every prompt token is a hit."""
    w = Workload.shared_prefix(64, prefix_len=1024, suffix_len=(16, 64), output_len=16, groups=4, seed=23)
    llmperf.run(vllm_engine, w)


@pytest.mark.llmperf_engine(enable_prefix_caching=True, num_gpu_blocks_override=BUDGET)
def test_paged_kv_wastes_far_less_than_a_contiguous_cache(vllm_engine, hf_engine_factory, llmperf):
    """The seed comparison: the same workload through vLLM's paged cache and transformers' contiguous
    (padded, static-batch) cache; vLLM must waste at least 5x less of what it reserves. On a GPU it runs
    after the other tests (transformers keeps its CUDA context in the test process); vLLM first."""
    w = Workload.offline(32, prompt_len=(16, 480), output_len=(8, 256), seed=24)
    paged = llmperf.run(vllm_engine, w, label="vllm")
    contiguous = llmperf.run(hf_engine_factory(max_batch_size=8), w, label="hf")
    waste_hf, waste_vllm = contiguous.kv.fragmentation_mean, paged.kv.fragmentation_mean
    print(f"KV waste (slot-weighted): hf {waste_hf:.3f}, vllm {waste_vllm:.3f}, ratio {waste_hf / waste_vllm:.1f}x")
    assert waste_hf >= 5 * waste_vllm
