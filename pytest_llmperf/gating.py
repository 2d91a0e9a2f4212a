"""Plugin side of baselines: a test's results become baseline entries, compared or written.

Lives beside `plugin.py` (same layer): it reads pytest's item and the session's options and hands
plain values to `baseline.py`, which knows nothing of pytest.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import baseline, calibration, markers, remeasure
from .baseline import BaselineError, Entry, Verdict, label_of, result_entry
from .cpu import cpu_name
from .runner import LLMPerf
from .validity import over_capacity

# compare: judge against the stored baseline, a missing or stale one is reported; require: as compare,
# and a test whose results are not all compared fails (the pull-request gate); update: record; off
MODES = ("compare", "require", "update", "off")


@dataclass(frozen=True)
class GateConfig:
    mode: str
    root: Path
    tolerance: float
    hardware: str
    model: str
    # a result that regresses on timing metrics only is measured this many times more, and fails only
    # if every pass regresses; a baseline is the best of 1 + retries passes
    retries: int = 2
    tolerances: Mapping[str, float] = field(default_factory=dict)  # per metric, under a test's marker
    update_args: str = ""  # options a command recording this session's baselines needs (model, hardware)
    paging: str = "strict"  # --llmperf-paging: a moved step timeline fails (strict) or is reported (summary)

    def record_command(self, test_id: str) -> str:
        return " ".join(["pytest", f"'{test_id}'", *([self.update_args] if self.update_args else []),
                         "--llmperf-baseline=update"])


def entries(perf: LLMPerf) -> list[Entry]:
    """One entry per result (sweep points included: a curve regresses when any point does) and one
    per sweep for its capacity."""
    # a bisection measures different rates each run: only its capacity can be compared
    searched = {p.result.label for s in perf.sweeps if s.searched for p in s.points}
    # a point over capacity (saturated: its percentiles measure the run's length) is compared through the capacity
    left_out = searched | over_capacity(perf.sweeps)
    points = [result_entry(run, i) for i, run in enumerate(perf.runs) if run.result.label not in left_out]
    curves = [
        Entry(label=s.capacity_label, workload_hash=_curve_hash(s), deterministic=False,
              metrics={"capacity": s.capacity()}, per_repeat=[])
        for s in perf.sweeps if s.under
    ]
    return points + curves


def _curve_hash(sweep: Any) -> str:
    points = "searched" if sweep.searched else [p.result.workload_hash for p in sweep.points]
    text = json.dumps([sweep.kind, sorted(sweep.under.items()), points])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def environment(perf: LLMPerf, hardware: str, gpu: Any, model: str | None = None) -> dict[str, Any]:
    """What the test ran on, from its runs: the engine, its version and configuration when every run used
    one engine, else `engines` with each result's (a test that compared transformers with vLLM), and the
    hardware. An engine's model is named only where it is not the session's `model` (a test that pinned
    its own with `llmperf_model`)."""
    per_label = {label_of(run.result, i): _without_model(run.environment(), model) for i, run in enumerate(perf.runs)}
    distinct = list({repr(e): e for e in per_label.values()}.values())
    env: dict[str, Any] = dict(distinct[0]) if len(distinct) == 1 else {"engines": per_label}
    env["hardware"] = hardware
    if gpu is not None:
        env.update(gpu_name=gpu.name, driver=gpu.driver, cuda=gpu.cuda)
    else:
        env[baseline.CPU_KEY] = cpu_name()
    return env


def gated(names: tuple[Any, ...] | None) -> frozenset[str] | None:
    """`@pytest.mark.llmperf_gate("paging", "memory")`: the metrics the test's baseline comparison gates,
    from the marker's arguments, or None (no marker) for the default."""
    if names is None:
        return None
    if not names:
        raise BaselineError(f"@pytest.mark.{markers.GATE}() names nothing: give groups "
                            f"({', '.join(baseline.GATE_GROUPS)}) or metric names, e.g. {markers.GATE}(\"paging\", \"memory\")")
    try:
        return baseline.gated_metrics(names)
    except ValueError as e:
        raise BaselineError(f"@pytest.mark.{markers.GATE}: {e}") from e


def _without_model(env: dict[str, Any], model: str | None) -> dict[str, Any]:
    return {k: v for k, v in env.items() if not (k == "model" and v in (model, None))}


def tolerances(marks: list[Mapping[str, Any]]) -> dict[str, float]:
    """`@pytest.mark.llmperf_tolerance(p99_ttft_ms=0.15, ttft_p99=0.15, ...)`: both spellings."""
    out: dict[str, float] = {}
    for kwargs in marks:
        for key, value in kwargs.items():
            metric = baseline.metric_name(key)
            if metric not in baseline.COMPARED:
                raise BaselineError(f"@pytest.mark.{markers.TOLERANCE}({key}=...): unknown metric; "
                                    f"compared metrics: {', '.join(baseline.COMPARED)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise BaselineError(f"@pytest.mark.{markers.TOLERANCE}({key}={value!r}): give a finite fraction >= 0, "
                                    "e.g. 0.15")
            out[metric] = float(value)
    return out


def gate(test_id: str, perf: LLMPerf, cfg: GateConfig, env: Mapping[str, Any],
         tol: Mapping[str, float], gated: frozenset[str] | None = None) -> Verdict | None:
    """Compare with (or write) this test's baseline (`gated`: what its llmperf_gate marker gates, None for
    the default). None when off; BaselineError for a bad file."""
    if cfg.mode == "off":
        return None
    path = baseline.path_for(cfg.root, test_id, cfg.hardware, cfg.model)
    # a result whose engine died during its run (a test that caught the error) is never a baseline and
    # never compared: its label stays uncompared, which --llmperf-baseline=require reports
    partial = {label_of(run.result, i) for i, run in enumerate(perf.runs) if run.result.partial}
    current = [e for e in entries(perf) if e.label not in partial]
    if cfg.mode == "update" and partial:
        raise BaselineError(f"result {', '.join(map(repr, sorted(partial)))} is partial (its engine died during the "
                            f"run); nothing written to {path}")
    if not current:
        # no result to compare (a test that skipped its run, or whose only one was cut short): a baseline that
        # holds results names each as not produced, which require fails, rather than the test passing unseen
        stored = baseline.load(path, test_id) if cfg.mode in ("compare", "require") else None
        if stored is None or not stored["entries"]:
            return None
        return baseline.compare(stored, [], {**cfg.tolerances, **tol}, cfg.tolerance, cfg.paging, gated)
    if cfg.mode == "update":
        try:
            # the extra passes of a baseline (the best of several, across a fresh start) are for timing;
            # a test that gates no timing metric records its first pass (paging repeats exactly)
            if baseline.gates_timing(gated):
                current = remeasure.recorded(perf, current, cfg.retries)
        except Exception as e:  # noqa: BLE001 - the engine's own error, reported; the old baseline stays
            raise BaselineError(f"could not measure again for the baseline ({type(e).__name__}: {e}); "
                                f"nothing written to {path}") from e
        holder = baseline.claimed_by(path)
        if holder not in (None, test_id):  # never write over another test's baseline
            raise baseline.shared_file(path, holder, test_id)
        baseline.write(path, baseline.document(test_id, cfg.hardware, cfg.model, env, current))
        return Verdict("updated", message=f"baseline written: {path}")
    stored = baseline.load(path, test_id)
    if stored is None:
        return Verdict(baseline.NO_BASELINE, message=_missing(cfg, path),
                       labels={e.label: baseline.NO_BASELINE for e in current})
    tol = {**cfg.tolerances, **tol}
    gated, elsewhere = baseline.cpu_gate(stored.get("environment") or {}, env, gated, tol)
    stored, current = _through_capacity(stored, current, perf)
    verdict = remeasure.judged_against_baseline(stored, perf, current, tol, cfg.tolerance, cfg.retries, cfg.paging,
                                                gated, calibration.borrowed(stored, cfg.root, cfg.hardware, cfg.model))
    # the other CPU's note after the verdict's own: `require` fails on the first line, which must name what is missing
    return replace(verdict, message=_joined(verdict.message, elsewhere), untimed=True) if elsewhere else verdict


def _through_capacity(stored: Mapping[str, Any], current: Sequence[Entry],
                      perf: LLMPerf) -> tuple[dict[str, Any], list[Entry]]:
    """The baseline and the run without the curve points that only one side measured because the other side's
    engine saturated there (over capacity: no entry, `entries`): such a point is compared through its curve's
    capacity, and which points past the knee saturate is noise. Named as missing, it failed `require`."""
    held = {e["label"] for e in stored["entries"]}
    mine = {e.label for e in current}
    capacities = {e["label"]: e["metrics"].get("capacity") for e in stored["entries"]}
    curves = [s for s in perf.sweeps if s.under and not s.searched and s.capacity_label in held & mine]
    # past the knee on both sides: a point the baseline's capacity covered that saturates now is a loss, named as one
    past_now = {p.result.label for s in curves for p in s.points if p.value > (s.capacity() or 0)}
    past_then = {p.result.label for s in curves for p in s.points if p.value > (capacities[s.capacity_label] or 0)}
    gone = (held - mine) & over_capacity(curves) & past_then  # saturated in this run, an entry in the baseline
    new = (mine - held) & past_now & past_then  # an entry in this run, none in the baseline: saturated there
    return ({**stored, "entries": [e for e in stored["entries"] if e["label"] not in gone]},
            [e for e in current if e.label not in new])


def unmet_requirement(verdict: Verdict | None, cfg: GateConfig, test_id: str) -> str | None:
    """Under --llmperf-baseline=require, the one line that fails a test whose results were not all
    compared (no baseline, stale, another engine's, or one the baseline holds that the run did not produce),
    with the command that records it."""
    if cfg.mode != "require" or verdict is None or not verdict.uncompared:
        return None
    # the exact command replaces the note's general hint, rather than following it
    reason = _first_line(verdict.message)
    for hint in baseline.HINTS:
        reason = reason.replace(f"; {hint}", "")
    return f"llmperf: --llmperf-baseline=require: {reason}; record it with: {cfg.record_command(test_id)}"


def beside_failed_limits(cfg: GateConfig, test_id: str) -> str | None:
    """What the baseline gate would have said of a test whose limits failed (so it never compared): under
    update, that nothing was recorded; under require, a missing baseline, which would fail it next."""
    if cfg.mode == "update":
        return "no baseline written: a test whose limits fail is not recorded"
    if cfg.mode != "require" or baseline.path_for(cfg.root, test_id, cfg.hardware, cfg.model).exists():
        return None
    return (f"--llmperf-baseline=require: no baseline for {cfg.hardware}/{cfg.model} either; "
            f"record it with: {cfg.record_command(test_id)}")


def _missing(cfg: GateConfig, path: Path) -> str:
    """Why no baseline was found, naming the hardware classes that do have one for this test."""
    elsewhere = sorted(p.parts[-3] for p in cfg.root.glob(f"*/{path.parent.name}/{path.name}") if p != path)
    also = f"; recorded for other hardware only: {', '.join(elsewhere)}" if elsewhere else ""
    return f"no baseline for {cfg.hardware}/{cfg.model} at {path}{also}"


def _first_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "") if lines else "not compared"


def _joined(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _changed(stored: Mapping[str, Any], env: Mapping[str, Any]) -> list[str]:
    return [f"  changed since the baseline: {key}: {before} -> {after}"
            for key, before, after in baseline.environment_changes(stored, env)]


def changes_before_comparing(cfg: GateConfig, test_id: str, env: Mapping[str, Any]) -> list[str]:
    """What this run's settings changed since the stored baseline, for a test that failed before its
    comparison (an invalid result, a broken limit): the change a user made is often the reason."""
    if cfg.mode not in ("compare", "require"):
        return []
    try:
        stored = baseline.load(baseline.path_for(cfg.root, test_id, cfg.hardware, cfg.model), test_id)
    except BaselineError:  # an unreadable file errors at the test's setup already
        return []
    return _changed(stored.get("environment") or {}, env) if stored is not None else []


def _counted(rows: Sequence[baseline.Row]) -> str:
    """`6 metrics, 1 paging timeline`: counted as the session's summary counts them."""
    timelines = sum(r.metric == baseline.TIMELINE for r in rows)
    metrics = len(rows) - timelines
    parts = [f"{metrics} metric{'s' if metrics != 1 else ''}"] if metrics or not timelines else []
    if timelines:
        parts.append(f"{timelines} paging timeline{'s' if timelines != 1 else ''}")
    return ", ".join(parts)


def failure_text(verdict: Verdict, env: Mapping[str, Any]) -> str:
    lines = [f"llmperf: regression against the stored baseline ({_counted(verdict.regressions)})",
             baseline.format_table(verdict)]
    if any(r.passes > 1 and not r.exact for r in verdict.regressions):
        lines.append("  current: per metric, the best value any pass reached (the summary table and results.json "
                     "show the first pass)")
    lines += _changed(verdict.environment or {}, env)
    if verdict.message:
        lines.append("  " + verdict.message.replace("\n", "\n  "))
    return "\n".join(lines)
