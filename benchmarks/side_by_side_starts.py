"""Can the paging module's tiny engines start side by side on one GPU, and can each one's memory still be
read as if it were alone on the card? The lever issue 24 names for the GPU gate's engine starts, measured
before it is built. The four vLLM configurations of `perf_tests/test_paging.py` on a GPU (tiny shape,
eager), each engine in a Python process of its own:

1. one after another: start, one run of the paging module's variable-length workload while NVML samples
   the card's used memory every 10 ms, stop;
   (after one start and stop not counted, which loads the libraries from disk);
2. all four started at once (how long until every one is ready), then the same run on each in turn while
   the other three sit idle, the card's reading taken as before and NVML's per-process accounting read
   beside it; then all four stopped at once.

What it prints: each start and stop, one after another and side by side; whether NVML's per-process list
names this container's processes (the pids the engines' processes have here); and for each engine the
card's peak alone against its peak beside the others less what NVML charges the others' processes, the
reading the plugin would have to take for a memory baseline recorded alone to stay valid.

    source .gpukit/env.sh && python3 benchmarks/side_by_side_starts.py   # on a GPU machine with vLLM

`--threads` (any machine, this CPU included): two of those engines (block32, preempt) started side by side
in threads of this one process, as the plugin's pool does, each then running the preemption test's
workload: whether each engine's paging recorder still sees its own engine (the preemption engine preempts,
the other does not). Before the recorder's file was named per engine, one of the two saw nothing.

The last line is the JSON row (`_emit`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from typing import Any

from _emit import emit

BUDGET = 512
CONFIGS: dict[str, dict[str, Any]] = {
    "block16": {"block_size": 16, "num_gpu_blocks_override": 2 * BUDGET * 32 // 16},
    "block32": {"block_size": 32, "num_gpu_blocks_override": 2 * BUDGET * 32 // 32},
    "preempt": {"block_size": 32, "num_gpu_blocks_override": 48, "max_model_len": 1024},
    "prefix": {"enable_prefix_caching": True, "num_gpu_blocks_override": BUDGET},
}

# one engine in this process: started, then told what to do one line at a time on stdin
CHILD = """
import json, os, sys, time
import psutil
from pytest_llmperf import Workload
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.models import resolve_model

def say(**kw):
    print("@@" + json.dumps(kw), flush=True)

t0 = time.monotonic()
engine = VLLMEngine(resolve_model("shape:tiny-llama"), {"enforce_eager": True, **json.loads(sys.argv[1])})
pids = [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]
say(ready=time.monotonic() - t0, pids=pids)
for line in sys.stdin:
    if line.strip() == "run":
        t = time.monotonic()
        engine.run(Workload.offline(48, prompt_len=(8, 600), output_len=(8, 300), seed=21))
        say(ran=time.monotonic() - t)
    elif line.strip() == "stop":
        t = time.monotonic()
        engine.shutdown()
        say(stopped=time.monotonic() - t)
        break
"""


class Child:
    def __init__(self, name: str) -> None:
        self.name = name
        self.began = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(CONFIGS[name])], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        raise RuntimeError(f"{self.name}: the engine process ended (rc {self.proc.wait()})")

    def tell(self, what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.reply()


class Sampler:
    """The card's used memory every 10 ms (what the plugin's NvmlSampler reads), its peak kept."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.peak, self._stop = handle, 0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import pynvml

        while not self._stop.is_set():
            self.peak = max(self.peak, pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
            time.sleep(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def per_process(handle: Any) -> dict[int, int]:
    import pynvml

    return {p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def run_on(child: Child, handle: Any) -> int:
    with Sampler(handle) as s:
        child.tell("run")
    return s.peak


def in_threads() -> None:
    """Two engines started at once in threads of this process; each one's paging read back."""
    from pytest_llmperf import Workload
    from pytest_llmperf.engines.vllm import VLLMEngine
    from pytest_llmperf.metrics import kv_stats
    from pytest_llmperf.models import resolve_model

    model = resolve_model("shape:tiny-llama")
    engines: dict[str, Any] = {}
    seconds: dict[str, float] = {}

    def start(name: str) -> None:
        t = time.monotonic()
        try:
            engines[name] = VLLMEngine(model, {"enforce_eager": True, **CONFIGS[name]})
        finally:
            seconds[name] = time.monotonic() - t

    began = time.monotonic()
    threads = [threading.Thread(target=start, args=(n,)) for n in ("block32", "preempt")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    both = time.monotonic() - began
    seen: dict[str, str] = {}
    workload = Workload.offline(32, prompt_len=(64, 256), output_len=(128, 256), seed=22)
    for name, engine in engines.items():
        try:
            kv = kv_stats(engine.run(workload))
            seen[name] = f"preemptions {kv.preemptions}, blocks peak {kv.blocks_peak}"
        except Exception as e:  # noqa: BLE001 - what a shared recorder does is the finding
            seen[name] = f"{type(e).__name__}: {str(e)[:160]}"
        finally:
            engine.shutdown()
    for name in seconds:
        print(f"{name}: started in {seconds[name]:.1f} s; its run: {seen.get(name, 'did not start')}")
    print(f"both ready after {both:.1f} s")
    emit("side_by_side_starts", {"threads": True, "both_ready_s": round(both, 2),
                                 "start_s": {n: round(v, 2) for n, v in seconds.items()}, "paging": seen})


def main() -> None:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gib = 1024**3
    idle = pynvml.nvmlDeviceGetMemoryInfo(h).used
    rows: dict[str, dict[str, Any]] = {n: {} for n in CONFIGS}
    primer = Child("block32")  # not counted: the first start of a machine loads the libraries from disk
    primer.reply()
    primer.tell("stop")
    primer.proc.wait()
    for name in CONFIGS:  # one after another, as the gate starts them today
        c = Child(name)
        ready = c.reply()
        rows[name].update(start_alone_s=ready["ready"], peak_alone=run_on(c, h))
        rows[name]["stop_alone_s"] = c.tell("stop")["stopped"]
        c.proc.wait()
    began = time.monotonic()
    children = [Child(n) for n in CONFIGS]  # side by side
    pids: dict[str, list[int]] = {}
    for c in children:
        ready = c.reply()
        pids[c.name] = ready["pids"]
        rows[c.name]["start_beside_s"] = ready["ready"]
    all_ready = time.monotonic() - began
    listed = per_process(h)
    ours = {p for ps in pids.values() for p in ps}
    for c in children:
        others = {p for n, ps in pids.items() if n != c.name for p in ps}
        before = per_process(h)
        peak = run_on(c, h)
        after = per_process(h)
        others_now = max(sum(v for p, v in before.items() if p in others), sum(v for p, v in after.items() if p in others))
        rows[c.name].update(peak_beside=peak, others_nvml=others_now, own_nvml=sum(v for p, v in after.items() if p not in others))
    began = time.monotonic()
    threads = [threading.Thread(target=c.tell, args=("stop",)) for c in children]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in children:
        c.proc.wait()
    all_stopped = time.monotonic() - began
    print(f"card idle {idle / gib:.2f} GiB; NVML lists pids {sorted(listed)}; the engines' pids here {sorted(ours)}; "
          f"matched {len(ours & set(listed))} of {len(listed)}")
    print("| engine | start alone s | start beside s | stop alone s | peak alone GiB | peak beside GiB "
          "| others (NVML) GiB | beside less others GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['start_alone_s']:.1f} | {r['start_beside_s']:.1f} | {r['stop_alone_s']:.1f} | "
              f"{r['peak_alone'] / gib:.3f} | {r['peak_beside'] / gib:.3f} | {r['others_nvml'] / gib:.3f} | "
              f"{(r['peak_beside'] - r['others_nvml']) / gib:.3f} |")
    serial = sum(r["start_alone_s"] for r in rows.values())
    stops = sum(r["stop_alone_s"] for r in rows.values())
    print(f"starts: {serial:.1f} s one after another, {all_ready:.1f} s side by side; stops: {stops:.1f} s and {all_stopped:.1f} s")
    emit("side_by_side_starts", {"starts_serial_s": round(serial, 2), "starts_beside_s": round(all_ready, 2),
          "stops_serial_s": round(stops, 2), "stops_beside_s": round(all_stopped, 2),
          "pids_matched": len(ours & set(listed)), "pids_listed": len(listed),
          "engines": {n: {k: (round(v / gib, 4) if k.startswith(("peak", "others", "own")) else round(v, 2))
                          for k, v in r.items()} for n, r in rows.items()}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", action="store_true", help="two engines in threads of this process (any machine)")
    in_threads() if parser.parse_args().threads else main()
