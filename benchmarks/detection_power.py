"""How well does the baseline gate separate noise from regressions?

Records a baseline of an unchanged configuration as the plugin does (`--llmperf-baseline=update`: the
best of 1 + retries passes), then compares N more runs of the same configuration (every regression
verdict there is a false alarm) and N runs of each injected regression (every regression verdict is a
catch): max_num_seqs halved, a smaller KV budget, and slower engine steps costing a given share of
throughput (a scheduler that waits in `schedule()` for a share of each step's own time, spun on the
CPU or, with `--slow-on gpu`, by a GPU kernel queued before the step; the loss it really caused is
printed beside it). Every run is judged by the plugin's
own gate (`remeasure.judged_against_baseline`) at each tolerance given (the default, 10%, unless given), with the default
repeats (1) and retries (2) unless given, and also on its first pass alone (retries 0) to show what
measuring again buys.

    python benchmarks/detection_power.py --runs 10 [--repeats 1] [--retries 2] [--tolerances 0.05,0.10] [--losses 0.05,0.10,0.20]
        [--slow-on cpu|gpu]   (where the slower steps wait: gpu for a model whose steps are GPU-bound)
        [--model shape:tiny-llama] [--config JSON]   (engine options added to every case, e.g. enforce_eager)
        [--warmup auto|quick|steady]   (each engine's warm-up before its runs; auto: steady on a GPU)
        [--cases unchanged,slower]   (only the cases whose name contains one of these)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from _emit import emit

from pytest_llmperf import Workload, gating, remeasure
from pytest_llmperf import baseline as bl
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import WARMUP_MODES, LLMPerf

SLOW = "slow_scheduler.slow_scheduler"
BASE = {"num_gpu_blocks_override": 512, "max_num_seqs": 64}


class Run:
    """One measured run of a case, as a test's `llmperf` holds it. The gate's re-measurements are taken
    when it first asks for them, right after the run as in the plugin, and kept, so that every tolerance
    judges the same passes."""

    def __init__(self, perf: LLMPerf):
        self.perf, self.runs = perf, perf.runs
        self.kept: dict[tuple[int, int], object] = {}

    def remeasure(self, index: int, salt: int):
        if (index, salt) not in self.kept:
            self.kept[index, salt] = self.perf.remeasure(index, salt)
        return self.kept[index, salt]

    def judged(self, stored, tolerance: float, retries: int) -> bl.Verdict:
        return remeasure.judged_against_baseline(stored, self, gating.entries(self.perf), {}, tolerance, retries)  # type: ignore[arg-type]

    def restart_engine(self, index: int):
        return self.perf.restart_engine(index)

    @property
    def passes(self) -> int:
        return 1 + len(self.kept)


def measure(engine, steady, workload, repeats, judge: tuple | None) -> Run:
    """`judge`: (stored, tolerance, retries) to judge the run at once, as the plugin does at the end of
    a test, so that any re-measurement follows its first pass as closely as in the plugin."""
    perf = LLMPerf(gpu_index=steady.gpu_index, warmup_mode=steady.warmup_mode, steady_engines=steady.steady_engines)
    perf.run(engine, workload, repeats=repeats, warmup=False)
    run = Run(perf)
    if judge is not None:
        run.judged(*judge)
    return run


def new_perf(warmup):
    gpu = detect()  # NVML sampling on, as in the plugin; the warm-up mode "auto" resolves per machine
    return LLMPerf(gpu_index=gpu.index if gpu else None, warmup_mode=warmup)


def measured_runs(config, env, model, workload, runs, repeats, warmup, judge=None):
    for key, value in env.items():
        os.environ[key] = value
    engine = VLLMEngine(model, config)
    perf = new_perf(warmup)
    warmed = perf.run(engine, workload)
    print(f"  warm-up {warmed.warmup}, {warmed.warmup_passes} whole passes", flush=True)
    return [measure(engine, perf, workload, repeats, judge) for _ in range(runs)], engine


def done(engine, env):
    engine.shutdown()
    for key in env:
        os.environ.pop(key, None)


def flagged(stored, runs: list[Run], tolerance: float, retries: int) -> list[list[str]]:
    return [sorted({r.metric for r in run.judged(stored, tolerance, retries).regressions}) for run in runs]


def largest_changes(stored, measured) -> dict:
    """Per compared timing metric, the largest relative change of any run from the baseline: the
    noise a tolerance has to cover on this machine, metric by metric."""
    base = stored["entries"][0]["metrics"]
    firsts = [gating.entries(run.perf)[0] for run in measured]
    out = {}
    for metric in bl.COMPARED:
        if metric in bl.PAGING or not base.get(metric):
            continue
        changes = [abs(e.metrics[metric] / base[metric] - 1) for e in firsts if e.metrics.get(metric) is not None]
        if changes:
            out[metric] = round(max(changes), 3)
    return out


def _median_rate(runs: list[Run]) -> float:
    rates = sorted(run.results[0].throughput.output_tokens_per_s for run in runs)
    return rates[len(rates) // 2]


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
    ap.add_argument("--retries", type=int, default=2, help="the gate's re-measurements (--llmperf-retries)")
    ap.add_argument("--slow-on", default="cpu", choices=("cpu", "gpu"), help="where the slower steps wait")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tolerances", default=str(bl.DEFAULT_TOLERANCE))
    ap.add_argument("--losses", default="0.05,0.10", help="injected throughput losses: slower engine steps")
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

    baseline_runs, engine = measured_runs(base, {}, model, workload, 1, args.repeats, args.warmup)
    perf = baseline_runs[0].perf
    recorded = perf.results[0]
    best = remeasure.best_of_more_passes(perf, gating.entries(perf), {e.label for e in gating.entries(perf)}, args.retries)
    stored = bl.document("bench", "any", "model", {}, best)
    step_s = recorded.duration_s / max(len(recorded.kv.timeline), 1) / args.repeats
    done(engine, {})
    best_rate = stored["entries"][0]["metrics"]["output_tokens_per_s"]
    print(f"baseline: {best_rate:.0f} tok/s (best of {best[0].passes} passes; the first "
          f"{recorded.throughput.output_tokens_per_s:.0f}), p99 TTFT {recorded.ttft.p99:.1f} ms, "
          f"mean step {step_s * 1e3:.2f} ms", flush=True)

    cases = {
        "unchanged": (base, {}),
        "max_num_seqs halved": ({**base, "max_num_seqs": base["max_num_seqs"] // 2}, {}),
        "KV budget 512 -> 160 blocks": ({**base, "num_gpu_blocks_override": 160}, {}),
    }
    for loss in (float(x) for x in args.losses.split(",")):
        # steps 1/(1 - loss) as long
        env = {"LLMPERF_BENCH_STEP_SLOWDOWN": str(loss / (1 - loss)), "LLMPERF_BENCH_SLOW_ON": args.slow_on}
        cases[f"-{loss:.0%} throughput (slower steps, {args.slow_on})"] = ({**base, "scheduler_cls": SLOW}, env)
    if args.cases:
        cases = {k: v for k, v in cases.items() if any(part in k for part in args.cases.split(","))}
    tolerances = [float(x) for x in args.tolerances.split(",")]
    measured, table = {}, {}
    for name, (config, env) in cases.items():
        judge = (stored, min(tolerances), args.retries)  # the most sensitive asks for the most passes
        runs, engine = measured_runs(config, env, model, workload, args.runs, args.repeats, args.warmup, judge)
        measured[name] = runs
        first = [run.results[0].throughput.output_tokens_per_s / best_rate for run in runs]
        print(f"{name}: first-pass throughput vs baseline {[round(r, 3) for r in first]}", flush=True)
        print(f"  largest change per metric: {largest_changes(stored, runs)}", flush=True)
        for tolerance in tolerances:  # printed per case, so a run cut short keeps what it judged
            for retries in sorted({0, args.retries}):
                table[f"{name} @ {tolerance:.0%}, retries {retries}"] = row = judged(flagged(stored, runs, tolerance, retries))
                print(f"  @ tolerance {tolerance:.0%}, retries {retries}", row, flush=True)
        best_of = [max(r.throughput.output_tokens_per_s for r in [run.results[0], *run.kept.values()]) / best_rate
                   for run in runs]
        table[name] = {"mean_passes": sum(run.passes for run in runs) / len(runs)}  # at the smallest tolerance
        if "unchanged" in measured and name != "unchanged":
            # what an injected regression really cost on this machine
            loss = 1 - _median_rate(runs) / _median_rate(measured["unchanged"])
            table[name]["throughput_loss_vs_unchanged"] = round(loss, 3)
            print(f"  throughput loss against the unchanged runs (first passes, medians): {loss:.1%}", flush=True)
        print(f"  best-pass throughput vs baseline {[round(r, 3) for r in best_of]}; passes per run "
              f"{[run.passes for run in runs]}", flush=True)
        done(engine, env)
    changes = {name: [round(run.results[0].throughput.output_tokens_per_s / best_rate, 3) for run in runs]
               for name, runs in measured.items()}
    out = {"model": args.model, "config": base, "repeats": args.repeats, "retries": args.retries,
           "warmup": args.warmup, "slow_on": args.slow_on, "runs": args.runs, "requests": args.requests,
           "mean_step_ms": step_s * 1e3,
           "cases": table, "first_pass_throughput_ratios": changes}
    emit("detection_power", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
