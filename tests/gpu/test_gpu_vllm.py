"""The vLLM adapter on a real GPU, where vLLM schedules asynchronously by default: the paging recorder
must ride on vLLM's `AsyncScheduler` (a plain `Scheduler` subclass would switch the overlap off) and the
paging fingerprint must still repeat exactly. Skipped without NVML (CI); run on the H200 through the
device tool (docs/gpu-validation.md)."""

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.gpu import device_count

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs an NVIDIA GPU (NVML); none on this machine")
MIXED = Workload.offline(48, prompt_len=(16, 600), output_len=(8, 200), seed=11)


def fingerprint(r):
    k = r.kv
    return (k.fragmentation_max, k.fragmentation_mean, k.blocks_peak, k.preemptions, [row[3] for row in k.timeline])


@pytest.mark.parametrize("blocks", [4096, 256], ids=["roomy", "tight"])
def test_async_scheduling_keeps_the_recorder_and_an_exact_fingerprint(vllm_engine_factory, llmperf, blocks):
    pytest.importorskip("vllm")
    engine = vllm_engine_factory(gpu_memory_utilization=0.3, enforce_eager=True, num_gpu_blocks_override=blocks)
    cfg = engine.config
    assert cfg["async_scheduling"] is True and cfg["scheduler"] == "AsyncScheduler"
    runs = [llmperf.run(engine, MIXED, warmup=False) for _ in range(3)]
    print(f"{blocks} blocks: {[fingerprint(r)[:4] for r in runs]}, {runs[0].throughput.output_tokens_per_s:.0f} tok/s")
    assert fingerprint(runs[0]) == fingerprint(runs[1]) == fingerprint(runs[2])
    assert (runs[0].kv.preemptions > 0) == (blocks == 256)


def test_roofline_fraction_of_a_decode_dominated_run(vllm_engine_factory, llmperf, llmperf_session):
    """Run with --llmperf-model shape:llama-3.2-1b and shape:llama-3.1-8b for the figures in
    docs/performance.md; the tiny default shape is far from its roofline (kernel launches dominate)."""
    engine = vllm_engine_factory(gpu_memory_utilization=0.5)
    r = llmperf.run(engine, Workload.offline(128, prompt_len=32, output_len=512, seed=3))
    print(f"{engine.model.name}: {r.throughput.output_tokens_per_s:.0f} out tok/s, roofline fraction "
          f"{r.gpu.roofline_fraction}, measured bandwidth {(llmperf_session.bandwidth or 0) / 1e12:.2f} TB/s, "
          f"{r.warmup_passes} warm-up passes (timing noise carried: {r.noise.get('output_tokens_per_s', 0.0):.0%})")
    assert r.warmup == "steady" and r.warmup_passes >= 2  # auto: a GPU engine warms up until steady
    assert r.gpu.roofline_fraction is not None and 0 < r.gpu.roofline_fraction <= 1.0
