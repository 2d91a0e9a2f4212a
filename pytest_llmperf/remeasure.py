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
    suspects = verdict.worth_measuring_again() & set(_result_indices(perf))
    first = set(suspects)
    for n in range(1, retries + 1):
        if not suspects:
            break
        try:
            current = best_of_more_passes(perf, current, suspects, 1, salt=n, fresh_start=True)
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


def best_of_more_passes(perf: LLMPerf, current: Sequence[Entry], labels: set[str], times: int, salt: int = 1,
                        fresh_start: bool = False) -> list[Entry]:
    """`current` with each result named in `labels` measured `times` more and replaced by its best
    (`baseline.best_of`) of the valid ones; sweep capacities are derived, not measured, and stay as they are. With
    `fresh_start`, each engine involved is started again first (once, for all its results)."""
    indices = _result_indices(perf)
    out = list(current)
    wanted = [pos for pos, e in enumerate(out) if e.label in labels and e.label in indices]
    started: list[Any] = []
    for pos in sorted(wanted, key=lambda pos: _restart_order(perf, indices[out[pos].label])):
        entry = out[pos]
        i = indices[entry.label]
        if fresh_start and not any(perf.runs[i].engine is e for e in started):
            started.append(perf.restart_engine(i))
        passes = [perf.remeasure(i, salt + k) for k in range(times)]
        # a pass that failed a request, or whose client fell behind, clears nothing
        again = [baseline.result_entry(replace(perf.runs[i], result=r), i) for r in passes if not (r.invalid or r.failed)]
        out[pos] = baseline.best_of([entry, *again])
    return out


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
