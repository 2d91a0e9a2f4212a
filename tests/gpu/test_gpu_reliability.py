"""Faults on a real GPU: out of memory while an engine starts and during a run, a session killed by
SIGTERM, and a soak that must not grow GPU or host memory. Skipped without NVML (CI); run on the H200 through the device tool
(docs/gpu-validation.md)."""

import gc
import json
import signal
import time

import psutil
import pytest
from hanging_session import start, stop, survivors

from pytest_llmperf import Request, Workload
from pytest_llmperf.engines.base import EngineError
from pytest_llmperf.gpu import device_count, memory_used

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs an NVIDIA GPU (NVML); none on this machine")
GIB = 1024**3
MIB = 1024**2
SMALL = Workload.offline(8, prompt_len=(32, 128), output_len=(8, 32), seed=2)


def live_children():
    return [p for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def settle(gpu, above: int, timeout_s: float = 60.0) -> int:
    """NVML's figure once it stops falling (a dead process's memory is freed asynchronously)."""
    deadline = time.monotonic() + timeout_s
    used = memory_used(gpu.index)
    while used > above and time.monotonic() < deadline:
        time.sleep(1)
        used = memory_used(gpu.index)
    return used


def test_vllm_out_of_memory_at_start_is_clear_and_leaves_nothing_behind(vllm_engine_factory, llmperf_session, gpu,
                                                                         llmperf):
    import torch

    llmperf_session.pool.close()  # an earlier test's engine goes first (the pool waits for the card)
    children_before = {p.pid for p in live_children()}
    before = memory_used(gpu.index)
    # another tenant holds most of the card: vLLM cannot take the half it is asked for
    hog = torch.empty(int(0.7 * gpu.memory_total_gib * GIB), dtype=torch.uint8, device="cuda")
    try:
        with pytest.raises(EngineError) as info:
            vllm_engine_factory(gpu_memory_utilization=0.5, enforce_eager=True)
    finally:
        del hog
        gc.collect()
        torch.cuda.empty_cache()
    message = str(info.value)
    print("start-up OOM:", message[:600])
    assert "GiB free of" in message and "gpu_memory_utilization=0.5 asks vLLM for" in message
    leftovers = [p for p in live_children() if p.pid not in children_before]
    assert not leftovers, f"engine processes outlived the failed start: {[p.name() for p in leftovers]}"
    after = settle(gpu, above=before + GIB)
    assert after < before + GIB, f"{(after - before) / GIB:.1f} GiB still held after the failed start"
    # the session goes on: the next engine starts and measures
    r = llmperf.run(vllm_engine_factory(gpu_memory_utilization=0.3, enforce_eager=True), SMALL)
    assert r.failed == 0 and r.n_sequences == 8


def test_sigterm_to_a_session_frees_the_card(pytester, llmperf_session, gpu):
    """`timeout`, `kill` or a cancelled CI job: the engine processes, and the GPU memory they hold, go
    with the session, so the next job on the runner finds the card free."""
    llmperf_session.pool.close()
    before = memory_used(gpu.index)
    proc, pids = start(pytester, json.dumps({"gpu_memory_utilization": 0.3, "enforce_eager": True}))
    held = memory_used(gpu.index)
    out = stop(proc, signal.SIGTERM)
    alive = survivors(pids)
    after = settle(gpu, above=before + GIB)
    print(f"SIGTERM: exit {proc.returncode}; {(held - before) / GIB:.1f} GiB held by the engine, "
          f"{(after - before) / GIB:.2f} GiB left after; engine processes alive: {alive}")
    assert held - before > 0.25 * gpu.memory_total_gib * GIB  # the engine had its share of the card
    assert proc.returncode == 143 and "terminated by SIGTERM; engines stopped" in out
    assert not alive, f"engine processes outlived the session: {alive}"
    assert after < before + GIB, f"{(after - before) / GIB:.1f} GiB still held after SIGTERM"


@pytest.mark.max_error_rate(1.0)  # the huge batch fails on purpose; the test judges what follows
def test_out_of_memory_during_a_run_fails_that_batch_and_the_run_goes_on(hf_engine_factory, gpu, llmperf):
    import torch

    # eager attention materialises batch x heads x prompt^2 scores: 512 rows of 4000 tokens cannot fit
    engine = hf_engine_factory(max_batch_size=512, attn_implementation="eager")
    huge = Workload(tuple(Request(64, 4) for _ in range(8)) + tuple(Request(4000, 2) for _ in range(512)), seed=3)
    r = llmperf.run(engine, huge, warmup=False)
    failed = [e for e in r.errors if "out of GPU memory" in e]
    print(f"OOM mid-run: {r.failed} of {r.n_sequences} failed; first: {failed[0][:300] if failed else None}")
    assert r.failed == 512 and r.n_sequences == 520 and "lower max_batch_size" in failed[0]
    assert r.ttft.count == 8  # the batch after the one that ran out of memory was served
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() < 4 * GIB  # the failed batch's tensors were released
    again = llmperf.run(engine, SMALL, warmup=False)
    assert again.failed == 0


def test_three_rounds_do_not_grow_gpu_or_host_memory(vllm_engine_factory, hf_engine_factory, gpu, llmperf):
    """A soak: the same workloads three times through vLLM and transformers, engines swapped every time
    (the pool starts each afresh); measured at the same point of each round."""
    w = Workload.offline(64, prompt_len=(32, 512), output_len=(16, 128), seed=5)
    gpu_used, host = [], []
    for _ in range(3):
        llmperf.run(vllm_engine_factory(gpu_memory_utilization=0.3, enforce_eager=True), w, warmup=False)
        llmperf.run(hf_engine_factory(max_batch_size=16), w, warmup=False)
        gc.collect()
        gpu_used.append(memory_used(gpu.index))
        host.append(sum(p.memory_info().rss for p in [psutil.Process(), *live_children()]))
    print("soak GPU used after each round (MiB):", [round(x / MIB) for x in gpu_used],
          "host RSS (MiB):", [round(x / MIB) for x in host])
    assert gpu_used[2] - gpu_used[1] < 512 * MIB and gpu_used[2] - gpu_used[0] < 1024 * MIB
    assert host[2] - host[1] < 512 * MIB
