"""Capacity curves: throughput against concurrency, the best-balance point, vLLM against transformers
on the same sweep, and throughput per GiB where a GPU is present. With --llmperf-report each sweep
also gets its throughput-latency picture with the Pareto points marked."""

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.gpu import device_count

pytest.importorskip("vllm")
LEVELS = [1, 2, 4, 8, 16, 32, 64]


def chat(concurrency: float) -> Workload:
    c = int(concurrency)
    return Workload.closed_loop(concurrency=c, n=4 * c, prompt_len=(64, 256), output_len=(32, 64), seed=31)


@pytest.mark.llmperf_engine(num_gpu_blocks_override=512)
@pytest.mark.min_capacity(concurrency=16, under={"p99_tpot_ms": 200, "p99_ttft_ms": 5_000})
def test_concurrency_sweep_with_memory_per_concurrency(vllm_engine, llmperf):
    """Concurrency 1 -> 64: throughput must rise until the engine saturates; KV blocks per request
    stay flat (paging allocates per token, not per reserved maximum)."""
    sweep = llmperf.sweep(vllm_engine, chat, concurrency=LEVELS, under={"p99_tpot_ms": 200, "p99_ttft_ms": 5_000})
    first, last = sweep.points[0].result, sweep.points[-1].result
    assert last.throughput.output_tokens_per_s > 2 * first.throughput.output_tokens_per_s
    per_request = [p.result.kv.blocks_peak / p.value for p in sweep.points if p.value >= 4]
    print("KV blocks per concurrent request:", [round(x, 1) for x in per_request])
    print("best balance at concurrency", sweep.best_balance().value, "; Pareto points", [p.value for p in sweep.pareto()])
    assert max(per_request) < 2 * min(per_request)


@pytest.mark.llmperf_engine(num_gpu_blocks_override=512)  # runs next to the sweep above: one vLLM start for both
def test_vllm_and_transformers_on_the_same_sweep(vllm_engine, hf_engine_factory, llmperf):
    """The seed comparison: continuous batching with paging against static batching, same workloads."""
    levels = [1, 4, 16]
    vllm = llmperf.sweep(vllm_engine, chat, concurrency=levels, label="vllm")  # before the pool swaps it for hf
    hf = llmperf.sweep(hf_engine_factory(max_batch_size=16), chat, concurrency=levels, label="hf")
    for a, b in zip(hf.points, vllm.points):
        print(f"concurrency {a.value:g}: hf {a.result.throughput.output_tokens_per_s:.0f} tok/s, "
              f"vllm {b.result.throughput.output_tokens_per_s:.0f} tok/s")
    assert vllm.points[-1].result.throughput.output_tokens_per_s > hf.points[-1].result.throughput.output_tokens_per_s


@pytest.mark.skipif(device_count() == 0, reason="throughput per GiB needs a GPU (NVML)")
@pytest.mark.min_throughput_per_gib(tokens_per_s=1.0)
def test_throughput_per_gib_of_gpu_memory(vllm_engine_factory, llmperf):
    engine = vllm_engine_factory(gpu_memory_utilization=0.3)
    llmperf.sweep(engine, chat, concurrency=[4, 16, 64], label="per-gib")
