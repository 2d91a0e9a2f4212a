"""Does NVML sampling slow the engine down? Same engine, same workload, sampler on and off in
interleaved pairs; reports the median throughput ratio (on / off). Needs a GPU.

    python benchmarks/nvml_overhead.py --engine hf --pairs 5
    python benchmarks/nvml_overhead.py --engine vllm --config '{"enforce_eager": true}'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from _emit import emit

from pytest_llmperf import Workload
from pytest_llmperf.engines.base import EnginePool
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import LLMPerf


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--model", default="shape:tiny-llama")
    ap.add_argument("--config", default="{}")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.01)
    args = ap.parse_args()
    gpu = detect()
    if gpu is None:
        print("no GPU (NVML): nothing to measure", file=sys.stderr)
        return 2
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
           "pass_s": round(last.duration_s, 3)}
    emit("nvml_overhead", row)
    pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
