"""Where does an engine's pass-to-pass noise come from on this host?

Warms one vLLM engine up as the plugin does, then runs whole passes of one workload back to back and
prints, per pass, output throughput beside what the host did meanwhile: CPU-quota throttling of this
container (cgroup v2 `cpu.stat`), CPU pressure (PSI: time some task waited for a CPU, system-wide and
in this cgroup), steal (CPU time a VM's hypervisor gave to someone else), the CPU time of the front end
(this process) and of the engine's processes, and on a GPU its utilisation, power and SM clock. A slow
pass that lines up with one of them says where the time went.

    python benchmarks/host_noise.py [--passes 12] [--requests 64] [--model shape:llama-3.2-1b] [--config JSON] [--pin]

`--pin` alternates passes between the default placement and one where the engine's processes run on
physical cores of their own (each with its hyperthread siblings) and the front end on the rest: if
slow passes come from the engine core sharing a core with something else, the pinned passes are the
steady ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
from _emit import emit

from pytest_llmperf import Workload
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import LLMPerf

CGROUP = Path("/sys/fs/cgroup")
USER_HZ = os.sysconf("SC_CLK_TCK")


def _psi_some_us(path: Path) -> float | None:
    try:
        line = next(x for x in path.read_text().splitlines() if x.startswith("some"))
    except (OSError, StopIteration):
        return None
    return float(line.rsplit("total=", 1)[1])


def _cpu_stat() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in (line.split() for line in (CGROUP / "cpu.stat").read_text().splitlines())}
    except (OSError, ValueError):
        return {}


def host() -> dict[str, float | None]:
    """Cumulative counters, in microseconds where they are times."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    stat = _cpu_stat()
    return {"steal_us": float(fields[8]) * 1e6 / USER_HZ if len(fields) > 8 else None,
            "psi_some_us": _psi_some_us(Path("/proc/pressure/cpu")),
            "cgroup_psi_some_us": _psi_some_us(CGROUP / "cpu.pressure"),
            "throttled_us": stat.get("throttled_usec"), "nr_throttled": stat.get("nr_throttled"),
            "usage_us": stat.get("usage_usec")}


def delta(before: dict, after: dict, seconds: float) -> dict[str, float | None]:
    """Per pass: shares of its wall time (throttled, pressure, steal), throttling periods, and CPUs used."""
    out: dict[str, float | None] = {}
    for key in before:
        name = {"nr_throttled": key, "usage_us": "cpus_used"}.get(key, key.replace("_us", "_share"))
        if before[key] is None or after[key] is None:
            out[name] = None
        elif key == "nr_throttled":
            out[name] = after[key] - before[key]
        else:  # a time: the share of the pass's wall time (CPUs used, for the cgroup's usage)
            out[name] = round((after[key] - before[key]) / 1e6 / seconds, 3)
    return out


def cpu_seconds() -> dict[str, float]:
    """CPU time so far of the front end (this process) and of its children (the engine's processes)."""
    me = psutil.Process()
    kids = 0.0
    for child in me.children(recursive=True):
        try:
            t = child.cpu_times()
            kids += t.user + t.system
        except psutil.Error:
            continue
    t = me.cpu_times()
    return {"front_end": t.user + t.system, "engine": kids}


def physical_cores() -> list[list[int]]:
    """The CPUs this process may use, grouped by physical core (hyperthread siblings together)."""
    allowed, cores = os.sched_getaffinity(0), {}
    for cpu in sorted(allowed):
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings = path.read_text().strip() if path.exists() else str(cpu)
        cores.setdefault(siblings, []).append(cpu)
    return list(cores.values())


def _pin_process(pid: int, cpus: set[int]) -> None:
    # sched_setaffinity binds one thread: every thread of the process gets the set
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except OSError:
            continue


def _affinity(pid: int) -> list[int]:
    """The CPUs any thread of the process may run on."""
    return sorted(set().union(*(os.sched_getaffinity(int(t.name)) for t in Path(f"/proc/{pid}/task").iterdir())))


def place(pinned: bool, engine_cores: int = 2) -> dict:
    """Pinned: the engine's processes on `engine_cores` physical cores of their own, the front end on
    the others. Not pinned: every process may run anywhere, as by default."""
    cores = physical_cores()
    engine_cores = min(engine_cores, len(cores) - 1)  # the front end keeps at least one
    everything = {c for core in cores for c in core}
    engine = {c for core in cores[:engine_cores] for c in core} if pinned else everything
    front = everything - engine if pinned else everything
    for child in psutil.Process().children(recursive=True):
        _pin_process(child.pid, engine)
    _pin_process(os.getpid(), front)
    seen = {f"{child.name()}:{child.pid}": _affinity(child.pid) for child in psutil.Process().children(recursive=True)}
    return {"seen": seen, "engine_cpus": sorted(engine) if pinned else "all", "front_cpus": sorted(front) if pinned else "all"}


@contextmanager
def sm_clocks(index: int | None, out: list[float], interval_s: float = 0.05):
    """Samples the GPU's SM clock (MHz) meanwhile: a card clocked down runs every kernel slower."""
    if index is None:
        yield
        return
    import pynvml

    handle, stop = pynvml.nvmlDeviceGetHandleByIndex(index), threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            out.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--model", default="shape:tiny-llama")
    ap.add_argument("--config", default='{"num_gpu_blocks_override": 512, "max_num_seqs": 64}')
    ap.add_argument("--pin", action="store_true", help="alternate default and pinned placement, pass by pass")
    args = ap.parse_args()
    facts = {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
             "threads_per_core": max(len(core) for core in physical_cores()),
             "cpu.max": (CGROUP / "cpu.max").read_text().strip() if (CGROUP / "cpu.max").exists() else None,
             "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    print("host:", facts, flush=True)
    workload = Workload.offline(args.requests, prompt_len=(16, 512), output_len=(16, 256), seed=7)
    engine = VLLMEngine(resolve_model(args.model), json.loads(args.config))
    gpu = detect()
    perf = LLMPerf(gpu_index=gpu.index if gpu else None)
    perf.run(engine, workload)  # the plugin's warm-up (steady on a GPU)
    rows = []
    for i in range(args.passes):
        pinned = args.pin and i % 2 == 1
        placement = place(pinned) if args.pin else {}
        before, cpu, clocks = host(), cpu_seconds(), []
        with sm_clocks(gpu.index if gpu else None, clocks):
            result = perf.run(engine, workload, warmup=False)
        spent = {k: round((v - cpu[k]) / result.duration_s, 2) for k, v in cpu_seconds().items()}
        row = {"pass": i, "pinned": pinned, "tok_s": round(result.throughput.output_tokens_per_s),
               **delta(before, host(), result.duration_s), "front_end_cpus": spent["front_end"],
               "engine_cpus": spent["engine"], "gpu_util_pct": result.gpu.utilization_mean_pct,
               "gpu_power_w": result.gpu.power_mean_w, "sm_mhz_min": min(clocks) if clocks else None,
               "sm_mhz_mean": round(float(np.mean(clocks))) if clocks else None}
        rows.append(row)
        print(row, placement if i < 2 else "", flush=True)
    engine.shutdown()
    by_placement = {}
    for pinned in sorted({r["pinned"] for r in rows}):
        got = np.array([r["tok_s"] for r in rows if r["pinned"] == pinned], dtype=float)
        by_placement["pinned" if pinned else "default"] = {
            "min": got.min(), "median": np.median(got), "max": got.max(),
            "spread": round(float((got.max() - got.min()) / np.median(got)), 3)}
    print("throughput by placement:", by_placement, flush=True)
    rates = np.array([r["tok_s"] for r in rows], dtype=float)
    signals = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if key not in ("pass", "pinned", "tok_s") and all(v is not None for v in values) and np.std(values) > 0:
            signals[key] = round(float(np.corrcoef(rates, values)[0, 1]), 2)
    print("throughput min/median/max:", rates.min(), np.median(rates), rates.max(),
          "| correlation of throughput with each host signal:", signals, flush=True)
    emit("host_noise", {"model": args.model, "requests": args.requests, "host": facts, "passes": rows,
                        "correlation": signals, "by_placement": by_placement})
    return 0


if __name__ == "__main__":
    sys.exit(main())
