"""The GPU layer on a real GPU: NVML figures, GPU markers, handing the card back between engines,
hardware selection, one GPU per xdist worker. Skipped without NVML (CI); run on the H200 through the
device tool (docs/gpu-validation.md)."""

import json
import os

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.gpu import KNOWN_CLASSES, device_count, memory_used

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs an NVIDIA GPU (NVML); none on this machine")
GIB = 1024**3


def test_gpu_fixture_describes_the_card(gpu):
    assert gpu is not None and gpu.name and gpu.hardware_class in KNOWN_CLASSES
    assert gpu.memory_total_gib > 8 and gpu.driver and gpu.cuda.count(".") == 1
    assert gpu.compute_capability[0].isdigit()


@pytest.mark.max_gpu_memory(fraction=0.99)
@pytest.mark.max_energy_per_token(joules=100)
@pytest.mark.max_memory_per_request(mib=64 * 1024)
def test_nvml_figures_on_transformers(hf_engine, llmperf):
    r = llmperf.run(hf_engine, Workload.offline(16, prompt_len=(64, 256), output_len=(64, 128), seed=1))
    g = r.gpu
    assert 0 < g.memory_idle_gib <= g.memory_peak_gib < g.memory_total_gib
    assert g.framework_peak_gib > 0 and g.energy_per_token_j > 0 and g.memory_per_request_mib >= 0
    assert g.utilization_mean_pct is not None and g.power_mean_w > 0
    # one GPU: the per-GPU figures and the sums over the engine's GPUs are the card's own
    assert g.devices == 1 and g.memory_peak_per_gpu_gib == (g.memory_peak_gib,) == (g.memory_peak_all_gib,)
    assert g.utilization_per_gpu_pct == (g.utilization_mean_pct,)
    print(f"NVML hf: peak {g.memory_peak_gib:.2f} GiB (idle {g.memory_idle_gib:.2f}), torch peak "
          f"{g.framework_peak_gib:.2f} GiB, {g.energy_per_token_j:.4f} J/token, {g.memory_per_request_mib:.1f} "
          f"MiB/request, util {g.utilization_mean_pct:.0f}%, {g.power_mean_w:.0f} W")


def test_a_vllm_engine_hands_the_card_back_before_the_next_starts(vllm_engine_factory, hf_engine_factory, gpu, llmperf):
    before = memory_used(gpu.index)
    engine = vllm_engine_factory(gpu_memory_utilization=0.3, enforce_eager=True)
    r = llmperf.run(engine, Workload.offline(8, prompt_len=64, output_len=16))
    held = memory_used(gpu.index)
    assert held > before + 20 * GIB  # vLLM reserved 30% of the card
    assert r.gpu.memory_peak_gib > 20 and r.gpu.memory_peak_fraction > 0.2
    hf_engine_factory()  # a different engine: the pool shuts vLLM down and waits for NVML to show it freed
    after = memory_used(gpu.index)
    print(f"NVML release: before {before / GIB:.2f} GiB, vLLM held {held / GIB:.2f} GiB, after {after / GIB:.2f} GiB")
    assert after < before + 3 * GIB


def test_hardware_markers_select_and_skip_with_a_reason(pytester, gpu):
    other = "a100" if gpu.hardware_class != "a100" else "h100"
    pytester.makepyfile(f"""
import pytest

@pytest.mark.{gpu.hardware_class}
def test_here():
    pass

@pytest.mark.{other}
def test_elsewhere():
    pass
""")
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert f"needs {other} hardware; this machine is {gpu.hardware_class} ({gpu.name})" in result.stdout.str()
    selected = pytester.runpytest_inprocess(f"-m={gpu.hardware_class}")
    selected.assert_outcomes(passed=1, deselected=1)


WORKER = """
import json, os
import pytest

@pytest.mark.parametrize("i", range(8))
def test_where(gpu, worker_id, i):
    with open(f"{worker_id}.json", "w") as f:
        json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "index": gpu.index}, f)
"""


@pytest.mark.skipif(device_count() < 2, reason="needs two GPUs")
def test_each_xdist_worker_takes_its_own_gpu(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_w=WORKER)
    env_before = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=8)
        seen = [json.loads(p.read_text()) for p in sorted(pytester.path.glob("gw*.json"))]
        assert sorted(s["visible"] for s in seen) == ["0", "1"] and sorted(s["index"] for s in seen) == [0, 1]
        too_many = pytester.runpytest_subprocess("-n", str(device_count() + 1), "-p", "no:cacheprovider")
        assert "needs 1 GPU of its own and has 0" in too_many.stdout.str() + too_many.stderr.str()
    finally:
        if env_before is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = env_before


@pytest.mark.skipif(device_count() < 2, reason="needs two GPUs")
@pytest.mark.llmperf_engine(gpu_memory_utilization=0.3, max_model_len=2048, disable_custom_all_reduce=True)
def test_tensor_parallel_2_beside_1_is_measured_on_every_gpu_it_uses(vllm_engine_factory, llmperf):
    """TP=1 and TP=2 of the same shape on one workload: the TP=2 engine's memory on each of its cards,
    its energy per token over both (pure NCCL: no custom all-reduce; NCCL_NVLS_ENABLE=0 in the run)."""
    w = Workload.offline(128, prompt_len=(64, 512), output_len=(64, 256), seed=3)
    one = llmperf.run(vllm_engine_factory(), w, label="tp1")
    two = llmperf.run(vllm_engine_factory(tensor_parallel_size=2), w, label="tp2")
    assert one.gpu.devices == 1 and two.gpu.devices == 2
    assert all(m > 10 for m in two.gpu.memory_peak_per_gpu_gib)  # vLLM reserved 30% of each card
    assert two.gpu.memory_peak_all_gib > 1.5 * two.gpu.memory_peak_gib
    assert two.gpu.energy_per_token_j > 0 and len(two.gpu.utilization_per_gpu_pct) == 2
    for r in (one, two):
        g = r.gpu
        print(f"{r.label}: {r.throughput.output_tokens_per_s:.0f} out tok/s, TTFT p50 {r.ttft.p50:.1f} ms, TPOT p50 "
              f"{r.tpot.p50:.2f} ms, memory per GPU {', '.join(f'{m:.1f}' for m in g.memory_peak_per_gpu_gib)} GiB "
              f"(all {g.memory_peak_all_gib:.1f}), {g.energy_per_token_j:.4f} J/token, util per GPU "
              f"{', '.join(f'{u:.0f}%' for u in g.utilization_per_gpu_pct if u is not None)}")
