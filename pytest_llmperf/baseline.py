"""The baseline store and the comparison rules. Knows nothing of engines or pytest.

One small JSON file per test, hardware class and model under `baselines/`, sorted keys and rounded
floats so that a pull-request diff reads well. Each result of a test (its label) is judged on its own:
comparable only when it was recorded with the same engine (vllm, hf, openai) and the workload hash
matches. The engine version and configuration are recorded and shown, never part of the key (a vLLM
upgrade or a config change is exactly what the gate judges).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paging_timeline, quantiles, stats
from .formatting import apart, change, number, pair

SCHEMA = 1
DEFAULT_TOLERANCE = 0.10
SIGNIFICANCE = 0.05  # Mann-Whitney U across repeats, as asv uses

# metric -> True when higher is better
COMPARED: dict[str, bool] = {
    "p50_ttft_ms": False, "p90_ttft_ms": False, "p99_ttft_ms": False, "p50_tpot_ms": False, "p90_tpot_ms": False,
    "p99_tpot_ms": False, "p99_itl_ms": False, "p99_e2e_ms": False,
    # time to a reasoning model's answer (TTFT where nothing reasoned): longer reasoning moves it, not TTFT
    "p50_ttfo_ms": False, "p99_ttfo_ms": False,
    "output_tokens_per_s": True, "requests_per_s": True,
    "kv_fragmentation_max": False, "kv_fragmentation_mean": False, "kv_usage_peak": False, "kv_blocks_peak": False,
    "kv_preemptions": False, "kv_prefix_hit_rate": True, "gpu_memory_peak_gib": False,
    "capacity": True,  # of a sweep: the largest load whose latency limits hold
}
PAGING = frozenset(k for k in COMPARED if k.startswith("kv_"))
TIMING = frozenset(k for k in COMPARED if k.endswith("_ms") or k.endswith("_per_s"))
# What fails a test without being asked (docs/baselines.md, "Which metrics gate"): throughput, the medians, memory,
# capacity and the paging of deterministic workloads. The other percentiles are reported, and gated
# where a test or the command line gives them a tolerance: unchanged H200 reruns moved p99 TTFT of 16
# requests by 16% and p99 ITL by 29% between engine starts (docs/performance.md, false alarms).
GATED_BY_DEFAULT = frozenset({"p50_ttft_ms", "p50_tpot_ms", "output_tokens_per_s", "requests_per_s",
                              "gpu_memory_peak_gib", "capacity"}) | PAGING

TIMELINE = "kv_timeline"  # the row of a deterministic result whose step timeline moved (its steps, old and new)
# what `@pytest.mark.llmperf_gate(...)` may name besides single metrics
GATE_GROUPS: dict[str, frozenset[str]] = {"paging": PAGING | {TIMELINE}, "memory": frozenset({"gpu_memory_peak_gib"}),
                                          "timing": TIMING, "capacity": frozenset({"capacity"})}


def gated_metrics(names: Sequence[str]) -> frozenset[str]:
    """The metrics `llmperf_gate(*names)` gates: groups expanded, metric names (either spelling) as given."""
    out: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"{name!r} is not a metric or group name")
        if name in GATE_GROUPS:
            out |= GATE_GROUPS[name]
        elif metric_name(name) in COMPARED or name == TIMELINE:
            out.add(metric_name(name))
        else:
            raise ValueError(f"unknown metric or group {name!r}; groups: {', '.join(GATE_GROUPS)}; "
                             f"metrics: {', '.join(COMPARED)}")
    return frozenset(out)


def gates_timing(gated: frozenset[str] | None) -> bool:
    """Whether a test's gate (None: the default) judges any timing metric."""
    return gated is None or bool(gated & TIMING)


def untimed(gated: frozenset[str] | None, tolerances: Mapping[str, float]) -> frozenset[str]:
    """What a test's gate (None: the default) gates once its timing cannot be compared: all but timing and
    capacity (the largest load whose latency limits hold)."""
    base = GATED_BY_DEFAULT | set(tolerances) | {TIMELINE} if gated is None else gated
    return frozenset(base - TIMING - {"capacity"})


CPU_KEY = "cpu"  # a CPU run's environment names its CPU (cpu.cpu_name)


def other_cpu(stored: Mapping[str, Any], env: Mapping[str, Any]) -> str:
    """Why a CPU run's timing cannot be compared with its baseline's: the baseline was measured on another CPU
    (or names none: recorded before CPUs were named); "" where both name the same one or this run names
    none (a GPU run: its hardware class names the card)."""
    now, before = env.get(CPU_KEY), stored.get(CPU_KEY)
    if not now or before == now:
        return ""
    return (f"timing and capacity reported, not gated: the baseline was measured on {before or 'a CPU it does not name'}"
            f", this run on {now}, and timing on one CPU says nothing of another's (paging is still gated); "
            "record this machine's baselines with --llmperf-baseline=update")


def cpu_gate(stored: Mapping[str, Any], env: Mapping[str, Any], gated: frozenset[str] | None,
             tolerances: Mapping[str, float]) -> tuple[frozenset[str] | None, str]:
    """(what a comparison gates, the note that says why timing is not) for a baseline's environment against a
    run's: the gate unchanged and "" on the same CPU, else `untimed` and `other_cpu`'s note."""
    elsewhere = other_cpu(stored, env)
    return (untimed(gated, tolerances), elsewhere) if elsewhere else (gated, "")


def gates(metric: str, gated: frozenset[str] | None, tolerances: Mapping[str, float]) -> bool:
    """Whether a comparison fails on `metric`: exactly what a test's `llmperf_gate` names, else the
    defaults and what a tolerance names."""
    return (metric in GATED_BY_DEFAULT or metric in tolerances) if gated is None else metric in gated


def recorded_gate(test: Mapping[str, Any]) -> frozenset[str] | None:
    """A results.json test record's `llmperf_gate` (None: the default)."""
    return frozenset(test["gated"]) if test.get("gated") is not None else None


def recorded_tolerances(test: Mapping[str, Any], session: Mapping[str, float]) -> dict[str, float]:
    """A results.json test record's per-metric tolerances as its gate judged with them: the session's, under its
    own llmperf_tolerance markers'."""
    return {**session, **{metric_name(k): float(v) for k, v in (test.get("tolerances") or {}).items()}}


def recorded_tolerance(results: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
    """The tolerance a results.json session judged with: the default and the per-metric ones."""
    default, per_metric = results["session"].get("tolerance", [DEFAULT_TOLERANCE, {}])
    return float(default), dict(per_metric)


PAGING_MODES = ("strict", "summary")  # --llmperf-paging: does a moved timeline fail, or only the summaries

# how one label of a test stands against the stored baseline
COMPARED_LABEL, NO_BASELINE, STALE, OTHER_ENGINE = "compared", "no-baseline", "stale", "other-engine"
# a result the baseline holds and this run did not produce (the test no longer records it, or its engine died)
NOT_PRODUCED = "not-produced"
UNCOMPARED = (STALE, OTHER_ENGINE, NO_BASELINE, NOT_PRODUCED)  # the order a test's status names them in
# row verdicts that fail the test: worse beyond the allowance, or deterministic paging that moved at all
FAILING = frozenset({"regression", "changed"})


def metric_name(key: str) -> str:
    """A compared metric's name from either spelling: `p99_ttft_ms` or `ttft_p99`."""
    m = re.fullmatch(r"(ttft|tpot|itl|e2e|ttfo)_(p\d+|mean|max)", key)
    return f"{m.group(2)}_{m.group(1)}_ms" if m else key


def parse_tolerance(text: str) -> tuple[float, dict[str, float]]:
    """`--llmperf-tolerance`: a fraction for every timing metric, metric=fraction pairs for some, or
    both, comma-separated: "0.10", "0.10,output_tokens_per_s=0.05", "ttft_p99=0.2". ValueError says
    what is wrong."""
    default, per_metric = DEFAULT_TOLERANCE, {}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        key, _, value = part.rpartition("=")
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not fraction >= 0:
            raise ValueError(f"tolerance {part!r}: give a fraction >= 0, e.g. 0.10 or output_tokens_per_s=0.05")
        if not key:
            default = fraction
        elif metric_name(key.strip()) in COMPARED:
            per_metric[metric_name(key.strip())] = fraction
        else:
            raise ValueError(f"tolerance {part!r}: unknown metric {key.strip()!r}; compared metrics: {', '.join(COMPARED)}")
    return default, per_metric


def unfailable(default: float, per_metric: Mapping[str, float]) -> dict[str, float]:
    """The higher-is-better metrics a tolerance of 1 or more leaves unable to fail (a rate falls at most
    100%), with that tolerance: those it gates by default and those given one by name (paging takes none
    unless named: exact, or reported)."""
    rates = (m for m, higher in COMPARED.items()
             if higher and ((m in GATED_BY_DEFAULT and m not in PAGING) or m in per_metric))
    return {m: t for m in rates if (t := per_metric.get(m, default)) >= 1}


class BaselineError(Exception):
    """A baseline file that cannot be used; never silently replaced."""


@dataclass(frozen=True)
class Entry:
    """One recorded result of a test (a test may record several, told apart by label)."""

    label: str
    workload_hash: str
    deterministic: bool  # offline workload with a fixed KV budget: paging compares exactly
    metrics: Mapping[str, float | None]
    per_repeat: Sequence[Mapping[str, float | None]]
    noise: Mapping[str, float] = field(default_factory=dict)  # 95% interval half-widths of latency percentiles
    passes: int = 1  # measurements this entry is the best of (`best_of`)
    engine: str = ""  # vllm, hf, openai: part of the key ("" in files written before it was recorded)
    # independent samples behind each latency metric's percentiles ({"ttft": 48, "itl": 310}); a
    # percentile with too few is not gated ({} in files written before it was recorded)
    samples: Mapping[str, int] = field(default_factory=dict)
    # the gated timing metrics of every pass this entry is the best of, when it is the best of several
    # (a baseline's passes span two engine starts: how far starts land apart, per metric)
    pass_metrics: Sequence[Mapping[str, float]] = ()
    # a deterministic result's paging timeline (`paging_timeline.Timeline.to_dict`: hash, steps, events)
    timeline: Mapping[str, Any] = field(default_factory=dict)
    # per metric, the least allowance unchanged runs in other CI jobs showed it needs (`calibration.py`);
    # only a stored baseline has one, and recording it again drops it
    calibration: Mapping[str, float] = field(default_factory=dict)
    # the deviations (worse +) of the runs that gave each allowance, so that later runs add to them
    calibration_runs: Mapping[str, Sequence[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "workload_hash": self.workload_hash, "deterministic": self.deterministic,
                "metrics": _rounded(self.metrics), "per_repeat": [_rounded(p) for p in self.per_repeat],
                "noise": _rounded(self.noise), "passes": self.passes, "engine": self.engine,
                "samples": dict(self.samples), "pass_metrics": [_rounded(p) for p in self.pass_metrics],
                **({"timeline": dict(self.timeline)} if self.timeline else {}),
                **({"calibration": dict(self.calibration)} if self.calibration else {}),
                **({"calibration_runs": {k: list(v) for k, v in self.calibration_runs.items()}}
                   if self.calibration_runs else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        return cls(d["label"], d["workload_hash"], bool(d["deterministic"]), dict(d["metrics"]),
                   [dict(p) for p in d.get("per_repeat", [])], dict(d.get("noise", {})), int(d.get("passes", 1)),
                   str(d.get("engine", "")), {k: int(v) for k, v in d.get("samples", {}).items()},
                   [dict(p) for p in d.get("pass_metrics", [])], dict(d.get("timeline", {})),
                   {k: float(v) for k, v in d.get("calibration", {}).items()},
                   {k: [float(x) for x in v] for k, v in d.get("calibration_runs", {}).items()})

    def each_pass(self) -> list[Mapping[str, float]]:
        """The timing metrics of each pass: recorded ones, or this entry's own when it is one pass."""
        if self.pass_metrics:
            return list(self.pass_metrics)
        return [{k: v for k, v in self.metrics.items() if k in TIMING and v is not None}] if self.passes == 1 else []


def best_of(entries: Sequence[Entry]) -> Entry:
    """One result measured several times, as the best value each compared metric reached (per repeat
    too): what the engine can do on this machine. A busy host only ever slows a pass, while a real
    regression slows every pass, so a regression is a change that even the best pass shows. Noise is
    the largest any pass carried: the best of several is never judged more tightly than one."""
    first = entries[0]
    if any(e.workload_hash != first.workload_hash or e.label != first.label for e in entries):
        raise ValueError("best_of takes measurements of one result: same label and workload")
    per_repeat = [_best([e.per_repeat[i] for e in entries]) for i in range(min(len(e.per_repeat) for e in entries))]
    noise = {k: max(e.noise.get(k, 0.0) for e in entries) for e in entries for k in e.noise}
    samples = {k: min(e.samples.get(k, 0) for e in entries) for k in first.samples}
    return Entry(first.label, first.workload_hash, all(e.deterministic for e in entries),
                 _best([e.metrics for e in entries]), per_repeat, noise, sum(e.passes for e in entries), first.engine,
                 samples, [p for e in entries for p in e.each_pass()], first.timeline)


def _best(measured: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    out = dict(measured[0])
    for metric, higher_better in COMPARED.items():
        values = [m[metric] for m in measured if m.get(metric) is not None]
        if values:
            out[metric] = max(values) if higher_better else min(values)
    return out


@dataclass(frozen=True)
class Row:
    """One compared metric: what the regression table prints."""

    label: str
    metric: str
    baseline: float | None  # None: the baseline holds none (a gated metric's row then fails: `_one_side_missing`)
    current: float | None  # None: this run measured none (a gated metric's row then fails: `_one_side_missing`)
    allowed: float  # relative tolerance applied
    # "ok", "regression", "improvement", "changed" (deterministic paging moved the better way: fails too),
    # "reported" (not gated by default, or paging under timed arrivals: shown, fails only where a test
    # gives it a tolerance), "not-gated" (a gated percentile of too few samples, or a higher-is-better
    # metric allowed 100% or more, which no fall could exceed: the reason says so)
    verdict: str
    reason: str = ""
    exact: bool = False  # a deterministic paging metric: measuring again cannot change it
    passes: int = 1  # passes behind `current`: above 1, it is the best value any of them reached

    @property
    def change(self) -> float | None:
        if self.current is None or self.baseline is None:
            return None
        return (self.current - self.baseline) / abs(self.baseline) if self.baseline else math.inf * (self.current != 0)


@dataclass(frozen=True)
class Verdict:
    """A test against its baseline. `status`: "regression" when any row fails, else "pass" when some
    label was compared, else why none was ("stale", "other-engine", "no-baseline"); "updated" after a
    write. `labels` says how each label stood, so an uncompared one never hides another's regression."""

    status: str
    rows: tuple[Row, ...] = ()
    message: str = ""
    environment: Mapping[str, Any] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # label -> COMPARED_LABEL or one of UNCOMPARED
    # label -> (baseline's, current) step timeline of each deterministic result whose timeline moved
    timelines: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = field(default_factory=dict)
    untimed: bool = False  # timing reported, not gated: the baseline was measured on another CPU (other_cpu)

    @property
    def regressions(self) -> tuple[Row, ...]:
        """The rows that fail the test (FAILING)."""
        return tuple(r for r in self.rows if r.verdict in FAILING)

    @property
    def improvements(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.verdict in ("improvement", "changed") and r.metric != TIMELINE)

    @property
    def timeline_changes(self) -> tuple[Row, ...]:
        """Deterministic results whose step timeline moved, failing or reported (`--llmperf-paging`)."""
        return tuple(r for r in self.rows if r.metric == TIMELINE)

    @property
    def uncompared(self) -> dict[str, str]:
        return {label: s for label, s in self.labels.items() if s != COMPARED_LABEL}

    def worth_measuring_again(self) -> set[str]:
        """Labels whose regressions could all be noise: no exact paging change (it fails whatever another
        pass shows) and no memory (an engine of one configuration holds the same memory each start, and a
        best-of would hide memory that grew in one pass)."""
        other = {r.label for r in self.regressions if r.exact or r.metric == "gpu_memory_peak_gib"}
        return {r.label for r in self.regressions} - other


# -- storage ---------------------------------------------------------------------------------------
def strict_json(value: Any) -> Any:
    """`value` with every NaN or infinity made null: JSON has no such numbers, and `JSON.parse`, jq and
    most parsers outside Python reject the `NaN` Python writes by default (a change from 0 to 0, say)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def _safe(text: str) -> str:
    """`text` with every run of characters a file name cannot hold made one `_`."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")


def slug(text: str) -> str:
    return _safe(text)[:180]


def file_name(test_id: str) -> str:
    """A test's baseline file name: its id with unsafe characters made `_`; an id longer than a file name may
    be ends in a hash of the whole id, so that two long ids alike in their first 171 characters (parameters
    spelled out) do not share a file. Ids alike but for their unsafe characters still map to one name, which
    `load` and `claimed_by` catch."""
    name = _safe(test_id)
    if len(name) <= 180:
        return name
    return f"{name[:171]}-{hashlib.sha1(test_id.encode()).hexdigest()[:8]}"


def folder_for(root: Path, hardware: str, model: str) -> Path:
    """Where the baselines of one hardware class and model live."""
    return root / slug(hardware) / slug(model)


def path_for(root: Path, test_id: str, hardware: str, model: str) -> Path:
    return folder_for(root, hardware, model) / f"{file_name(test_id)}.json"


def claimed_by(path: Path) -> str | None:
    """The test a readable baseline file was written for; None where there is no such file (an unreadable one is
    what an update writes over)."""
    try:
        data = load(path)
    except BaselineError:
        return None
    return data.get("test") if data is not None else None


def shared_file(path: Path, holder: str, test_id: str) -> BaselineError:
    return BaselineError(f"baseline {path} was written for {holder!r}, not {test_id!r}: the two test ids map to one "
                         "file name; give one of them another id (pytest.param(..., id=...)), then record it with "
                         "--llmperf-baseline=update")


def load(path: Path, test_id: str | None = None) -> dict[str, Any] | None:
    """The stored baseline (of `test_id`, when given), None when there is none; BaselineError for a file that
    cannot be trusted, or that another test's id wrote (two ids alike but for characters a file name cannot
    hold)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BaselineError(f"baseline {path} is unreadable ({e}); fix or delete it, then rerun with "
                            "--llmperf-baseline=update") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("entries"), list):
        raise BaselineError(f"baseline {path} is not a pytest-llmperf schema-{SCHEMA} baseline; "
                            "delete it and rerun with --llmperf-baseline=update")
    for k, entry in enumerate(data["entries"]):
        try:  # its structure, now: a missing key surfaced as a KeyError inside the gate, naming no file
            parsed = Entry.from_dict(entry)
            for values in (parsed.metrics, *parsed.per_repeat, *parsed.pass_metrics):
                wrong = next((f"{name}={v!r}" for name, v in values.items() if not _number_or_none(v)), None)
                if wrong:
                    raise ValueError(f"{wrong} is not a number")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise BaselineError(f"baseline {path} has a malformed result (entry {k}: {type(e).__name__}: {e}); fix "
                                "or delete it, then rerun with --llmperf-baseline=update") from None
    if test_id is not None and data.get("test") not in (None, test_id):
        raise shared_file(path, data["test"], test_id)
    return data


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def write(path: Path, document: Mapping[str, Any]) -> None:
    """Atomic: write a temporary file beside the target, then rename it over the target."""
    text = json.dumps(strict_json(document), indent=1, sort_keys=True, allow_nan=False) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise BaselineError(f"cannot write baseline {path}: {e.strerror or e}; make the baselines folder "
                            "writable or point --llmperf-baseline-dir elsewhere") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def document(test_id: str, hardware: str, model: str, environment: Mapping[str, Any],
             entries: Sequence[Entry]) -> dict[str, Any]:
    return {"schema": SCHEMA, "test": test_id, "hardware": hardware, "model": model,
            "environment": dict(environment), "entries": [e.to_dict() for e in entries]}


def _rounded(metrics: Mapping[str, float | None]) -> dict[str, float | None]:
    # 6 significant digits: stable in diffs, far below any noise we judge
    return {k: _round(v) for k, v in sorted(metrics.items()) if k in COMPARED or k == "error_rate"}


def _round(value: Any) -> Any:
    return float(f"{value:.6g}") if isinstance(value, float) else value


# -- comparison ------------------------------------------------------------------------------------
def environment_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, old, new) of each setting two environments differ in, named down to the setting as a dotted key
    (`engine_config.max_num_seqs`, `engines.vllm.engine_version`)."""
    before, after = _flat(old), _flat(new)
    return [(key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)]


def _flat(env: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in env.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def compare(stored: Mapping[str, Any], current: Sequence[Entry], tolerances: Mapping[str, float] | None = None,
            default_tolerance: float = DEFAULT_TOLERANCE, paging: str = "strict",
            gated: frozenset[str] | None = None, borrowed: Mapping[str, float] | None = None) -> Verdict:
    """Every label on its own: compared when the baseline holds it for the same engine and workload,
    else named as missing, stale or of another engine, while the other labels are still judged. `gated`
    (a test's `llmperf_gate`) replaces the default choice of what fails: the rest is reported. `borrowed`:
    per metric, the allowance a result without a calibration of its own takes from its suite
    (`calibration.suite_allowances`)."""
    tolerances = tolerances or {}
    by_label = {e["label"]: Entry.from_dict(e) for e in stored["entries"]}
    rows: list[Row] = []
    labels: dict[str, str] = {}
    notes: list[str] = []
    for cur in current:
        old = by_label.get(cur.label)
        stands, note = standing(old, cur)
        labels[cur.label] = stands
        if stands == COMPARED_LABEL:
            rows.extend(_compare_entry(old, cur, tolerances, default_tolerance, paging, gated,  # type: ignore[arg-type]
                                       borrowed))
        else:
            notes.append(note)
    for label in sorted(by_label.keys() - labels.keys()):  # judged too: a result that went missing never passes unseen
        labels[label] = NOT_PRODUCED
        notes.append(f"the baseline holds result {label!r}, which this run did not produce (or its engine died "
                     f"during it); {DROPPED_HINT}")
    if any(r.verdict in FAILING for r in rows):
        status = "regression"
    elif COMPARED_LABEL in labels.values():
        status = "pass"
    else:
        status = next((s for s in UNCOMPARED if s in labels.values()), NO_BASELINE)
    moved = {r.label for r in rows if r.metric == TIMELINE}
    # both step timelines, for the picture of where they part (a run whose paging is no longer exact has none)
    timelines = {e.label: (by_label[e.label].timeline, e.timeline) for e in current
                 if e.label in moved and e.timeline and by_label[e.label].timeline}
    return Verdict(status, tuple(rows), message="\n".join(notes), environment=stored.get("environment"), labels=labels,
                   timelines=timelines)


RECORD_HINT = "rerun with --llmperf-baseline=update to record the new workload"
DROPPED_HINT = "if the test no longer measures it, rerun with --llmperf-baseline=update to record what it measures"
HINTS = (RECORD_HINT, DROPPED_HINT)  # what closes an uncompared result's note: `require` gives the command instead


def standing(old: Entry | None, cur: Entry) -> tuple[str, str]:
    """(how `cur` stands against its stored entry, the line that says why it was not compared)."""
    if old is None:
        return NO_BASELINE, f"no baseline entry for {cur.label!r}"
    if old.engine and cur.engine and old.engine != cur.engine:
        return OTHER_ENGINE, (f"{cur.label!r}: the baseline was recorded with engine {old.engine}, this run used "
                              f"{cur.engine}: no comparable baseline")
    if old.workload_hash != cur.workload_hash:
        return STALE, (f"stale baseline: workload of {cur.label!r} changed ({old.workload_hash} -> {cur.workload_hash})"
                       f"; {RECORD_HINT}")
    return COMPARED_LABEL, ""


def _compare_entry(old: Entry, cur: Entry, tolerances: Mapping[str, float], default: float,
                   paging: str = "strict", gated: frozenset[str] | None = None,
                   borrowed: Mapping[str, float] | None = None) -> list[Row]:
    rows = []
    deterministic = old.deterministic and cur.deterministic
    for metric, higher_better in COMPARED.items():
        b, c = old.metrics.get(metric), cur.metrics.get(metric)
        if b is None and (c is None or metric not in old.metrics or metric == "capacity"):
            continue  # nothing on either side, or a baseline that never named it; no capacity is a result: no load held
        if b is None or c is None:
            rows.extend(_one_side_missing(cur, metric, None if b is None else _round(b), None if c is None else _round(c),
                                          deterministic, tolerances, default, gated))
            continue
        b, c = _round(b), _round(c)  # both as stored, so an unchanged run compares equal
        rows.append(_row(old, cur, metric, b, c, higher_better, deterministic, tolerances, default, gated, borrowed))
    if deterministic:
        rows.extend(_timeline_rows(old, cur, paging if gated is None or TIMELINE in gated else "summary"))
    elif old.deterministic:
        rows.extend(_no_longer_deterministic(old, cur, tolerances, gated))
    return rows


def _no_longer_deterministic(old: Entry, cur: Entry, tolerances: Mapping[str, float],
                             gated: frozenset[str] | None) -> list[Row]:
    """A baseline of exact paging (a fixed KV pool: vLLM's num_gpu_blocks_override) against a run whose paging is
    not: every paging metric would turn to "reported" and the timeline go unchecked, so a test gating paging
    gated nothing of it, silently. One row says so, and fails where paging is gated."""
    if not any(gates(m, gated, tolerances) for m in PAGING | {TIMELINE}):
        return []
    reason = ("the baseline's paging was exact (a fixed KV pool, e.g. vLLM's num_gpu_blocks_override) and this run's "
              "is not, so its paging cannot be compared: fix the pool again, or record the baseline again if the "
              "change is meant")
    steps = len(paging_timeline.Timeline.from_dict(old.timeline).steps) if old.timeline else 0
    return [Row(cur.label, TIMELINE, float(steps), None, 0.0, "changed", reason, exact=True, passes=cur.passes)]


def _timeline_rows(old: Entry, cur: Entry, paging: str) -> list[Row]:
    """A deterministic result's step timeline against the baseline's: silent when the hashes match,
    else one row naming the first step that differs. It fails the test under `paging="strict"`; under
    "summary" it is reported and only the summary paging metrics gate."""
    if not old.timeline or not cur.timeline or paging_timeline.digest(old.timeline) == paging_timeline.digest(cur.timeline):
        return []
    a, b = paging_timeline.Timeline.from_dict(old.timeline), paging_timeline.Timeline.from_dict(cur.timeline)
    reason = paging_timeline.first_divergence(a, b) or ""
    verdict = "changed" if paging == "strict" else "reported"
    return [Row(cur.label, TIMELINE, float(len(a.steps)), float(len(b.steps)), 0.0, verdict, reason, exact=True)]


def _judged(metric: str, deterministic: bool, tolerances: Mapping[str, float], gated: frozenset[str] | None) -> bool:
    """Whether `metric` can fail this result: the test's gate (or the defaults and what a tolerance names) names
    it, and it is not paging under timed arrivals without a tolerance of its own (that varies run to run: an
    unchanged H200 rerun moved fragmentation max by 16%; shown, gated only where a test asks)."""
    timed_paging = metric in PAGING and metric not in tolerances and not deterministic
    return gates(metric, gated, tolerances) and not timed_paging


def _one_side_missing(cur: Entry, metric: str, b: float | None, c: float | None, deterministic: bool,
                      tolerances: Mapping[str, float], default: float, gated: frozenset[str] | None) -> list[Row]:
    """A metric one side holds no value of: a gated one fails, one only reported is left out. This run measured
    none of it (a check of nothing never passes: a sweep whose every load broke its limits has no capacity, a card
    NVML could not read no memory peak), or the baseline stored none (NVML or the paging recorder could not read
    when it was recorded: a gate with nothing to compare with would pass every later run unseen)."""
    if not _judged(metric, deterministic, tolerances, gated):
        return []
    exact = metric in PAGING and metric not in tolerances
    if c is not None:
        reason = (f"the baseline holds no value of this gated metric (not measured when it was recorded), this run "
                  f"measured {number(c)}: record the baseline again with --llmperf-baseline=update")
    elif metric == "capacity":
        reason = f"no load held the latency limits this run (the baseline's capacity {number(b)})"
    else:
        reason = (f"not measured this run (the baseline holds {number(b)}): a gated metric with no value cannot pass; "
                  "the test's output says why it is missing")
    return [Row(cur.label, metric, b, c, 0.0 if exact else tolerances.get(metric, default), "regression", reason,
                exact, cur.passes)]


def _row(old: Entry, cur: Entry, metric: str, b: float, c: float, higher_better: bool, deterministic: bool,
         tolerances: Mapping[str, float], default: float, gated: frozenset[str] | None = None,
         borrowed: Mapping[str, float] | None = None) -> Row:
    asked = metric in tolerances
    gated_paging = metric in PAGING and not asked
    exact = gated_paging and deterministic
    given = tolerances.get(metric, default)
    tol = 0.0 if exact else given
    calibrated = ""
    if not exact:
        # never tighter than the noise: the spread of this run's repeats, the uncertainty of a
        # percentile of few samples (the order-statistic intervals of both runs, added), how far the
        # baseline's own passes, across two engine starts, landed apart on this metric, or how far
        # unchanged runs in other jobs landed from it (its calibration; a result without one, a test
        # added or recorded again since, takes its suite's: machines differ for it too)
        noise = max(tol, _spread(cur.per_repeat, metric), cur.noise.get(metric, 0.0) + old.noise.get(metric, 0.0),
                    _spread(_but_the_worst(old.each_pass(), metric, higher_better), metric))
        own = bool(old.calibration)
        allowance = (old.calibration if own else borrowed or {}).get(metric, 0.0)
        if allowance > noise:
            calibrated = " (calibrated)" if own else " (the suite's calibration: this result has none)"
        tol = max(noise, allowance)
    worse = (c < b) if higher_better else (c > b)
    change = abs(c - b) / abs(b) if b else (math.inf if c != b else 0.0)

    def row(verdict: str, reason: str = "") -> Row:
        return Row(cur.label, metric, b, c, tol, verdict, reason, exact, cur.passes)

    # a test's llmperf_gate says exactly what gates; without one, the defaults and what a tolerance names
    if not _judged(metric, deterministic, tolerances, gated):
        return row("reported")
    too_few = _too_few_samples(old, cur, metric)
    if too_few:
        return row("not-gated", too_few)
    if higher_better and tol >= 1 and (worse or change <= tol):
        # a fall is at most 100%: an allowance that large passes anything, so the row must not read "ok"
        # (a rise beyond it is still an improvement)
        return row("not-gated", f"{UNFAILABLE}: allowed {tol:.0%} and a fall is at most 100% "
                                f"({_too_wide(calibrated, given >= 1)})")
    if c == b or change <= tol:
        return row("ok")
    if exact:
        reason = f"paging changed: {metric} {pair(b, c)}"
        if not worse:
            reason += (f" ({'higher' if higher_better else 'lower'} is better: an improvement, but the paging of an "
                       "offline workload must match its baseline exactly; record it with --llmperf-baseline=update)")
        return row("regression" if worse else "changed", reason)
    if not worse:
        return row("improvement")
    if not stats.significant(old.per_repeat, cur.per_repeat, metric, higher_better, SIGNIFICANCE):
        return row("ok", "within noise (not significant across repeats)")
    reason = f"{'down' if higher_better else 'up'} {change:.1%}, allowed {tol:.1%}{calibrated}"
    if cur.passes > 1:
        reason += f", in every one of {cur.passes} passes"
    return row("regression", reason)


UNFAILABLE = "not gated: it could not fail"


def _too_wide(calibrated: str, tolerance_too_wide: bool) -> str:
    """Where an allowance of 100% or more came from, and what to do to gate the metric again."""
    if calibrated:
        return ("its calibration: unchanged runs landed that far apart; calibrate again from runs on quiet runners "
                "(python -m pytest_llmperf calibrate)")
    if tolerance_too_wide:
        return "its tolerance; give this metric one below 1 (e.g. output_tokens_per_s=0.65) to gate it"
    return ("its passes or engine starts spread that wide; record the baseline again on a quiet runner, or quieten "
            "the runner, to gate it")


def _too_few_samples(old: Entry, cur: Entry, metric: str) -> str:
    """Why a percentile is not gated (too few samples on either side), or "" when it can be."""
    parsed = quantiles.percentile_of(metric)
    if parsed is None:
        return ""
    name = parsed[1]
    counts = [e.samples[name] for e in (old, cur) if name in e.samples]
    if not counts:
        return ""
    return quantiles.not_gated(metric, min(counts)) or ""


def _but_the_worst(passes: Sequence[Mapping[str, float | None]], metric: str,
                   higher_better: bool) -> Sequence[Mapping[str, float | None]]:
    """A baseline's passes without the worst on `metric` of those before the last, where three or more hold it: the
    entry is their best, so that pass never set the baseline's value, and one stalled pass (p50 TTFT 1 s among
    passes of 10 ms) would widen the allowance until no regression could fail it. The last pass, the one in a
    fresh engine start (`remeasure.recorded`), always stays: how far two starts land apart is its to show."""
    held = [p for p in passes if p.get(metric) is not None]
    if len(held) < 3:
        return passes
    worst = (min if higher_better else max)(held[:-1], key=lambda p: p[metric])  # type: ignore[arg-type,return-value]
    return [p for p in held if p is not worst]


def _spread(per_repeat: Sequence[Mapping[str, float | None]], metric: str) -> float:
    values = [p[metric] for p in per_repeat if p.get(metric) is not None]
    if len(values) < 2:
        return 0.0
    mid = sorted(values)[len(values) // 2]
    return (max(values) - min(values)) / abs(mid) if mid else 0.0


def format_table(verdict: Verdict) -> str:
    head = ("result", "metric", "baseline", "current", "change", "allowed", "reason")
    rows = [head] + [
        (r.label or "-", r.metric, *apart(r.baseline, r.current), change(r.change), f"{r.allowed:.1%}",
         r.reason or r.verdict)
        for r in verdict.rows if _shown(r)
    ]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    return "\n".join("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _shown(row: Row) -> bool:
    """A row the regression table shows: not a plain pass, or one with something to say."""
    return row.verdict not in ("ok", "reported") or bool(row.reason)


def cut_short(result: Mapping[str, Any]) -> bool:
    """A `results.json` result whose engine died during it (partial) or whose measurement was invalid (a
    client behind its schedule, an engine saturated: a capacity curve's point over capacity): never compared."""
    summary = result.get("summary") or {}
    return bool(summary.get("partial") or summary.get("invalid"))


def compare_results(old: Mapping[str, Any], new: Mapping[str, Any], tolerance: float,
                    tolerances: Mapping[str, float] | None = None, paging: str = "strict") -> tuple[str, bool, int]:
    """Two `results.json` documents (`--llmperf-report`): the regression table of every test present in
    both, with the baseline rules (`tolerances`: per metric, over `tolerance`; `paging`: whether a moved step
    timeline fails), whether any regressed, and how many tests had a result compared (a changed workload,
    label or engine compares none)."""
    before = {t["test"]: t for t in old["tests"] if t["results"]}
    out, regressed, compared = [], False, 0
    for test in new["tests"]:
        if not test["results"]:
            continue
        prior = before.get(test["test"])
        if prior is None:
            out.append(f"{test['test']}: new test, nothing to compare")
            continue
        stored = {"entries": [r for r in prior["results"] if not cut_short(r)], "environment": prior.get("environment")}
        tol = recorded_tolerances(test, tolerances or {})  # as its gate judged: its markers' over the command line's
        gated, elsewhere = cpu_gate(prior.get("environment") or {}, test.get("environment") or {},
                                    recorded_gate(test), tol)
        verdict = compare(stored, [Entry.from_dict(r) for r in test["results"] if not cut_short(r)], tol, tolerance,
                          paging, gated=gated)
        regressed |= verdict.status == "regression"
        compared += COMPARED_LABEL in verdict.labels.values()
        message = "; ".join(m for m in (elsewhere, verdict.message) if m)
        out.append(f"{test['test']}: {verdict.status}{' - ' + message if message else ''}")
        if any(_shown(r) for r in verdict.rows):
            out.append(format_table(verdict))
        if verdict.status == "regression":  # what changed around it, as the gate's own failure says
            out += [f"  changed since the baseline: {key}: {a} -> {b}"
                    for key, a, b in environment_changes(prior.get("environment") or {}, test.get("environment") or {})]
    gone = sorted(set(before) - _measured(new))
    out += [f"{test_id}: in the old report only, not compared" for test_id in gone]
    return "\n".join(out), regressed, compared


def _measured(doc: Mapping[str, Any]) -> set[str]:
    """The tests of a `results.json` document that recorded results."""
    return {t["test"] for t in doc["tests"] if t["results"]}


# -- a measured result as an entry --------------------------------------------------------------
def result_entry(run: Any, index: int) -> Entry:
    """The entry of one run (`runner.Run`: its result, workload and engine)."""
    result, workload, engine = run.result, run.workload, run.engine
    # paging repeats exactly only when the whole batch is handed over at once and the KV pool does not
    # depend on the machine's free memory: then its step timeline is kept too
    deterministic = workload.is_offline and engine.fixed_kv_budget
    steps = result.kv.steps
    return Entry(label=label_of(result, index), workload_hash=result.workload_hash,
                 deterministic=deterministic, metrics=result.flat(),
                 per_repeat=list(result.per_repeat), noise=dict(result.noise), engine=engine.name,
                 samples=dict(result.samples), timeline=steps.to_dict() if deterministic and steps and steps.steps else {})


def label_of(result: Any, index: int) -> str:
    return result.label or str(index)
