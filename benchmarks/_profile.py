"""Benchmark diagnostics: sample a process with py-spy during one pass, and compare two samples.

py-spy reads another process's Python stacks from outside (no code in it), so a bare vLLM engine
core can be sampled the same way as the plugin's. Not a dependency of the plugin: the benchmark takes
the binary's path (`--profile`, or `PY_SPY`), e.g. the wheel's `py_spy-*.data/scripts/py-spy`.

    python benchmarks/_profile.py A.txt B.txt   # functions whose share of samples differs most
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path


def child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def new_engine_core(before: set[int]) -> int | None:
    """The engine-core process an engine start left behind (not multiprocessing's resource tracker)."""
    import psutil

    for pid in sorted(child_pids() - before):
        try:
            if "resource_tracker" not in " ".join(psutil.Process(pid).cmdline()):
                return pid
        except psutil.Error:
            continue
    return None


@contextmanager
def sampled(pyspy: str | None, pids: dict[str, int | None], out_dir: Path, label: str, rate: int = 200):
    """py-spy on each named process while the block runs; raw collapsed stacks to out_dir/prof-<label>-<name>.txt.
    `--nonblocking`: the sampled process is never paused, so the sampling costs it nothing but a core."""
    procs = []
    for name, pid in pids.items():
        if pyspy and pid:
            path = out_dir / f"prof-{label}-{name}.txt"
            procs.append(subprocess.Popen([pyspy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
                                           "--nonblocking", "-o", str(path)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if procs:
        time.sleep(1.0)  # attach before the pass starts
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


class GcPauses:
    """This process's garbage-collector pauses while the block runs (`gc.callbacks`): a full collection
    in the front end delays every token stamped behind it."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"gc_total_ms": round(sum(d for _, d in self.pauses) * 1e3, 2),
                "gc_max_ms": round(max((d for _, d in self.pauses), default=0.0) * 1e3, 2),
                "gc_full": sum(1 for g, _ in self.pauses if g == 2)}


def load(path: str) -> tuple[Counter, Counter, int]:
    """Inclusive and own sample counts per function ('name (file:line)' without the line)."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(":")[0] + ")" if ":" in f else f for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += n
        own[frames[-1]] += n
    return inclusive, own, total


def compare(a: str, b: str, top: int = 25) -> str:
    ia, oa, na = load(a)
    ib, ob, nb = load(b)
    lines = [f"{os.path.basename(a)}: {na} samples; {os.path.basename(b)}: {nb} samples",
             f"{'inclusive A%':>12} {'B%':>6} {'own A%':>7} {'B%':>6}  function"]
    keys = set(ia) | set(ib)
    by_diff = sorted(keys, key=lambda k: -abs(ia[k] / max(na, 1) - ib[k] / max(nb, 1)))
    for k in by_diff[:top]:
        lines.append(f"{ia[k] / max(na, 1):12.1%} {ib[k] / max(nb, 1):6.1%} {oa[k] / max(na, 1):7.1%} "
                     f"{ob[k] / max(nb, 1):6.1%}  {k[:140]}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(compare(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 25))
