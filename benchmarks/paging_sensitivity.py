"""Does the paging timeline see scheduler changes that the six paging summaries miss?

Runs the shipped suite's deterministic paging workloads (the tight budget, variable lengths, shared
prefixes) on real vLLM with a base configuration and with one scheduler setting changed at a time,
and for each says whether the summaries (blocks peak, preemptions, fragmentation max/mean, usage peak,
prefix hit rate) and the step timeline moved, and where the timeline first diverged. Each variant is
also run twice unchanged first, to show the timeline repeats exactly.

    python benchmarks/paging_sensitivity.py run --out FILE.json [--variants base,chunked_off,...]
    python benchmarks/paging_sensitivity.py compare OLD.json NEW.json   (e.g. two vLLM versions)

`run` writes every result's summaries and timeline; `compare` judges two such files workload by
workload and variant by variant (the upgrade question: which timelines differ between versions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from _emit import emit

from pytest_llmperf import Workload
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.models import resolve_model
from pytest_llmperf.paging_timeline import Timeline, first_divergence
from pytest_llmperf.runner import LLMPerf

SUMMARIES = ("kv_blocks_peak", "kv_preemptions", "kv_fragmentation_max", "kv_fragmentation_mean", "kv_usage_peak",
             "kv_prefix_hit_rate")
WORKLOADS = {  # as perf_tests/test_paging.py defines them
    "tight": (Workload.offline(32, prompt_len=(64, 256), output_len=(128, 256), seed=22),
              {"block_size": 32, "num_gpu_blocks_override": 48, "max_model_len": 1024}),
    "variable": (Workload.offline(48, prompt_len=(8, 600), output_len=(8, 300), seed=21),
                 {"block_size": 32, "num_gpu_blocks_override": 1024}),
    "prefix": (Workload.shared_prefix(64, prefix_len=1024, suffix_len=(16, 64), output_len=16, groups=4, seed=23),
               {"enable_prefix_caching": True, "num_gpu_blocks_override": 512}),
}
VARIANTS = {  # one scheduler setting changed at a time
    "base": {},
    "batched_tokens_half": {"max_num_batched_tokens": 1024},
    "max_num_seqs_16": {"max_num_seqs": 16},
    "chunked_prefill_off": {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096},
    "priority_policy": {"scheduling_policy": "priority"},
    "async_scheduling": {"async_scheduling": True},
    # no compile, no CUDA graphs: the start is seconds; `compare` across two models (`--model`) then asks
    # whether paging depends on the model's size at all under one KV budget and one set of limits
    "eager": {"enforce_eager": True},
}


def run(args: argparse.Namespace) -> int:
    model = resolve_model(args.model)
    out: dict[str, Any] = {"vllm": None, "results": {}}
    wanted = [v for v in args.variants.split(",") if v] or list(VARIANTS)
    for variant in wanted:
        for name, (workload, config) in WORKLOADS.items():
            key = f"{name}/{variant}"
            try:
                engine = VLLMEngine(model, {**config, **VARIANTS[variant]})
            except Exception as e:  # noqa: BLE001 - a setting this vLLM or platform refuses is a finding too
                out["results"][key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                print(f"{key}: engine refused: {e}", flush=True)
                continue
            try:
                perf = LLMPerf()
                runs = [perf.run(engine, workload, warmup=False) for _ in range(2)]
            finally:
                engine.shutdown()
            out["vllm"] = engine.version
            timelines = [r.kv.steps.to_dict() for r in runs]
            # the scheduler class the recorder ran under: AsyncScheduler where async scheduling really ran
            out["results"][key] = {"summary": {k: runs[0].flat()[k] for k in SUMMARIES}, "timeline": timelines[0],
                                   "repeats_exactly": timelines[0]["hash"] == timelines[1]["hash"],
                                   "scheduler": engine.config.get("scheduler")}
            print(f"{key}: {len(runs[0].kv.steps.steps)} steps, repeats exactly: "
                  f"{out['results'][key]['repeats_exactly']}, scheduler {engine.config.get('scheduler')}", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return judge(out, out, base_variant=True)


def judge(old: dict[str, Any], new: dict[str, Any], base_variant: bool = False) -> int:
    """Against the same workload's base variant (one file), or the same key of the other file."""
    rows = []
    for key, cur in sorted(new["results"].items()):
        name, variant = key.split("/")
        ref_key = f"{name}/base" if base_variant else key
        ref = old["results"].get(ref_key)
        if (base_variant and variant == "base") or ref is None or "error" in ref or "error" in cur:
            if "error" in cur:
                rows.append((key, "-", "-", cur["error"][:80]))
            continue
        moved = [k for k in SUMMARIES if ref["summary"][k] != cur["summary"][k]]
        a, b = Timeline.from_dict(ref["timeline"]), Timeline.from_dict(cur["timeline"])
        where = first_divergence(a, b)
        rows.append((key, ", ".join(moved) or "none", "yes" if where else "no", (where or "-")[:160]))
    print(f"\n{'workload/variant':<32} {'summaries moved':<40} {'timeline moved':<15} first divergence")
    for row in rows:
        print(f"{row[0]:<32} {row[1]:<40} {row[2]:<15} {row[3]}")
    only_timeline = sum(1 for r in rows if r[1] == "none" and r[2] == "yes")
    print(f"\n{len(rows)} comparisons; timeline moved with every summary unchanged: {only_timeline}")
    emit("paging_sensitivity", {"old": old.get("vllm"), "new": new.get("vllm"), "rows": rows})
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--model", default="shape:tiny-llama")
    r.add_argument("--variants", default="")
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    old, new = (json.loads(Path(p).read_text()) for p in (args.old, args.new))
    return judge(old, new)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
