"""How well does the baseline gate separate noise from regressions?

Records a baseline from one run of an unchanged configuration, then compares N more runs of the same
configuration (every regression verdict there is a false alarm) and N runs of each injected regression
(every regression verdict is a catch): max_num_seqs halved, a smaller KV budget, and an added per-step
delay of 5% and 10% of the measured mean step time (a scheduler subclass that sleeps in `schedule()`).
The default repeats (1) and tolerance (10%) unless given.

    python benchmarks/detection_power.py --runs 10 [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pytest_llmperf import Workload
from pytest_llmperf import baseline as bl
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.gating import result_entry
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import LLMPerf

SLOW = "slow_scheduler.SlowRecorder"
BASE = {"num_gpu_blocks_override": 512, "max_num_seqs": 64}


def measure(engine, perf, workload, repeats):
    return result_entry(perf.run(engine, workload, repeats=repeats, warmup=False), workload, 0)


def verdicts(config, env, model, workload, runs, repeats, stored):
    for key, value in env.items():
        os.environ[key] = value
    engine = VLLMEngine(model, config)
    perf = LLMPerf()
    perf.run(engine, workload)  # warm-up
    out = []
    for _ in range(runs):
        v = bl.compare(stored, [measure(engine, perf, workload, repeats)])
        out.append(sorted({r.metric for r in v.regressions}))
    engine.shutdown()
    for key in env:
        os.environ.pop(key, None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--requests", type=int, default=64)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))  # slow_scheduler, for the engine-core process too
    os.environ["PYTHONPATH"] = f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    model = resolve_model("shape:tiny-llama")
    workload = Workload.offline(args.requests, prompt_len=(16, 512), output_len=(16, 256), seed=7)

    engine = VLLMEngine(model, BASE)
    perf = LLMPerf()
    perf.run(engine, workload)
    recorded = perf.run(engine, workload, repeats=args.repeats, warmup=False)
    stored = bl.document("bench", "cpu", "tiny", {}, [result_entry(recorded, workload, 0)])
    step_s = recorded.duration_s / max(len(recorded.kv.timeline), 1) / args.repeats
    engine.shutdown()
    print(f"baseline: {recorded.throughput.output_tokens_per_s:.0f} tok/s, p99 TTFT {recorded.ttft.p99:.1f} ms, "
          f"mean step {step_s * 1e3:.2f} ms", flush=True)

    cases = {
        "unchanged": (BASE, {}),
        "max_num_seqs halved": ({**BASE, "max_num_seqs": 32}, {}),
        "KV budget 512 -> 160 blocks": ({**BASE, "num_gpu_blocks_override": 160}, {}),
        "+5% per-step delay": ({**BASE, "scheduler_cls": SLOW}, {"LLMPERF_BENCH_STEP_DELAY_S": str(0.05 * step_s)}),
        "+10% per-step delay": ({**BASE, "scheduler_cls": SLOW}, {"LLMPERF_BENCH_STEP_DELAY_S": str(0.10 * step_s)}),
    }
    table = {}
    for name, (config, env) in cases.items():
        flagged = verdicts(config, env, model, workload, args.runs, args.repeats, stored)
        table[name] = {
            "runs": len(flagged),
            "any_regression": sum(bool(f) for f in flagged),
            "throughput": sum("output_tokens_per_s" in f for f in flagged),
            "ttft_p99": sum("p99_ttft_ms" in f for f in flagged),
            "paging": sum(any(m.startswith("kv_") for m in f) for f in flagged),
        }
        print(name, table[name], flush=True)
    row = {"repeats": args.repeats, "runs": args.runs, "requests": args.requests, "mean_step_ms": step_s * 1e3,
           "cases": table}
    print(json.dumps(row))
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "detection_power.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
