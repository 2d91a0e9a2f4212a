"""A test's verdict, in the order the plugin gives it: inputs checked before the test runs (limit
markers, engine options, the baseline file), then, once its body passed, whether its results are a
valid measurement, whether its limits hold (a suspected violation measured again: `remeasure`), and
how it compares with its baseline (`gating`). Also the record of the test that the reports keep.

Plain tests and the baseline gate are judged here after the test; a property test's examples are
judged inside the test body (`properties.checker`), by the same limit checks and re-measurement.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import activation, assertions, gating, markers, properties, remeasure
from .assertions import Limit, MarkerError
from .baseline import load as load_baseline
from .baseline import path_for, slug
from .paging_timeline import Timeline, divergence_step
from .report import HEADLINE, UNREADABLE, TestRecord, result_record
from .runner import LLMPerf
from .selection import uses_plugin
from .session import LIMITS, SESSION, Session, engine_options, gate_option, model_option
from .soak import baseline_id
from .validity import over_capacity

UNREADABLE_BASELINE = pytest.StashKey[bool]()

if TYPE_CHECKING:
    from .plots import Picture


@dataclass(frozen=True)
class Judgement:
    """What failed a test (None: nothing), and how: "perf" (a limit or the baseline: PERF-FAILED),
    "invalid" (not a valid measurement: PERF-INVALID) or "error" (bad input, a missing baseline under
    require); the baseline verdict and notes for the test's report."""

    failure: str | None = None
    kind: str = ""
    verdict: gating.Verdict | None = None
    notes: tuple[tuple[str, str], ...] = ()


# -- before the test -----------------------------------------------------------------------------------
def check_inputs(item: pytest.Item) -> None:
    """Limit markers, engine options, the GPUs the engine needs and the baseline file, checked before any
    engine starts: bad input fails this test with one line, not after it measured for minutes."""
    try:
        item.stash[LIMITS] = limits(item)
        engine_options(item)
        model_option(item)
        gate_option(item)
        activation.check_gpus(item)
        _check_baseline_file(item)
        return
    except (MarkerError, gating.BaselineError) as e:
        error = f"llmperf: {item.nodeid}: {e}"
    # failed outside the handler: inside it, pytest would print the error again as the failure's context
    pytest.fail(error, pytrace=False)


def limits(item: pytest.Item) -> list[Limit]:
    state = item.config.stash[SESSION]
    found = [limit for mark in item.iter_markers() if mark.name in assertions.MARKERS
             for limit in assertions.parse(mark.name, mark.args, mark.kwargs, state.hardware, state.hardware_classes)]
    curve = next((lim for lim in found if lim.on_sweeps), None)
    if curve is not None and properties.is_property_test(item):  # its examples are judged one llmperf.run at a time
        raise MarkerError(f"@pytest.mark.{curve.marker} judges a sweep's capacity, and a property test's examples are "
                          "judged one llmperf.run each: put the sweep and its min_capacity in a plain test")
    return found


def _check_baseline_file(item: pytest.Item) -> None:
    gate = item.config.stash[SESSION].gate
    if not uses_plugin(item):
        return
    # in every mode: an update would otherwise measure first and then lose what it measured to the error
    gating.tolerances([m.kwargs for m in item.iter_markers(markers.TOLERANCE)])
    if gate.mode in ("off", "update"):
        return
    try:
        test_id = baseline_id(item)
        load_baseline(path_for(gate.root, test_id, gate.hardware, gate.model), test_id)
    except gating.BaselineError:
        item.stash[UNREADABLE_BASELINE] = True  # the summary counts it beside the baselines compared
        raise


def unreadable_baseline_record(item: pytest.Item) -> TestRecord | None:
    """The record of a test that errored before its body on an unreadable baseline file, else None."""
    return TestRecord(item.nodeid, "error", UNREADABLE) if item.stash.get(UNREADABLE_BASELINE, False) else None


# -- after the test --------------------------------------------------------------------------------------
def judge(item: pytest.Item, perf: LLMPerf | None) -> Judgement:
    """The verdict of a test whose body passed: validity, then limits, then the baseline."""
    state = item.config.stash[SESSION]
    test_id = baseline_id(item)  # what its baseline is found by (a soak round's id without its round)
    invalid = _invalid(item.nodeid, perf)
    if invalid:
        return Judgement("\n".join([invalid, *_changes(state, test_id, perf)]), "invalid")
    failure, kind, notes = _limits_verdict(item.nodeid, item.stash.get(LIMITS, []), perf, state.retries)
    notes += _resent_note(perf) + _capped_note(perf)
    if failure is not None and kind == "perf":
        also = gating.beside_failed_limits(state.gate, test_id)
        failure = "\n".join([failure, *_changes(state, test_id, perf), *([f"  {also}"] if also else [])])
    if failure is not None or perf is None:
        return Judgement(failure, kind, None, notes)
    gated = _gate(test_id, perf, state, _tolerance_marks(item), gate_option(item))
    return Judgement(gated.failure, gated.kind, gated.verdict, notes + gated.notes)


def _changes(state: Session, test_id: str, perf: LLMPerf | None) -> list[str]:
    """`changed since the baseline: ...` lines of a test that failed before its baseline comparison."""
    if perf is None or not perf.results:
        return []
    env = gating.environment(perf, state.hardware, state.gpu, state.model_spec)
    return gating.changes_before_comparing(state.gate, test_id, env)


def _invalid(test_id: str, perf: LLMPerf | None) -> str:
    """Why this test's results are not a valid measurement (validity.py); "" when they are. An invalid
    result is neither judged against limits nor compared with or written to a baseline."""
    over = over_capacity(perf.sweeps if perf else [])
    bad = [(r.label or str(i), r.invalid) for i, r in enumerate(perf.results if perf else [])
           if r.invalid and r.label not in over]
    if not bad:
        return ""
    return (f"llmperf: {test_id}: not a valid measurement (neither judged nor gated, no baseline written):\n"
            + "\n".join(f"  result {label!r}: {why}" for label, why in bad))


def _resent_note(perf: LLMPerf | None) -> tuple[tuple[str, str], ...]:
    """Which results had requests sent a second time (a connection that failed before any answer): their
    TTFT counts from the first send, so the wait for the failed connection is in it."""
    resent = [(r.label or str(i), r.resent, r.n_requests * r.repeats) for i, r in enumerate(perf.results if perf else [])
              if r.resent]
    if not resent:
        return ()
    lines = [f"result {label!r}: {n} of {total} requests sent again after their connection failed before any "
             "answer (their TTFT counts from the first send)" for label, n, total in resent]
    return (("llmperf requests", "\n".join(lines)),)


def _capped_note(perf: LLMPerf | None) -> tuple[tuple[str, str], ...]:
    """Sweeps whose largest load held: their capacity is a lower bound (a baseline of it cannot show a gain)."""
    capped = [s for s in (perf.sweeps if perf else []) if s.capped]
    if not capped:
        return ()
    return (("llmperf sweeps", "\n".join(
        f"sweep {s.label!r}: its largest {s.kind}, {max(s.values):g}, held every limit: the capacity is at least that, "
        f"not found; {'raise hi' if s.searched else 'add larger loads'} to find it" for s in capped)),)


def _limits_verdict(test_id: str, limits: list[Limit], perf: LLMPerf | None,
                    retries: int) -> tuple[str | None, str, tuple[tuple[str, str], ...]]:
    """(failure text, kind, notes) of a test's limit markers against its results."""
    sweeps = perf.sweeps if perf is not None else []
    in_sweeps = perf.sweep_labels if perf is not None else set()
    # sweep points are judged as a curve (min_capacity), not one by one: overload is their purpose
    results = [r for r in perf.results if r.label not in in_sweeps] if perf is not None else []
    curve_limits = [lim for lim in limits if lim.on_curve(sweeps)]
    point_limits = [lim for lim in limits if lim not in curve_limits]
    if limits and not results and not sweeps:
        names = sorted({lim.marker.split("(")[0] for lim in limits})
        return (f"llmperf: {test_id} has limit markers ({', '.join(names)}) but recorded no result: "
                "call llmperf.run(engine, workload) in the test body", "error", ())
    if not results and not sweeps:
        return None, "", ()
    if point_limits and not results:
        names = sorted({lim.marker.split("(")[0] for lim in point_limits})
        return (f"llmperf: {test_id}: {', '.join(names)} judge llmperf.run results, and this test recorded only "
                "sweeps; judge a curve with @pytest.mark.min_capacity(..., under={...})", "error", ())
    if results:
        point_limits = assertions.with_default_error_limit(point_limits)
    try:
        violations = assertions.check(point_limits if results else [], results)
        violations, notes = remeasure.limits_measured_again(perf, point_limits, violations, retries)
        on_curves, curve_notes = remeasure.curves_measured_again(perf, curve_limits, retries)
        violations, notes = violations + on_curves, notes + curve_notes
    except MarkerError as e:
        return f"llmperf: {test_id}: {e}", "error", ()
    notes += assertions.sample_notes(point_limits, results)
    if not violations:
        return None, "", ((("llmperf limits", "\n".join(notes)),) if notes else ())
    text = "\n".join([assertions.format_violations(violations), *(f"  {n}" for n in notes)])
    errors = [e for r in results for e in r.errors][:5]
    if errors:
        text += "\n  failed requests: " + "; ".join(errors)
    return text, "perf", ()


def _gate(test_id: str, perf: LLMPerf, state: Session, tolerance_marks: list[dict[str, Any]],
          gated: frozenset[str] | None) -> Judgement:
    """Baseline comparison (or update) of a test whose limits held."""
    try:
        tol = gating.tolerances(tolerance_marks)
        env = gating.environment(perf, state.hardware, state.gpu, state.model_spec)
        verdict = gating.gate(test_id, perf, state.gate, env, tol, gated)
    except gating.BaselineError as e:
        return Judgement(f"llmperf: {test_id}: {e}", "error")
    if verdict is not None and verdict.status == "regression":
        return Judgement(gating.failure_text(verdict, env), "perf", verdict)
    unmet = gating.unmet_requirement(verdict, state.gate, test_id)
    if unmet is not None:
        return Judgement(unmet, "error", verdict)
    notes = (("llmperf baseline", verdict.message),) if verdict is not None and verdict.message else ()
    return Judgement(None, "", verdict, notes)


def _tolerance_marks(item: pytest.Item) -> list[dict[str, Any]]:
    """The test's llmperf_tolerance markers' keywords, the one closest to the function last (it wins)."""
    return [m.kwargs for m in reversed(list(item.iter_markers(markers.TOLERANCE)))]


# -- the test's record -----------------------------------------------------------------------------------
def record(item: pytest.Item, perf: LLMPerf, outcome: str, judgement: Judgement) -> TestRecord:
    """What the reports keep of a test (results.json, summary.md, the terminal table); its pictures are
    planned here and drawn at the session's end."""
    state = item.config.stash[SESSION]
    verdict = judgement.verdict
    results = [result_record(gating.result_entry(run, i), run.result.to_dict(), run.workload.to_dict())
               for i, run in enumerate(perf.runs)]
    rows = [{**asdict(r), "change": r.change} for r in verdict.rows] if verdict is not None else []
    rec = TestRecord(item.nodeid, "invalid" if judgement.kind == "invalid" else outcome,
                     verdict.status if verdict is not None else "-", rows,
                     dict(verdict.uncompared) if verdict is not None else {}, results,
                     gating.environment(perf, state.hardware, state.gpu, state.model_spec), [s.summary() for s in perf.sweeps])
    gated = gate_option(item)
    rec.gated = sorted(gated) if gated is not None else None
    with contextlib.suppress(gating.BaselineError):  # a bad marker failed the test with its message already
        rec.tolerances = gating.tolerances(_tolerance_marks(item))
    rec.untimed = verdict is not None and verdict.untimed
    rec.limits = assertions.margins(item.stash.get(LIMITS, []), [r for r in perf.results if r.label not in perf.sweep_labels],
                                    perf.sweeps)
    if state.report_dir is not None and perf.runs:  # drawn when the session's tests are done (draw_pictures)
        planned = _pictures(item.nodeid, perf, state.report_dir, verdict)
        state.pictures += planned
        rec.plots = [str(p.path.relative_to(state.report_dir)) for p in planned]
    return rec


def junit_properties(perf: LLMPerf) -> list[tuple[str, float]]:
    """Headline metrics as JUnit XML properties (`llmperf.<label>.<metric>`)."""
    out = []
    for i, result in enumerate(perf.results):
        prefix = f"llmperf.{result.label or i}."
        flat = result.flat()
        out += [(prefix + key, round(flat[key], 4)) for key, _ in HEADLINE if flat.get(key) is not None]
    return out


def _pictures(test_id: str, perf: LLMPerf, report_dir: Path, verdict: gating.Verdict | None) -> list[Picture]:
    from . import plots  # matplotlib only when pictures are drawn

    timelines = []
    for label, (old, new) in (verdict.timelines if verdict is not None else {}).items():
        a, b = Timeline.from_dict(old), Timeline.from_dict(new)
        timelines.append((label, a, b, divergence_step(a, b)))
    return plots.pictures(slug(test_id), perf.results, perf.sweeps, report_dir / "plots", timelines)


def draw_pictures(state: Session) -> list[str]:
    """Every picture the session's tests planned, drawn side by side once no engine measures; why each
    that failed could not be drawn (a picture must never fail a measured test)."""
    if not state.pictures:
        return []
    from . import plots

    try:
        with state.pool.times.timed("plots"):
            return plots.draw_all(state.pictures)
    except Exception as e:  # noqa: BLE001 - the verdicts and the report go on without pictures
        return [f"none drawn: {type(e).__name__}: {e}"]
    finally:
        state.pictures.clear()
