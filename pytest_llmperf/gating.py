"""Plugin side of baselines: a test's results become baseline entries, compared or written.

Lives beside `plugin.py` (same layer): it reads pytest's item and the session's options and hands
plain values to `baseline.py`, which knows nothing of pytest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import baseline
from .baseline import BaselineError, Entry, Verdict
from .runner import LLMPerf

TOLERANCE_MARKER = "llmperf_tolerance"
MODES = ("compare", "update", "off")


@dataclass(frozen=True)
class GateConfig:
    mode: str
    root: Path
    tolerance: float
    hardware: str
    model: str


def entries(perf: LLMPerf) -> list[Entry]:
    """One entry per result (sweep points included: a curve regresses when any point does) and one
    per sweep for its capacity."""
    # a bisection measures different rates each run: only its capacity can be compared
    searched = {p.result.label for s in perf.sweeps if s.searched for p in s.points}
    points = [result_entry(r, w, i) for i, (r, w) in enumerate(zip(perf.results, perf.workloads))
              if r.label not in searched]
    curves = [
        Entry(label=f"{s.label}:capacity", workload_hash=_curve_hash(s), deterministic=False,
              metrics={"capacity": s.capacity()}, per_repeat=[])
        for s in perf.sweeps if s.under
    ]
    return points + curves


def result_entry(result: Any, workload: Any, index: int) -> Entry:
    return Entry(label=result.label or str(index), workload_hash=result.workload_hash,
                 deterministic=workload.is_offline, metrics=result.flat(), per_repeat=list(result.per_repeat),
                 noise=dict(result.noise))


def _curve_hash(sweep: Any) -> str:
    points = "searched" if sweep.searched else [p.result.workload_hash for p in sweep.points]
    text = json.dumps([sweep.kind, sorted(sweep.under.items()), points])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def environment(perf: LLMPerf, hardware: str, gpu: Any) -> dict[str, Any]:
    engine = perf.engines[-1]
    env: dict[str, Any] = {"engine": engine.name, "engine_version": engine.version, "engine_config": engine.config,
                           "hardware": hardware}
    if gpu is not None:
        env.update(gpu_name=gpu.name, driver=gpu.driver, cuda=gpu.cuda)
    return env


def tolerances(marks: list[Mapping[str, Any]]) -> dict[str, float]:
    """`@pytest.mark.llmperf_tolerance(p99_ttft_ms=0.15, ttft_p99=0.15, ...)`: both spellings."""
    out: dict[str, float] = {}
    for kwargs in marks:
        for key, value in kwargs.items():
            metric = _metric_name(key)
            if metric not in baseline.COMPARED:
                raise BaselineError(f"@pytest.mark.{TOLERANCE_MARKER}({key}=...): unknown metric; "
                                    f"compared metrics: {', '.join(baseline.COMPARED)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise BaselineError(f"@pytest.mark.{TOLERANCE_MARKER}({key}={value!r}): give a fraction >= 0, e.g. 0.15")
            out[metric] = float(value)
    return out


def _metric_name(key: str) -> str:
    m = re.fullmatch(r"(ttft|tpot|itl|e2e)_(p\d+|mean|max)", key)
    return f"{m.group(2)}_{m.group(1)}_ms" if m else key


def gate(test_id: str, perf: LLMPerf, cfg: GateConfig, env: Mapping[str, Any],
         tol: Mapping[str, float]) -> Verdict | None:
    """Compare with (or write) this test's baseline. None when off; BaselineError for a bad file."""
    if cfg.mode == "off" or not perf.results:
        return None
    path = baseline.path_for(cfg.root, test_id, cfg.hardware, cfg.model)
    current = entries(perf)
    if cfg.mode == "update":
        baseline.write(path, baseline.document(test_id, cfg.hardware, cfg.model, env, current))
        return Verdict("updated", message=f"baseline written: {path}")
    stored = baseline.load(path)
    if stored is None:
        return Verdict("no-baseline", message=f"no comparable baseline for {cfg.hardware}/{cfg.model} (looked for {path})")
    verdict = baseline.compare(stored, current, tol, cfg.tolerance)
    return verdict


def failure_text(verdict: Verdict, env: Mapping[str, Any]) -> str:
    lines = [f"llmperf: regression against the stored baseline ({len(verdict.regressions)} metric"
             f"{'s' if len(verdict.regressions) != 1 else ''})", baseline.format_table(verdict)]
    old = verdict.environment or {}
    for key in sorted(set(old) | set(env)):
        before, after = old.get(key), env.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            for k in sorted(set(before) | set(after)):
                if before.get(k) != after.get(k):
                    lines.append(f"  changed since the baseline: {key}.{k}: {before.get(k)} -> {after.get(k)}")
        elif before != after:
            lines.append(f"  changed since the baseline: {key}: {before} -> {after}")
    return "\n".join(lines)
