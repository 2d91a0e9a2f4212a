"""Calibration: how far unchanged runs, each its own CI job, landed from a baseline, per metric, stored in
the baseline as that metric's allowance.

A baseline is the best of its passes across two engine starts on one machine. What it cannot see is how
far a later job lands: another machine of the class, another day, another start. Lent H200s put the same
code's closed-loop throughput 5-13% below a baseline recorded on another one (docs/performance.md,
"Calibrated allowances"), more than any spread one machine shows. `python -m pytest_llmperf calibrate`
takes the `results.json` of K >= 3 unchanged runs compared with the stored baselines, takes each gated
timing metric's deviation from its baseline in the worse direction (the first pass, as the gate judges it
first), and stores an upper prediction bound for one more run:

    mean + t(1 - alpha / M, K - 1) * sd * sqrt(1 + 1 / K)

with M the number of calibrated metrics of the whole suite, so that the suite's false-alarm budget alpha
(5% per pull request) is split over every comparison it makes (Bonferroni). The gate then never judges
that metric more tightly (`baseline._row`); the tolerance, the repeat spread and a percentile's own
uncertainty can still judge it more loosely. Recording a test again drops its calibration (the deviations
were measured from the old values): calibrate again after an update.

Each allowance is stored with the deviations that gave it, so that runs of other machines and days can
be added later (`calibrate --add`): the bound is then computed again over all of them, and M over the
whole suite. Runs of a few machines do not know the next one (ten runs from lent H200s were too narrow
for the next machine's TTFT), so a calibration that keeps growing is the one to trust.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import baseline as bl

ALPHA = 0.05  # the suite's false-alarm budget per pull request
MIN_RUNS = 3  # a bound from fewer runs says nothing about their spread
MIN_RESULTS = 3  # a suite's calibration lends a metric's allowance only where this many results hold one
DECIMALS = 4  # allowances and the deviations they came from, as the baseline files store them


@dataclass(frozen=True)
class Allowance:
    """One metric of one result: what K unchanged runs showed, and the allowance they give."""

    test: str
    label: str
    metric: str
    deviations: tuple[float, ...]  # relative, positive = worse
    allowance: float


def worse_by(metric: str, stored: float, current: float) -> float:
    """How much worse `current` is than `stored`, relative to `stored` (negative: better)."""
    if not stored:
        return 0.0
    change = (current - stored) / abs(stored)
    return -change if bl.COMPARED[metric] else change


def bound(deviations: Sequence[float], comparisons: int, alpha: float = ALPHA) -> float:
    """The one-sided upper prediction bound of one more run's deviation (never below 0)."""
    k = len(deviations)
    if k < MIN_RUNS:
        raise ValueError(f"a calibration needs at least {MIN_RUNS} runs, got {k}")
    mean, sd = statistics.fmean(deviations), statistics.stdev(deviations)
    return max(0.0, mean + spread_factor(k, comparisons, alpha) * sd)


def spread_factor(runs: int, comparisons: int, alpha: float = ALPHA) -> float:
    """How many of the runs' standard deviations an allowance adds to their mean: t(1 - alpha / M, K - 1) *
    sqrt(1 + 1 / K). Few runs over many comparisons make it large (12 at 3 runs and 11 comparisons)."""
    from scipy.stats import t

    return float(t.ppf(1 - alpha / max(comparisons, 1), runs - 1)) * math.sqrt(1 + 1 / runs)


WIDE_FACTOR = 5.0  # beyond this many standard deviations, `calibrate` says to add runs


def deviations(root: Path, hardware: str, model: str, runs: Sequence[Mapping[str, Any]],
               tolerances: Mapping[str, float]) -> dict[tuple[str, str, str], list[float]]:
    """(test, label, metric) -> each run's deviation from the stored baseline, for the gated timing
    metrics of every result whose baseline holds it with the same workload and engine."""
    out: dict[tuple[str, str, str], list[float]] = {}
    stored: dict[str, dict[str, bl.Entry]] = {}  # each test's baseline, read once
    for run in runs:
        for test in run["tests"]:
            # errored before it ran (an unreadable baseline), or not a valid measurement (a client that fell behind
            # its schedule offered less load): nothing to learn the spread of unchanged runs from
            if not test["results"] or test.get("outcome") == "invalid":
                continue
            if test.get("untimed"):  # its timing was reported, not gated (a baseline of another CPU): no spread of this machine's
                continue
            if test["test"] not in stored:
                doc = bl.load(bl.path_for(root, test["test"], hardware, model), test["test"])
                stored[test["test"]] = {e["label"]: bl.Entry.from_dict(e) for e in doc["entries"]} if doc else {}
            by_label, gated = stored[test["test"]], bl.recorded_gate(test)
            tol = bl.recorded_tolerances(test, tolerances)  # a tail a test's own marker gates is calibrated too
            judged = {(row["label"], row["metric"]): row["baseline"] for row in test.get("baseline_rows") or []}
            for entry in (bl.Entry.from_dict(r) for r in test["results"] if not bl.cut_short(r)):
                old = by_label.get(entry.label)
                if old is None or bl.standing(old, entry)[0] != bl.COMPARED_LABEL:
                    continue
                for metric in sorted(m for m in bl.TIMING if bl.gates(m, gated, tol)):
                    b, c = old.metrics.get(metric), entry.metrics.get(metric)
                    if b is not None and c is not None:
                        was = judged.get((entry.label, metric))
                        if was is not None and not math.isclose(was, b, rel_tol=1e-9):
                            raise ValueError(f"{test['test']} {entry.label!r}: this run was compared with a {metric} of "
                                             f"{was:g}, the stored baseline holds {b:g} (recorded again since): its "
                                             "deviation is from another baseline; calibrate from runs compared with the "
                                             "baselines as they are")
                        if not (math.isfinite(b) and math.isfinite(c)):
                            raise ValueError(f"{test['test']} {entry.label!r}: {metric} is {c if math.isfinite(b) else b}, "
                                             "not a number a run or baseline of pytest-llmperf writes: leave that file out")
                        out.setdefault((test["test"], entry.label, metric), []).append(worse_by(metric, b, c))
    return out


def changed_settings(root: Path, hardware: str, model: str, run: Mapping[str, Any]) -> list[str]:
    """What a run changed against the baselines it was compared with: the engine, its version or an option
    it was started with, per test (`test: engine_config.max_num_seqs: 128 -> 4`). A calibration is of
    unchanged runs: the spread of a change would widen every allowance it touched. The machine may differ
    (its driver, its card's name, the KV blocks its memory gave): that spread is what calibration is for.
    A run kept without its environment (`benchmarks/keep_run.py`) cannot be checked and gives none."""
    out = []
    for test in run["tests"]:
        doc = bl.load(bl.path_for(root, test["test"], hardware, model), test["test"]) if test.get("environment") else None
        if doc is None or not doc.get("environment"):
            continue
        out += [f"{test['test']}: {key}: {before} -> {after}"
                for key, before, after in bl.environment_changes(doc["environment"], test["environment"])
                if _is_setting(key)]
    return out


def _is_setting(key: str) -> bool:
    name = key.rsplit(".", 1)[-1]
    return name in ("engine", "engine_version") or (".engine_config." in f".{key}" and name != "num_gpu_blocks")


def stored_deviations(root: Path, hardware: str, model: str) -> dict[tuple[str, str, str], list[float]]:
    """(test, label, metric) -> the deviations each stored calibration of this class and model came from."""
    out: dict[tuple[str, str, str], list[float]] = {}
    folder = bl.folder_for(root, hardware, model)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        doc = bl.load(path)
        for entry in map(bl.Entry.from_dict, doc["entries"] if doc else []):
            for metric, runs in entry.calibration_runs.items():
                out[(doc["test"], entry.label, metric)] = list(runs)
    return out


def suite_allowances(root: Path, hardware: str, model: str) -> dict[str, float]:
    """Per gated timing metric, the median allowance of the calibrated results of this class and model:
    what a result without a calibration of its own is allowed (a test added, or recorded again, since the
    last `calibrate`). The spread between machines and days that calibration measures is mostly the
    class's and the metric's, not one test's: on the H200 gate suite, each latency test judged with the
    median of the other tests' allowances had 6 first passes regress in 180 unchanged runs, against 13
    with none, and a 10% slowdown was caught as often (docs/performance.md, "A test no calibration has
    seen"). Empty where fewer than MIN_RESULTS results hold a calibration of the metric."""
    found: dict[str, list[float]] = {}
    folder = bl.folder_for(root, hardware, model)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = bl.load(path)
        except bl.BaselineError:
            continue  # its own test fails on it; another test's comparison does not
        for entry in doc["entries"] if doc else []:
            for metric, allowance in entry.get("calibration", {}).items():
                found.setdefault(metric, []).append(float(allowance))
    return {metric: statistics.median(a) for metric, a in sorted(found.items()) if len(a) >= MIN_RESULTS}


def borrowed(stored: Mapping[str, Any], root: Path, hardware: str, model: str) -> dict[str, float]:
    """What `baseline.compare` lends the results of `stored` that have no calibration: the suite's
    allowances, read only then (a calibrated suite's comparisons never scan its folder)."""
    if all(entry.get("calibration") for entry in stored["entries"]):
        return {}
    return suite_allowances(root, hardware, model)


def merged(stored: Mapping[tuple[str, str, str], Sequence[float]],
           new: Mapping[tuple[str, str, str], Sequence[float]]) -> dict[tuple[str, str, str], list[float]]:
    """The stored deviations with the new runs' appended, per metric."""
    out = {key: list(d) for key, d in stored.items()}
    for key, d in new.items():
        out.setdefault(key, []).extend(d)
    return out


def seen_before(stored: Mapping[tuple[str, str, str], Sequence[float]],
                run: Mapping[tuple[str, str, str], Sequence[float]]) -> bool:
    """Whether one run's every deviation already sits among the stored ones of its metric (to the four
    decimals they are stored with): the same results.json added again. A new run of a suite matching the
    stored runs on every metric by chance is not to be expected; the file keeps no run names."""
    keys = [key for key in run if key in stored]
    same = 0.51 * 10**-DECIMALS  # a stored value is the run's, rounded
    return bool(keys) and all(any(abs(d - s) <= same for s in stored[key]) for key in keys for d in run[key])


def allowances(found: Mapping[tuple[str, str, str], Sequence[float]], alpha: float = ALPHA,
               kept: int = 0) -> list[Allowance]:
    """The allowance of every metric that at least MIN_RUNS runs measured; M counts those and `kept`, the
    calibrated metrics of the suite's other tests, which keep theirs (`kept_elsewhere`): the suite's
    false-alarm budget is split over every comparison it makes, not over those calibrated this time."""
    enough = {key: tuple(d) for key, d in found.items() if len(d) >= MIN_RUNS}
    return [Allowance(*key, d, bound(d, len(enough) + kept, alpha)) for key, d in sorted(enough.items())]


def kept_elsewhere(root: Path, hardware: str, model: str, found: Mapping[tuple[str, str, str], Sequence[float]]) -> int:
    """The stored calibrated metrics of tests a calibration from `found` leaves as they are (tests it does not
    write: one recorded again and calibrated alone still shares the suite's budget with the others)."""
    rewritten = {key[0] for key, d in found.items() if len(d) >= MIN_RUNS}
    return sum(key[0] not in rewritten for key in stored_deviations(root, hardware, model))


def write(root: Path, hardware: str, model: str, calibrated: Sequence[Allowance], runs: int,
          alpha: float = ALPHA, comparisons: int | None = None) -> list[Path]:
    """Store each allowance in its baseline entry (replacing an older calibration); returns the files.
    `comparisons`: the M the allowances were split over (default: those calibrated)."""
    by_test: dict[str, list[Allowance]] = {}
    for a in calibrated:
        by_test.setdefault(a.test, []).append(a)
    written = []
    for test_id, items in sorted(by_test.items()):
        path = bl.path_for(root, test_id, hardware, model)
        stored = bl.load(path, test_id)
        if stored is None:
            continue
        for entry in stored["entries"]:
            mine = [a for a in items if a.label == entry["label"]]
            entry.pop("calibration", None)
            entry.pop("calibration_runs", None)
            if mine:
                entry["calibration"] = {a.metric: round(a.allowance, DECIMALS) for a in mine}
                entry["calibration_runs"] = {a.metric: [round(d, DECIMALS) for d in a.deviations] for a in mine}
        stored["calibrated"] = {"runs": runs, "alpha": alpha,
                                "comparisons": len(calibrated) if comparisons is None else comparisons}
        bl.write(path, stored)
        written.append(path)
    return written


def table(calibrated: Sequence[Allowance], alpha: float = ALPHA) -> str:
    """One line per metric: its runs' deviations (worse +) and the allowance they give."""
    lines = [f"{'test':<52} {'result':<8} {'metric':<20} {'runs':>4} {'worst':>7} {'allowed':>8}"]
    for a in calibrated:
        lines.append(f"{a.test.split('::')[-1][:52]:<52} {a.label[:8]:<8} {a.metric:<20} {len(a.deviations):>4} "
                     f"{max(a.deviations):>+7.1%} {a.allowance:>8.1%}")
    if calibrated:
        runs = min(len(a.deviations) for a in calibrated)
        factor = spread_factor(runs, len(calibrated), alpha)
        lines.append(f"each allowance: the runs' mean worse deviation + {factor:.1f} standard deviations of them "
                     f"({runs} runs, {len(calibrated)} comparisons over the suite)")
        if factor > WIDE_FACTOR:
            lines.append(f"warning: {runs} runs are few for {len(calibrated)} comparisons: allowances this wide can let a "
                         "real regression pass; add unchanged runs (calibrate --add) to narrow them")
    return "\n".join(lines)
