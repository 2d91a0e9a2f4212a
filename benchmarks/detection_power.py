"""How well does the baseline gate separate noise from regressions?

Records a baseline from one run of an unchanged configuration, then compares N more runs of the same
configuration (every regression verdict there is a false alarm) and N runs of each injected regression
(every regression verdict is a catch): max_num_seqs halved, a smaller KV budget, and an added per-step
delay of a share of the measured mean step time (a scheduler that sleeps in `schedule()`). Every run
is judged at each tolerance given (the default, 10%, unless given), with the default repeats (1)
unless given.

    python benchmarks/detection_power.py --runs 10 [--repeats 1] [--tolerances 0.05,0.10] [--delays 0.05,0.10,0.20]
        [--model shape:tiny-llama] [--config JSON]   (engine options added to every case, e.g. enforce_eager)
        [--warmup auto|quick|steady]   (each engine's warm-up before its runs; auto: steady on a GPU)
        [--cases unchanged,delay]   (only the cases whose name contains one of these)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from _emit import emit

from pytest_llmperf import Workload
from pytest_llmperf import baseline as bl
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.gating import result_entry
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import WARMUP_MODES, LLMPerf

SLOW = "slow_scheduler.slow_scheduler"
BASE = {"num_gpu_blocks_override": 512, "max_num_seqs": 64}


def measure(engine, perf, workload, repeats):
    return result_entry(perf.run(engine, workload, repeats=repeats, warmup=False), workload, 0)


def new_perf(warmup):
    gpu = detect()  # NVML sampling on, as in the plugin; the warm-up mode "auto" resolves per machine
    return LLMPerf(gpu_index=gpu.index if gpu else None, warmup_mode=warmup)


def entries(config, env, model, workload, runs, repeats, warmup):
    for key, value in env.items():
        os.environ[key] = value
    engine = VLLMEngine(model, config)
    perf = new_perf(warmup)
    warmed = perf.run(engine, workload)
    print(f"  warm-up {warmed.warmup}, {warmed.warmup_passes} whole passes", flush=True)
    out = [measure(engine, perf, workload, repeats) for _ in range(runs)]
    engine.shutdown()
    for key in env:
        os.environ.pop(key, None)
    return out


def flagged(stored, measured, tolerance):
    verdicts = [bl.compare(stored, [e], default_tolerance=tolerance) for e in measured]
    return [sorted({r.metric for r in v.regressions}) for v in verdicts]


def largest_changes(stored, measured) -> dict:
    """Per compared timing metric, the largest relative change of any run from the baseline: the
    noise a tolerance has to cover on this machine, metric by metric."""
    base = stored["entries"][0]["metrics"]
    out = {}
    for metric in bl.COMPARED:
        if metric in bl.PAGING or not base.get(metric):
            continue
        changes = [abs(e.metrics[metric] / base[metric] - 1) for e in measured if e.metrics.get(metric) is not None]
        if changes:
            out[metric] = round(max(changes), 3)
    return out


def judged(flags: list[list[str]]) -> dict:
    return {
        "runs": len(flags),
        "any_regression": sum(bool(f) for f in flags),
        "throughput": sum("output_tokens_per_s" in f for f in flags),
        "ttft_p99": sum("p99_ttft_ms" in f for f in flags),
        "paging": sum(any(m.startswith("kv_") for m in f) for f in flags),
        # which metrics a verdict named: a false alarm is only actionable once its metric is known
        "by_metric": dict(Counter(m for f in flags for m in f)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tolerances", default=str(bl.DEFAULT_TOLERANCE))
    ap.add_argument("--delays", default="0.05,0.10")
    ap.add_argument("--model", default="shape:tiny-llama")
    ap.add_argument("--config", default="{}", help="engine options added to every case (JSON)")
    ap.add_argument("--cases", default="", help="run only the cases whose name contains one of these (comma-separated)")
    ap.add_argument("--warmup", default="auto", choices=WARMUP_MODES, help="each engine's warm-up before its runs")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))  # slow_scheduler, for the engine-core process too
    os.environ["PYTHONPATH"] = f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    model = resolve_model(args.model)
    base = {**BASE, **json.loads(args.config)}
    workload = Workload.offline(args.requests, prompt_len=(16, 512), output_len=(16, 256), seed=7)

    engine = VLLMEngine(model, base)
    perf = new_perf(args.warmup)
    perf.run(engine, workload)
    recorded = perf.run(engine, workload, repeats=args.repeats, warmup=False)
    stored = bl.document("bench", "any", "model", {}, [result_entry(recorded, workload, 0)])
    step_s = recorded.duration_s / max(len(recorded.kv.timeline), 1) / args.repeats
    engine.shutdown()
    print(f"baseline: {recorded.throughput.output_tokens_per_s:.0f} tok/s, p99 TTFT {recorded.ttft.p99:.1f} ms, "
          f"mean step {step_s * 1e3:.2f} ms", flush=True)

    cases = {
        "unchanged": (base, {}),
        "max_num_seqs halved": ({**base, "max_num_seqs": base["max_num_seqs"] // 2}, {}),
        "KV budget 512 -> 160 blocks": ({**base, "num_gpu_blocks_override": 160}, {}),
    }
    for d in (float(x) for x in args.delays.split(",")):
        env = {"LLMPERF_BENCH_STEP_DELAY_S": str(d * step_s)}
        cases[f"+{d:.0%} per-step delay"] = ({**base, "scheduler_cls": SLOW}, env)
    if args.cases:
        cases = {k: v for k, v in cases.items() if any(part in k for part in args.cases.split(","))}
    tolerances = [float(x) for x in args.tolerances.split(",")]
    measured, table = {}, {}
    for name, (config, env) in cases.items():
        measured[name] = entries(config, env, model, workload, args.runs, args.repeats, args.warmup)
        ratios = [e.metrics["output_tokens_per_s"] / recorded.throughput.output_tokens_per_s for e in measured[name]]
        print(f"{name}: throughput vs baseline {[round(r, 3) for r in ratios]}", flush=True)
        print(f"  largest change per metric: {largest_changes(stored, measured[name])}", flush=True)
        for tolerance in tolerances:  # printed per case, so a run cut short keeps what it judged
            table[f"{name} @ {tolerance:.0%}"] = row = judged(flagged(stored, measured[name], tolerance))
            print(f"  @ tolerance {tolerance:.0%}", row, flush=True)
    changes = {name: [round(e.metrics["output_tokens_per_s"] / stored["entries"][0]["metrics"]["output_tokens_per_s"], 3)
                      for e in runs] for name, runs in measured.items()}
    out = {"model": args.model, "config": base, "repeats": args.repeats, "warmup": args.warmup, "runs": args.runs,
           "requests": args.requests, "mean_step_ms": step_s * 1e3, "cases": table, "throughput_ratios": changes}
    emit("detection_power", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
