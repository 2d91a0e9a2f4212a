"""The GPU layer's pure parts: hardware classes and one GPU per pytest-xdist worker (the NVML paths
ran on the H200: docs/gpu-validation.md)."""

import os
import time

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


def test_more_workers_than_gpus_is_an_error(monkeypatch):
    from pytest_llmperf.gpu import GpuError, assign_device

    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")  # -n 3 on two cards
    with pytest.raises(GpuError, match="worker gw2 needs 1 GPU of its own and has 0: 2 visible .* -n 2 or fewer"):
        assign_device("gw2", None, 2)
    # -n 2: pytest-xdist names the worker it starts for one that crashed gw2, past the count
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    with pytest.raises(GpuError, match="it replaces a worker that crashed .* the other workers' go on"):
        assign_device("gw2", None, 2)


def test_cards_named_by_uuid_are_sampled_by_their_own_nvml_index():
    """`CUDA_VISIBLE_DEVICES=GPU-...`: each card's place in the list was taken for its NVML index, so memory
    and energy were read from another card. NVML's answer is given here (no GPU in CI)."""
    from pytest_llmperf.gpu import GpuError, assign_devices

    index = {"GPU-aaaa": 4, "GPU-bbbb": 6}.__getitem__
    assert assign_devices("gw1", "GPU-aaaa,GPU-bbbb", 8, index_of=index) == ("GPU-bbbb", (6,))
    assert assign_devices(None, "GPU-bbbb", 8, index_of=index) == (None, (6,))
    with pytest.raises(GpuError, match="names 'MIG-1', which NVML cannot map .* name the cards by index"):
        assign_devices(None, "MIG-1", 8)  # the real lookup: no NVML card by that name here either


@pytest.mark.parametrize("worker, visible, count, per_worker, expected", [
    (None, None, 4, 2, (None, (0, 1))),          # one session: the engine's first two cards
    ("gw0", None, 4, 2, ("0,1", (0, 1))),
    ("gw1", None, 4, 2, ("2,3", (2, 3))),        # disjoint sets, sized by what the tests ask for
    ("gw1", "1,3,5,7", 8, 2, ("5,7", (5, 7))),
])
def test_workers_of_multi_gpu_engines_take_disjoint_sets_of_gpus(worker, visible, count, per_worker, expected):
    from pytest_llmperf.gpu import assign_devices

    assert assign_devices(worker, visible, count, per_worker) == expected


@pytest.mark.parametrize("worker, count, match", [
    ("gw1", 3, "worker gw1 needs 2 GPUs of its own and has 1: 3 visible .*; run with -n 1 or fewer"),
    (None, 1, "this session needs 2 GPUs of its own and has 1: 1 visible .*; make 2 GPUs visible, or lower "
              "tensor_parallel_size x pipeline_parallel_size"),
])
def test_too_few_gpus_for_a_multi_gpu_engine_is_an_error_that_says_what_to_do(worker, count, match):
    from pytest_llmperf.gpu import GpuError, assign_devices

    with pytest.raises(GpuError, match=match):
        assign_devices(worker, None, count, 2)


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

    def __init__(self, good, processes=None):
        self.good, self.calls = good, 0
        self.slow_reads = self.energy_reads = 0
        self.processes = processes or {}  # device -> {pid: bytes NVML charges it}

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [type("P", (), {"pid": pid, "usedGpuMemory": used})() for pid, used in self.processes.get(handle, {}).items()]

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
        return type("M", (), {"used": (2 + handle) << 30, "total": 8 << 30})()  # card k holds 2 + k GiB


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


def test_the_sampler_reads_every_gpu_of_a_tensor_parallel_engine_at_each_tick(monkeypatch):
    """Mechanics (stand-in NVML): one sample per device per tick, with the tick's time, so that the
    engine's memory can be summed at one instant."""
    import sys
    import time

    from pytest_llmperf.gpu import NvmlSampler

    nvml = FakeNvml(good=10**6)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with NvmlSampler((2, 3), interval_s=0.001, slow_interval_s=3600) as sampler:
        deadline = time.monotonic() + 30
        while nvml.calls < 20 and time.monotonic() < deadline:
            time.sleep(0.005)
    samples = sampler.samples
    assert [s.device for s in samples[:4]] == [2, 3, 2, 3]
    assert all(a.t == b.t for a, b in zip(samples[::2], samples[1::2]))
    assert {s.device: s.memory_used_bytes >> 30 for s in samples} == {2: 4, 3: 5}
    assert nvml.energy_reads == 4  # each card's counter at the two ends


def test_gpu_figures_of_an_engine_on_two_gpus_are_per_gpu_and_summed():
    """Made-up samples of two cards (named as such): memory per card and at once over both, energy and
    power over both, memory per request from the sum, utilisation per card."""
    from pytest_llmperf.metrics import gpu_stats
    from pytest_llmperf.trace import Chunk, GpuSample, RunTrace, SequenceTrace

    gib = 1 << 30
    samples = (GpuSample(0.0, 10 * gib, 10.0, 100.0, 1_000, 80 * gib, device=0),
               GpuSample(0.0, 10 * gib, 30.0, 200.0, 5_000, 80 * gib, device=1),
               GpuSample(1.0, 14 * gib, None, None, None, 80 * gib, device=0),
               GpuSample(1.0, 16 * gib, None, None, None, 80 * gib, device=1),
               GpuSample(2.0, 15 * gib, 50.0, 300.0, 3_000, 80 * gib, device=0),
               GpuSample(2.0, 12 * gib, 70.0, 400.0, 9_000, 80 * gib, device=1))
    seqs = tuple(SequenceTrace(i, 0, 16, 10, 0.0, (Chunk(1.0, 10),)) for i in range(2))
    g = gpu_stats(RunTrace("made-up", seqs, 0.0, 2.0, gpu=samples), output_tokens=20)
    assert g.devices == 2 and g.memory_peak_per_gpu_gib == (15.0, 16.0)
    assert g.memory_peak_gib == 16.0  # the busiest card: the one that runs out first
    assert g.memory_peak_all_gib == 30.0  # 14 + 16 at t=1, not 15 + 16 (never at once)
    assert g.memory_per_request_mib == pytest.approx((30 - 20) * 1024 / 2)
    assert g.energy_per_token_j == pytest.approx((2_000 + 4_000) / 1e3 / 20)
    assert g.power_mean_w == pytest.approx(200 + 300)
    assert g.utilization_per_gpu_pct == (30.0, 50.0) and g.utilization_mean_pct == 40.0
    assert g.timeline == ((0.0, 20.0), (1.0, 30.0), (2.0, 27.0))


def test_an_engine_spread_over_more_gpus_than_the_worker_has_fails_with_what_to_do(monkeypatch):
    """Plumbing (a FAKE engine asking for tensor_parallel_size=2, stand-in NVML)."""
    import sys

    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.gpu import GpuError
    from pytest_llmperf.runner import LLMPerf

    class TwoGpuFake(FakeWarmingEngine):
        @property
        def config(self):
            return {"tensor_parallel_size": 2}

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(good=10**6))
    with pytest.raises(GpuError, match="spreads over 2 GPUs and this worker has 1 .0.: run with --llmperf-gpus-per-worker=2"):
        LLMPerf(gpu_index=0).run(TwoGpuFake([0.05]), WORKLOAD, warmup=False)
    r = LLMPerf(gpu_index=0, gpu_indices=(0, 1), gpu_interval_s=0.001).run(TwoGpuFake([0.05]), WORKLOAD, warmup=False)
    assert r.gpu.devices == 2 and r.gpu.memory_peak_per_gpu_gib == (2.0, 3.0)


def test_the_bandwidth_probe_runs_beside_the_first_engines_imports_and_ends_before_it_starts(monkeypatch):
    """Mechanics (a stand-in probe process that sleeps, and a FAKE engine): the probe runs while the
    first engine's modules are imported, has ended before that engine starts, and runs once a session."""
    import subprocess
    import sys

    from fake_engine import FakeProbedEngine

    from pytest_llmperf import session as sess
    from pytest_llmperf.engines.base import EnginePool
    from pytest_llmperf.gpu import GpuInfo

    def probe(index):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1); print(2e12)"], stdout=subprocess.PIPE,
                             text=True)
        FakeProbedEngine.probes.append(p)
        return p

    monkeypatch.setattr(sess, "start_bandwidth_probe", probe)
    monkeypatch.setattr(FakeProbedEngine, "probes", [])
    monkeypatch.setattr(FakeProbedEngine, "log", [])
    engines = {"fake": "fake_engine:FakeProbedEngine"}
    state = sess.Session(engine_name="fake", model_spec="shape:tiny-llama", engine_defaults={}, hardware="h200",
                         gpu=GpuInfo(0, "NVIDIA H200", "h200", 139.8, "-", "-", "9.0"), gate=None, engines=engines,
                         pool=EnginePool(engines=engines))
    state.engine("fake", {"id": 1})
    state.engine("fake", {"id": 2})
    assert FakeProbedEngine.log == [("preload", [True]), ("start", [False]), ("start", [False])]
    assert state.bandwidth == 2e12
    assert state.pool.times.seconds["bandwidth probe"] > 0 and state.pool.starts == 2


def test_a_reading_beside_idle_engines_is_the_card_less_what_nvml_charges_them_per_device():
    from pytest_llmperf.runner import own_memory
    from pytest_llmperf.trace import GpuSample

    samples = (GpuSample(0.0, 5_000, device=0), GpuSample(0.0, 900, device=1), GpuSample(0.1, 6_000, device=0))
    assert [s.memory_used_bytes for s in own_memory(samples, {0: 3_000})] == [2_000, 900, 3_000]


def test_nvml_charges_neighbours_their_own_processes_memory_and_a_group_it_cannot_see_is_refused(monkeypatch):
    """Engines side by side are measured apart only where NVML names their processes: in a container
    without the host's process ids it lists other ids, and the group must not be measured."""
    import sys

    from pytest_llmperf.gpu import GpuInfo, beside_checker, memory_held_by

    nvml = FakeNvml(good=10**6, processes={0: {11: 3 << 30, 12: 1 << 30, 99: 5 << 30}, 1: {12: 2 << 30}})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert memory_held_by([0, 1], frozenset({11, 12})) == {0: 4 << 30, 1: 2 << 30}
    gpus = [GpuInfo(0, "NVIDIA H100", "h100", 79.6, "-", "-", "9.0")]
    check = beside_checker(gpus)
    assert check([frozenset({11}), frozenset({12, 13})]) is None
    assert "NVML charges no memory to the engine processes [7]" in check([frozenset({11}), frozenset({7})])
    assert "names no process" in check([frozenset({11}), frozenset()])
    assert beside_checker([]) is None  # no GPU: nothing to tell apart


def test_an_engines_processes_are_its_core_and_every_process_below_it():
    import subprocess
    import sys

    from pytest_llmperf.engines.base import descendants

    # a child that starts a grandchild: both are below this process, and the grandchild below the child
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while len(below := descendants(child.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(below) == 1 and {child.pid, *below} <= descendants(os.getpid())
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()


def test_a_process_that_is_gone_is_no_neighbour_holding_memory():
    from pytest_llmperf.gpu import process_exists

    assert process_exists(os.getpid()) and not process_exists(2**22 + 12345)  # above Linux's largest pid


def test_a_card_nvml_cannot_name_leaves_a_session_that_claims_nothing_alone(monkeypatch):
    """The hardware class is read in every session's configure: a MIG slice in CUDA_VISIBLE_DEVICES made pytest
    fail at start, in projects that never use the plugin."""
    from pytest_llmperf import gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(gpu, "detect", lambda index: None if index else gpu.GpuInfo(
        0, "NVIDIA H100 80GB HBM3", "h100", 80.0, "", "", "9.0"))
    assert gpu.machine_class() == "h100"
