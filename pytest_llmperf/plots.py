"""Pictures for `--llmperf-report DIR` (report layer: reads results and sweeps, knows no engine):
latency CDFs, throughput against latency for sweeps with the Pareto points marked, KV usage and
fragmentation over time with preemptions marked, GPU memory over time. PNG, one file per picture.

A test's pictures are planned when it is judged (`pictures`) and drawn once the session's tests are
done (`draw_all`), in child processes side by side: nothing draws while an engine measures, and on
an H200 host the gate suite's 25 pictures took 9-10 s drawn one after another in the test process.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .metrics import PerfResult
from .paging_timeline import Timeline
from .sweep import Sweep

MAX_DRAWERS = 8  # child processes drawing at once; each imports matplotlib (about 0.5 s)


@dataclass(frozen=True)
class Picture:
    """One picture to draw: the function of this module that draws it, its data and its file."""

    draw: str
    path: Path
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def pictures(name: str, results: Sequence[PerfResult], sweeps: Sequence[Sweep], folder: Path,
             timelines: Sequence[tuple[str, Timeline, Timeline, int | None]] = ()) -> list[Picture]:
    """Every picture that the test's data allows, not yet drawn; `timelines` are (label, baseline,
    current, first divergent step) of the deterministic results compared with a baseline."""
    planned = [Picture("latency_cdf", folder / f"{name}-latency-cdf.png", (tuple(results),))]
    planned += [Picture("sweep_curve", folder / f"{name}-{s.label}-curve.png", (s,)) for s in sweeps]
    for i, r in enumerate(results):
        tag = r.label or str(i)
        if r.kv.timeline:
            planned.append(Picture("kv_timeline", folder / f"{name}-{tag}-kv.png", (r,)))
        if r.gpu.timeline:
            planned.append(Picture("gpu_memory", folder / f"{name}-{tag}-gpu-memory.png", (r,)))
    planned += [Picture("timelines_overlaid", folder / f"{name}-{label}-paging-timeline.png", (label, old, new),
                        {"diverged_at": at}) for label, old, new, at in timelines]
    return planned


def draw(planned: Sequence[Picture]) -> list[str]:
    """Draws each picture in this process; returns why each that failed could not be drawn."""
    errors = []
    for p in planned:
        try:
            p.path.parent.mkdir(parents=True, exist_ok=True)
            globals()[p.draw](*p.args, path=p.path, **p.kwargs)
        except Exception as e:  # noqa: BLE001 - one picture that cannot be drawn must not lose the others
            errors.append(f"{p.path.name}: {type(e).__name__}: {e}")
            if "matplotlib.pyplot" in sys.modules:  # the figure it left open, held by pyplot for the session
                sys.modules["matplotlib.pyplot"].close("all")
    return errors


def draw_all(planned: Sequence[Picture], workers: int | None = None) -> list[str]:
    """Draws every picture, split over child processes (at most the cores, MAX_DRAWERS); returns why
    each that failed could not be drawn."""
    workers = min(workers or os.cpu_count() or 1, MAX_DRAWERS, len(planned))
    if workers <= 1:
        return draw(planned)
    shares = [list(planned[k::workers]) for k in range(workers)]
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="llmperf-plots-") as tmp:
        children = []
        for k, share in enumerate(shares):
            job = Path(tmp) / f"{k}.pickle"
            # plain tuples: a Picture class reloaded since (pytester's in-process runs) would not pickle
            job.write_bytes(pickle.dumps([(p.draw, p.path, p.args, p.kwargs) for p in share]))
            children.append((job, subprocess.Popen([sys.executable, "-m", "pytest_llmperf.plots", str(job)],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        for share, (job, child) in zip(shares, children):
            _, stderr = child.communicate()
            done = job.with_suffix(".json")
            if child.returncode == 0 and done.exists():
                errors += json.loads(done.read_text())
            else:
                why = (stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
                errors += [f"{p.path.name}: its drawing process failed ({why})" for p in share]
    return errors


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'pytest-llmperf[plots]'") from None

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(results: Sequence[PerfResult], path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, title in ((axes[0], "ttft", "Time to first token"), (axes[1], "tpot", "Time per output token")):
        for i, r in enumerate(results):
            values = sorted(v for s in r.sequences if (v := getattr(s, metric)) is not None)
            if values:
                ax.step(values, [(k + 1) / len(values) for k in range(len(values))], where="post",
                        label=r.label or f"result {i}")
        ax.set(title=title, xlabel=f"{metric.upper()} (ms)", ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize="small", loc="lower right")
    return _save(fig, path)


def sweep_curve(sweep: Sweep, path: Path, latency: str = "p99_tpot_ms") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # a point without the latency (no request had two tokens) is left off, not drawn at 0 ms
    shown = [p for p in sweep.points if p.result.flat()[latency] is not None]
    xs = [p.result.throughput.output_tokens_per_s for p in shown]
    ys = [p.result.flat()[latency] for p in shown]
    ax.plot(xs, ys, "o-", color="tab:blue", label=f"{sweep.kind} points")
    for p, x, y in zip(shown, xs, ys):
        ax.annotate(f"{p.value:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    front = sweep.pareto(latency)
    ax.scatter([p.result.throughput.output_tokens_per_s for p in front], [p.result.flat()[latency] for p in front],
               s=120, facecolors="none", edgecolors="tab:red", linewidths=1.5, label="Pareto front")
    best = sweep.best_balance(latency)
    if best is not None:
        ax.scatter([best.result.throughput.output_tokens_per_s], [best.result.flat()[latency]], marker="*", s=200,
                   color="tab:green", label=f"best balance ({sweep.kind} {best.value:g})")
    cap = sweep.capacity() if sweep.under else None
    title = f"{sweep.label}: throughput vs {latency}"
    if cap is not None:
        title += f" (capacity {cap:g})"
    ax.set(title=title, xlabel="output throughput (tokens/s)", ylabel=latency.replace("_ms", " (ms)"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def kv_timeline(result: PerfResult, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    t = [row[0] for row in result.kv.timeline]
    if result.kv.usage_peak is not None:  # a contiguous cache (hf) has no block pool to be a share of
        ax.plot(t, [row[1] for row in result.kv.timeline], label="KV usage (blocks in use / total)")
    ax.plot(t, [row[2] for row in result.kv.timeline], label="fragmentation (wasted slots / allocated)")
    previous = 0
    for row in result.kv.timeline:
        if row[4] > previous:
            ax.axvline(row[0], color="tab:red", alpha=0.4, linewidth=0.8)
            previous = row[4]
    ax.set(title=f"KV cache over time ({result.label or result.engine}; red: preemptions, {result.kv.preemptions or 0} in all)",
           xlabel="time since run start (s)", ylabel="fraction", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")
    return _save(fig, path)


def timelines_overlaid(label: str, old: Timeline, new: Timeline, path: Path, diverged_at: int | None = None) -> Path:
    """A deterministic result's paging timeline against its baseline's, step by step: blocks in use
    (above) and running requests (below), preemptions marked, the first divergence a dashed line."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    for t, name, style in ((old, "baseline", {"color": "tab:gray", "linewidth": 2.5, "alpha": 0.6}),
                           (new, "current", {"color": "tab:blue", "linewidth": 1.0})):
        x = range(len(t.steps))
        top.plot(x, [s.blocks for s in t.steps], label=name, **style)
        bottom.plot(x, [s.running for s in t.steps], label=name, **style)
        for i, s in enumerate(t.steps):
            if s.preempted:
                bottom.axvline(i, color=style["color"], alpha=0.35, linewidth=0.8)
    if diverged_at is not None:
        for ax in (top, bottom):
            ax.axvline(diverged_at, color="tab:red", linestyle="--", linewidth=1.0)
    top.set(title=f"Paging timeline of {label!r} against its baseline (red dashes: first divergence; "
                  "thin lines: preemptions)", ylabel="KV blocks in use")
    bottom.set(xlabel="engine step", ylabel="running requests")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize="small", loc="upper right")
    return _save(fig, path)


def gpu_memory(result: PerfResult, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([row[0] for row in result.gpu.timeline], [row[1] for row in result.gpu.timeline])
    ax.set(title=f"GPU memory used ({result.label or result.engine}; NVML, all processes)",
           xlabel="time since run start (s)", ylabel="GiB")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


if __name__ == "__main__":  # a drawing process of draw_all: its pictures in, why any failed out
    job = Path(sys.argv[1])
    job.with_suffix(".json").write_text(json.dumps(draw([Picture(*p) for p in pickle.loads(job.read_bytes())])))
