"""Measuring a suspected regression again: the one policy behind limit markers, property-test
examples and the baseline gate.

A busy host or an unlucky engine start slows some passes; a regression slows all of them. So a result
that fails on what could be noise (timing, not paging or errors) is measured again, up to `retries`
times, on its engine (limits, property examples) or in a fresh start of it (the baseline gate, whose
baseline was recorded in another start), and judged by its best pass. A pass whose client fell behind
its schedule (validity.py) offered less load than the test asked for: it clears nothing. Change how that
works here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from . import assertions, baseline
from .assertions import Limit, MarkerError, Violation
from .baseline import Entry, Verdict
from .metrics import PerfResult
from .runner import LLMPerf
from .sweep import Sweep, SweepPoint, holds


# -- limits (markers and property-test examples) -----------------------------------------------------
def violations_that_hold(limits: Sequence[Limit], violations: list[Violation], offline: bool,
                         again: Callable[[int], PerfResult], retries: int) -> tuple[list[Violation], int]:
    """One result's violations that hold in every measurement, and how many measurements were made:
    while they could be noise, the result is measured again (`again(n)` for the n-th time), up to
    `retries` times, and none are left once one measurement violates no limit."""
    measured, first = 1, violations
    if violations and assertions.could_be_noise(violations, offline):
        for n in range(1, retries + 1):
            result = again(n)
            measured += 1
            if result.invalid:  # a client that fell behind offered less load: it clears nothing
                continue
            violations = assertions.check(limits, [result])
            if not violations or not assertions.could_be_noise(violations, offline):
                break  # a pass within every limit clears them; one that failed requests (never noise) holds them
    # what fails is shown with the first pass's values, the pass the summary table and results.json
    # show; a limit only a later pass broke is shown with that pass's value
    still, broke_first = [v.limit for v in violations], [v.limit for v in first]
    return ([v for v in first if v.limit in still] + [v for v in violations if v.limit not in broke_first]), measured


def limits_measured_again(perf: LLMPerf | None, limits: list[Limit], violations: list[Violation],
                      retries: int) -> tuple[list[Violation], list[str]]:
    """A test's violations that hold in every measurement, result by result, with a note for each
    result measured again (held in all passes, or cleared as noise)."""
    if perf is None or not violations:
        return violations, []
    kept, notes = [], []
    for i, run in enumerate(perf.runs):
        result = run.result
        mine = [v for v in violations if v.result is result]
        if not mine:
            continue
        name = repr(result.label) if result.label else f"result {i}"
        try:
            left, measured = violations_that_hold(limits, mine, run.workload.is_offline,
                                                  lambda salt, i=i: perf.remeasure(i, salt), retries)
        except MarkerError:
            raise
        except Exception as e:  # noqa: BLE001 - judged on what was measured; the engine's error is shown
            notes.append(f"could not measure {name} again ({type(e).__name__}: {e}); judged on the passes measured")
            left = mine
        else:
            if measured > 1:
                notes.append(f"{name} violated limits in all {measured} measurements (the values above are the "
                             "first pass's, as in the summary table)" if left else
                             f"{name} violated a limit in its first pass and none when measured again "
                             f"({measured} passes): noise, not a regression")
        kept += left
    return kept, notes


# -- capacity limits (min_capacity) --------------------------------------------------------------------
def curves_measured_again(perf: LLMPerf | None, limits: list[Limit], retries: int) -> tuple[list[Violation], list[str]]:
    """The curve limits' violations that hold in every measurement, with a note for each curve measured again:
    a capacity below its limit is judged again with each point that cut the curve short (up to the limit) measured
    again on its engine, up to `retries` times, a point holding where any of its passes held. One noisy pass used
    to lower a capacity by a whole step of the curve and fail the test at once."""
    sweeps = perf.sweeps if perf is not None else []
    violations = assertions.check_sweeps(limits, sweeps)
    if perf is None:
        return violations, []
    kept, notes = [], []
    for violation in violations:
        curve = next(s for s in sweeps if s.points[-1].result is violation.result)
        if not violation.limit.on_sweeps:  # the best throughput per GiB: not a capacity
            kept.append(violation)
            continue
        try:
            left, passes = _capacity_that_holds(perf, violation.limit, curve, retries)
        except MarkerError:
            raise
        except Exception as e:  # noqa: BLE001 - judged on what was measured; the engine's error is shown
            notes.append(f"could not measure sweep {curve.label!r} again ({type(e).__name__}: {e}); judged on the "
                         "passes measured")
            left, passes = [violation], 1
        kept += [violation] if left else []
        if passes > 1:
            notes.append(f"sweep {curve.label!r}: its capacity fell short of @pytest.mark.{violation.limit.marker} in all {passes} "
                         "measurements of the points that cut it (the value above is the first pass's)" if left else
                         f"sweep {curve.label!r}: its capacity fell short of @pytest.mark.{violation.limit.marker} in its first "
                         f"pass and held it when the points that cut it were measured again ({passes} passes): noise, "
                         "not a regression")
    return kept, notes


def _capacity_that_holds(perf: LLMPerf, limit: Limit, curve: Sweep, retries: int) -> tuple[list[Violation], int]:
    """The limit's violations of the curve left once the points that cut it short are measured again (up to `retries`
    times, until none is left), and the passes the worst of those points got."""
    curve = replace(curve, under=dict(limit.under) or dict(curve.under))
    passes = 1
    for n in range(1, retries + 1):
        cut = _points_that_cut(curve, limit.bound)
        if not cut:
            break
        curve = _with_points_held(curve, more_passes(perf, {p.result.label for p in cut}, 1, salt=n))
        passes += 1
        if not assertions.check_sweeps([limit], [curve]):
            break
    return assertions.check_sweeps([limit], [curve]), passes


# -- the baseline gate ---------------------------------------------------------------------------------
def judged_against_baseline(stored: Mapping[str, Any], perf: LLMPerf, current: Sequence[Entry], tol: Mapping[str, float],
          default_tolerance: float, retries: int, paging: str = "strict",
          gated: frozenset[str] | None = None, borrowed: Mapping[str, float] | None = None) -> Verdict:
    """The comparison (`borrowed`: the suite's allowances, `baseline.compare`), with a second look at a
    regression that could be noise: a result that regresses on timing metrics only is measured again, up
    to `retries` times, each time in a fresh start of its engine, and judged by its best pass. A baseline
    was recorded in another engine start (another CI job), and starts differ where the passes of one
    start agree; a busy host or an unlucky start slows some passes, a regression slows all of them
    (docs/performance.md, false alarms)."""
    verdict = baseline.compare(stored, current, tol, default_tolerance, paging, gated, borrowed)
    suspects = verdict.worth_measuring_again() & (set(_result_indices(perf)) | {s.capacity_label for s in perf.sweeps})
    first, curves = set(suspects), {s.label: s for s in perf.sweeps}
    for n in range(1, retries + 1):
        if not suspects:
            break
        try:
            current, curves = _measured_again(perf, current, suspects, curves, _baseline_capacities(verdict), salt=n)
        except Exception as e:  # noqa: BLE001 - judged on what was measured; the engine's error is shown
            return replace(verdict, message=_joined(verdict.message, f"could not measure {', '.join(sorted(suspects))} "
                                                    f"again ({type(e).__name__}: {e}); judged on the passes measured"))
        verdict = baseline.compare(stored, current, tol, default_tolerance, paging, gated, borrowed)
        suspects &= verdict.worth_measuring_again()
    cleared = first - {r.label for r in verdict.regressions}
    if cleared:
        passes = {e.label: e.passes for e in current}
        verdict = replace(verdict, message=_joined(verdict.message, "; ".join(
            f"{label!r} regressed in its first pass and was measured again: the best of {passes[label]} passes "
            "is within tolerance (noise, not a regression)" for label in sorted(cleared))))
    return verdict


def _measured_again(perf: LLMPerf, current: Sequence[Entry], suspects: set[str], curves: dict[str, Sweep],
                    capacities: Mapping[str, float], salt: int) -> tuple[list[Entry], dict[str, Sweep]]:
    """One more look at each suspect, every engine involved started again first: a result's entry becomes
    the best of its passes, and a capacity is judged again on its curve with each point that cut it short
    (up to the baseline's capacity) measured again, a point holding where any of its passes held its limits."""
    cut = {label: points for label, curve in curves.items()
           if curve.capacity_label in suspects and curve.capacity_label in capacities
           and (points := _points_that_cut(curve, capacities[curve.capacity_label]))}
    again = more_passes(perf, suspects | {p.result.label for points in cut.values() for p in points}, 1, salt,
                        fresh_start=True)
    out = _best_of_each(perf, current, again)
    curves = {label: _with_points_held(curve, again) if label in cut else curve for label, curve in curves.items()}
    by_label = {curve.capacity_label: curve for label, curve in curves.items() if label in cut}
    return [_capacity_again(e, by_label[e.label]) if e.label in by_label else e for e in out], curves


def _baseline_capacities(verdict: Verdict) -> dict[str, float]:
    """A curve's capacity label -> the baseline's capacity, of each capacity that regressed."""
    return {r.label: r.baseline for r in verdict.regressions if r.metric == "capacity" and r.baseline is not None}


def _points_that_cut(curve: Sweep, reach: float) -> list[SweepPoint]:
    """The points that break the curve's limits below the first load of `reach` or more, that one included:
    those that must hold for its capacity to reach it. None where measuring them again could not lift it
    there: a point on the way failed a request (never noise: the curve stays cut there), or the curve is a
    bisection (`find_capacity`), whose later loads followed from its first pass's points."""
    if curve.searched:
        return []
    out = []
    for point in sorted(curve.points, key=lambda p: p.value):
        if point.result.failed:
            return []
        if not holds(point.result, curve.under):
            out.append(point)
        if point.value >= reach:
            break
    return out


def _with_points_held(curve: Sweep, again: Mapping[str, Sequence[PerfResult]]) -> Sweep:
    """The curve with each point measured again replaced by a pass that held its limits, when one did."""
    def held(point: SweepPoint) -> SweepPoint:
        passes = [r for r in again.get(point.result.label, ()) if holds(r, curve.under)]
        return SweepPoint(point.value, passes[0]) if passes and not holds(point.result, curve.under) else point
    return replace(curve, points=tuple(held(p) for p in curve.points))


def _capacity_again(entry: Entry, curve: Sweep, more: int = 1) -> Entry:
    """A capacity entry judged again on its curve's points, each the pass that held, `more` passes more."""
    return replace(entry, metrics={**entry.metrics, "capacity": curve.capacity()}, passes=entry.passes + more)


def recorded(perf: LLMPerf, current: Sequence[Entry], retries: int) -> list[Entry]:
    """What a baseline stores: each result the best of 1 + `retries` passes, the last in a fresh engine start
    (so that the file also says how far two starts land apart on each metric: a comparison always crosses
    a start), and each capacity judged on its curve with a point holding where any of its passes held, as
    the gate's second look judges the run it is compared with."""
    # a curve's points that broke its limits too, those over capacity without an entry included (a point that
    # saturated once would otherwise keep the recorded capacity cut short)
    labels = {e.label for e in current} | {p.result.label for s in perf.sweeps if s.under and not s.searched
                                            for p in s.points if not holds(p.result, s.under)}
    earlier = more_passes(perf, labels, retries - 1) if retries > 1 else {}
    last = more_passes(perf, labels, 1, salt=retries, fresh_start=True) if retries >= 1 else {}
    again = {label: [*earlier.get(label, []), *last.get(label, [])] for label in {*earlier, *last}}
    out = _best_of_each(perf, current, again)
    curves = {s.capacity_label: _with_points_held(s, again) for s in perf.sweeps if not s.searched}
    return [_capacity_again(e, curves[e.label], retries) if e.label in curves and again else e for e in out]


def _best_of_each(perf: LLMPerf, current: Sequence[Entry], again: Mapping[str, Sequence[PerfResult]]) -> list[Entry]:
    """`current` with each entry measured again the best of itself and its passes in `again`; a pass that failed a
    request, or whose client fell behind, clears nothing."""
    indices = _result_indices(perf)

    def best(entry: Entry) -> Entry:
        i = indices[entry.label]
        passes = [baseline.result_entry(replace(perf.runs[i], result=r), i) for r in again[entry.label]
                  if not (r.invalid or r.failed)]
        return baseline.best_of([entry, *passes])

    return [best(e) if e.label in again else e for e in current]


def more_passes(perf: LLMPerf, labels: set[str], times: int, salt: int = 1,
                fresh_start: bool = False) -> dict[str, list[PerfResult]]:
    """Each result named in `labels` measured `times` more (salts `salt`, `salt` + 1, ...), the passes of one
    result one after another. With `fresh_start`, each engine involved is started again first (once, for all its
    results)."""
    indices = _result_indices(perf)
    started: list[Any] = []
    out: dict[str, list[PerfResult]] = {}
    for label in sorted(labels & set(indices), key=lambda label: _restart_order(perf, indices[label])):
        i = indices[label]
        if fresh_start and not any(perf.runs[i].engine is e for e in started):
            started.append(perf.restart_engine(i))
        out[label] = [perf.remeasure(i, salt + k) for k in range(times)]
    return out


def best_of_more_passes(perf: LLMPerf, current: Sequence[Entry], labels: set[str], times: int, salt: int = 1,
                        fresh_start: bool = False) -> list[Entry]:
    """`current` with each result named in `labels` measured `times` more and replaced by its best
    (`baseline.best_of`) of the valid ones; sweep capacities are derived, not measured, and stay as they are
    (the gate's second look judges them again: `judged_against_baseline`). With `fresh_start`, each engine
    involved is started again first (once, for all its results)."""
    wanted = {e.label for e in current} & labels
    return _best_of_each(perf, current, more_passes(perf, wanted, times, salt, fresh_start))


def _restart_order(perf: LLMPerf, index: int) -> tuple[bool, int]:
    """Results of the live engine first, then those of each engine the pool has closed, grouped by
    engine: a test that measured two engines restarts each closed one once, not once per result."""
    engine = perf.runs[index].engine
    return not getattr(engine, "alive", True), next(i for i, run in enumerate(perf.runs) if run.engine is engine)


def _result_indices(perf: LLMPerf) -> dict[str, int]:
    """Baseline label -> index of the result it came from (as `entries` labels them)."""
    out: dict[str, int] = {}
    for i, run in enumerate(perf.runs):
        out.setdefault(baseline.label_of(run.result, i), i)
    return out


def _joined(*parts: str) -> str:
    return "\n".join(p for p in parts if p)
