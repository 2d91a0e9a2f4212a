"""Does NVML sampling slow the engine down? Same engine, same workload, sampler on and off in
interleaved pairs; reports the median throughput ratio (on / off). Needs a GPU.

    python benchmarks/nvml_overhead.py --engine hf --pairs 5
    python benchmarks/nvml_overhead.py --engine vllm --config '{"enforce_eager": true}'
    python benchmarks/nvml_overhead.py --calls-only   # what each NVML query costs, idle and busy GPU

Every run first times each query the sampler makes (200 calls each, GPU idle, then with the GPU kept
busy by matrix products in a second thread): median and p99 in microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from _emit import emit

from pytest_llmperf import Workload
from pytest_llmperf.engines.base import EnginePool
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import LLMPerf

QUERIES = {
    "memory": "nvmlDeviceGetMemoryInfo",
    "utilization": "nvmlDeviceGetUtilizationRates",
    "power": "nvmlDeviceGetPowerUsage",
    "energy": "nvmlDeviceGetTotalEnergyConsumption",
}


def call_latencies(index: int, calls: int = 200) -> dict:
    """Median and p99 (us) of each NVML query the sampler makes."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        out = {}
        for name, fn in QUERIES.items():
            query = getattr(pynvml, fn)
            times = []
            for _ in range(calls):
                t = time.perf_counter()
                query(h)
                times.append((time.perf_counter() - t) * 1e6)
            times.sort()
            out[name] = {"median_us": round(times[len(times) // 2], 1), "p99_us": round(times[int(len(times) * 0.99)], 1)}
        return out
    finally:
        pynvml.nvmlShutdown()


def busy_gpu(stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def latencies_idle_and_busy(index: int) -> dict:
    idle = call_latencies(index)
    stop = threading.Event()
    worker = threading.Thread(target=busy_gpu, args=(stop,), daemon=True)
    worker.start()
    time.sleep(2.0)  # the first products compile and warm up
    try:
        busy = call_latencies(index)
    finally:
        stop.set()
        worker.join()
    return {"idle": idle, "busy": busy}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--model", default="shape:tiny-llama")
    ap.add_argument("--config", default="{}")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.01)
    ap.add_argument("--calls-only", action="store_true", help="only time the NVML queries")
    args = ap.parse_args()
    gpu = detect()
    if gpu is None:
        print("no GPU (NVML): nothing to measure", file=sys.stderr)
        return 2
    calls = latencies_idle_and_busy(gpu.index)
    print("NVML query latency: " + json.dumps(calls), flush=True)
    if args.calls_only:
        emit("nvml_calls", {"gpu": gpu.name, "driver": gpu.driver, **calls})
        return 0
    pool = EnginePool()
    engine = pool.get(args.engine, resolve_model(args.model), json.loads(args.config))
    workload = Workload.offline(args.requests, prompt_len=(64, 512), output_len=(64, 128), seed=1)
    on, off = LLMPerf(gpu_index=gpu.index, gpu_interval_s=args.interval), LLMPerf()
    off.run(engine, workload)  # warm-up pass, not counted
    ratios = []
    for i in range(args.pairs):
        pair = (on, off) if i % 2 == 0 else (off, on)  # alternate the order: drift cancels out
        thr = {id(p): p.run(engine, workload, warmup=False).throughput.output_tokens_per_s for p in pair}
        ratios.append(thr[id(on)] / thr[id(off)])
        print(f"pair {i}: sampler on {thr[id(on)]:.0f} tok/s, off {thr[id(off)]:.0f} tok/s, ratio {ratios[-1]:.4f}")
    last = on.results[-1]
    row = {"engine": args.engine, "version": engine.version, "model": args.model, "gpu": gpu.name,
           "interval_s": args.interval, "pairs": args.pairs, "requests": args.requests,
           "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
           "pass_s": round(last.duration_s, 3), "query_latency": calls}
    emit("nvml_overhead", row)
    pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
