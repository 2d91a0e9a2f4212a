"""The GPU layer's pure parts: hardware classes and one GPU per pytest-xdist worker (the NVML paths
ran on the H200: docs/gpu-validation.md)."""

import pytest


@pytest.mark.parametrize("worker, visible, count, expected", [
    (None, None, 2, (None, 0)),          # not under xdist: leave the environment alone
    (None, "3", 8, (None, 3)),           # the runner pinned a card
    ("gw0", None, 2, ("0", 0)),
    ("gw1", None, 2, ("1", 1)),
    ("gw1", "4,6", 8, ("6", 6)),         # workers split what the runner made visible
])
def test_each_xdist_worker_takes_its_own_gpu(worker, visible, count, expected):
    from pytest_llmperf.gpu import assign_device

    assert assign_device(worker, visible, count) == expected


def test_more_workers_than_gpus_is_an_error():
    from pytest_llmperf.gpu import GpuError, assign_device

    with pytest.raises(GpuError, match="worker gw2 has no GPU of its own: 2 visible .* -n 2 or fewer"):
        assign_device("gw2", None, 2)


def test_hardware_classes_from_device_names():
    from pytest_llmperf.gpu import classify

    names = {"NVIDIA A100-SXM4-80GB": "a100", "NVIDIA A10G": "a10g", "NVIDIA L4": "l4", "NVIDIA L40S": "l40s",
             "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200", "NVIDIA B200": "b200",
             "AMD Instinct MI300X": "mi300x", "NVIDIA GH200 480GB": "gh200", None: "cpu",
             "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada-generation"}
    assert {n: classify(n) for n in names} == names


class FakeNvml:
    """A stand-in for pynvml (no GPU here) whose memory query starts failing after `good` calls, as a
    card that falls off the bus would: plugin mechanics only."""

    class NVMLError(Exception):
        pass

    def __init__(self, good):
        self.good, self.calls = good, 0
        self.slow_reads = self.energy_reads = 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.slow_reads += 1
        return type("U", (), {"gpu": 50})()

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_reads += 1
        return 1_000 * self.calls

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.calls += 1
        if self.calls > self.good:
            raise self.NVMLError("Unknown Error (GPU is lost)")
        return type("M", (), {"used": 2 << 30, "total": 8 << 30})()


def test_the_sampler_reads_each_figure_only_as_often_as_it_changes(monkeypatch):
    """Mechanics (stand-in NVML): memory every interval, utilisation and power every slow interval, the
    cumulative energy counter only at the two ends, which is all energy per token needs."""
    import sys
    import time

    from pytest_llmperf.gpu import NvmlSampler

    nvml = FakeNvml(good=10**6)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with NvmlSampler(0, interval_s=0.001, slow_interval_s=3600) as sampler:
        deadline = time.monotonic() + 30
        while nvml.calls < 20 and time.monotonic() < deadline:
            time.sleep(0.005)
    samples = sampler.samples
    assert len(samples) == nvml.calls >= 20
    assert (nvml.energy_reads, nvml.slow_reads) == (2, 2)  # the first and the last sample
    assert samples[0].energy_mj is not None and samples[-1].energy_mj is not None
    assert all(s.energy_mj is None and s.power_w is None for s in samples[1:-1])


def test_nvml_failing_mid_run_keeps_the_measured_run_and_warns(monkeypatch, hf_engine):
    import sys

    from pytest_llmperf import Workload
    from pytest_llmperf.runner import LLMPerf

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(good=3))
    perf = LLMPerf(gpu_index=0, gpu_interval_s=0.001)
    with pytest.warns(UserWarning, match="NVML failed during the run: Unknown Error .GPU is lost.; GPU figures cover "
                                         "only the samples before it"):
        r = perf.run(hf_engine, Workload.offline(4, prompt_len=(16, 32), output_len=(8, 16), seed=1), warmup=False)
    assert r.failed == 0 and r.ttft.count == 4  # the measured run stands
    assert r.gpu.memory_peak_gib == pytest.approx(2.0)  # from the samples taken before the failure


def test_the_roofline_reaches_the_result_of_a_sampled_pass(monkeypatch, hf_engine):
    """Plumbing only (stand-in NVML, a made-up bandwidth): the runner attaches the engine's roofline to
    every GPU-sampled pass and the summary turns it into gpu.roofline_fraction."""
    import sys

    from pytest_llmperf import Workload
    from pytest_llmperf.runner import LLMPerf
    from pytest_llmperf.trace import Roofline

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(good=10**6))
    asked = []
    perf = LLMPerf(gpu_index=0, roofline_of=lambda engine: asked.append(engine) or Roofline(10**6, 1024, 1e9))
    r = perf.run(hf_engine, Workload.offline(4, prompt_len=(16, 32), output_len=(8, 16), seed=1), warmup=False)
    assert asked == [hf_engine] and r.gpu.roofline_fraction > 0
    assert LLMPerf().run(hf_engine, Workload.offline(2, 16, 4), warmup=False).gpu.roofline_fraction is None
