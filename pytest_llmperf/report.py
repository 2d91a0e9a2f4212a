"""Reports: `results.json` (machine-readable, versioned), `summary.md` (GitHub-flavoured markdown, also
appended to `$GITHUB_STEP_SUMMARY`), and the comparison of two results files. Knows nothing of engines
or pytest: it reads plain records the plugin hands over.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import baseline
from .assertions import format_margin
from .baseline import Entry, strict_json
from .formatting import apart, cell, change

RESULTS_SCHEMA = 1
HEADLINE = (("p99_ttft_ms", "TTFT p99 ms"), ("p99_tpot_ms", "TPOT p99 ms"), ("p99_itl_ms", "ITL p99 ms"),
            ("output_tokens_per_s", "out tok/s"), ("kv_fragmentation_max", "KV frag max"),
            ("kv_preemptions", "preempt"), ("gpu_memory_peak_gib", "GPU GiB"))


@dataclass
class TestRecord:
    """One test's outcome and every result it recorded."""

    test: str
    outcome: str
    baseline: str = "-"
    baseline_rows: list[dict[str, Any]] = field(default_factory=list)
    baseline_uncompared: dict[str, str] = field(default_factory=dict)  # label -> no-baseline / stale / other-engine / not-produced
    results: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    sweeps: list[dict[str, Any]] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)  # PNG paths, relative to the report folder
    limits: list[dict[str, Any]] = field(default_factory=list)  # each limit's value and margin (assertions.margins)
    gated: list[str] | None = None  # what the test's llmperf_gate marker gates; None: the default
    tolerances: dict[str, float] = field(default_factory=dict)  # its llmperf_tolerance markers, over the session's
    untimed: bool = False  # its timing reported, not gated: its baseline was measured on another CPU


def result_record(entry: Entry, summary: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """What results.json keeps of one PerfResult: enough to compare it again later."""
    return {**entry.to_dict(), "summary": dict(summary), "workload": dict(workload)}


def document(records: Sequence[TestRecord], session: Mapping[str, Any]) -> dict[str, Any]:
    return {"schema": RESULTS_SCHEMA, "session": dict(session), "tests": [asdict(r) for r in records]}


def _table(records: Sequence[TestRecord], test: Any, outcome: Any) -> list[tuple[str, ...]]:
    """The headline table, one row per result, in the column order of summary.md and the terminal alike
    (`test` and `outcome` write those cells as each medium shows them)."""
    head = ("test", "result", *(name for _, name in HEADLINE), "baseline", "outcome")
    return [head] + [(test(rec.test), result_name(res), *(cell(res["metrics"].get(k)) for k, _ in HEADLINE),
                      rec.baseline, outcome(rec.outcome))
                     for rec in records for res in rec.results]


def markdown(records: Sequence[TestRecord], session: Mapping[str, Any]) -> str:
    head, *rows = _table(records, lambda t: f"`{t}`", _outcome)
    lines = [
        "## pytest-llmperf",
        "",
        f"hardware `{session.get('hardware')}`, model `{session.get('model')}`, engine `{session.get('engine')}`",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    if not records:
        lines += ["", "No test measured in this session: none selected, each skipped, or each stopped before its "
                  "body (see pytest's own summary)."]
    curves = [(rec.test, sw) for rec in records for sw in rec.sweeps]
    if curves:
        # a curve whose largest load held has a capacity of at least that load, not found (`Sweep.capped`)
        lines += ["", "### Sweeps", "", "| test | sweep | over | capacity | under | Pareto points | best balance |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| `{t}` | {sw['label']} | {sw['kind']} {', '.join(cell(v) for v in sw['values'])} | "
                  f"{'>= ' if sw.get('capped') else ''}{cell(sw['capacity'])} | "
                  f"{', '.join(f'{k} <= {v}' for k, v in sw['under'].items()) or '-'} | "
                  f"{', '.join(cell(v) for v in sw['pareto'])} | {cell(sw['best_balance'])} |" for t, sw in curves]
    pictures = [(rec.test, p) for rec in records for p in rec.plots]
    if pictures:
        lines += ["", "### Plots", ""] + [f"- `{t}`: [{Path(p).name}]({p})" for t, p in pictures]
    gated = baseline_counts(records)
    if gated:
        lines += ["", "### Baselines", "", gated]
    moved = [(rec.test, row) for rec in records for row in rec.baseline_rows if row["metric"] == baseline.TIMELINE]
    if moved:
        lines += ["", "### Paging timelines that changed", "", "| test | result | fails | first divergence |",
                  "|---|---|---|---|"]
        lines += [f"| `{t}` | {r['label']} | {'yes' if r['verdict'] in baseline.FAILING else 'no (summary mode)'} | "
                  f"{r['reason']} |" for t, r in moved]
    for title, verdicts in (("Regressions against the stored baselines", baseline.FAILING),
                            ("Improvements against the stored baselines", {"improvement"})):
        picked = [(rec.test, row) for rec in records for row in rec.baseline_rows
                  if row["verdict"] in verdicts and row["metric"] != baseline.TIMELINE]
        if picked:
            lines += ["", f"### {title}", "", "| test | result | metric | baseline | current | change | allowed | reason |",
                      "|---|---|---|---|---|---|---|---|"]
            lines += [f"| `{t}` | {r['label']} | {r['metric']} | {' | '.join(apart(r['baseline'], r['current'], cell))} | "
                      f"{change(r['change'])} | {r['allowed']:.1%} | {r['reason'] or r['verdict']} |" for t, r in picked]
    return "\n".join(lines) + "\n"


UNREADABLE = "unreadable"  # a test's baseline status when its stored file could not be read: it errored at setup

_STANDING = (("pass", "passed"), ("regression", "regressed"), (baseline.NO_BASELINE, "had no baseline"),
             (baseline.STALE, "had a stale baseline"), (baseline.OTHER_ENGINE, "had only another engine's baseline"),
             (baseline.NOT_PRODUCED, "produced none of the results its baseline holds"),
             ("updated", "recorded"), (UNREADABLE, "had an unreadable baseline (an error before the test ran)"))


def baseline_counts(records: Sequence[TestRecord]) -> str:
    """One line: how many tests were compared with their baselines and how many were not, and why;
    the regressions and improvements found. Empty when no test met the gate (--llmperf-baseline=off)."""
    judged = [r for r in records if r.baseline != "-"]
    if not judged:
        return ""
    counts = {status: sum(r.baseline == status for r in judged) for status, _ in _STANDING}
    parts = [f"{n} {words}" for (status, words), n in zip(_STANDING, counts.values()) if n]
    # a test whose limits failed or whose result was invalid never reaches its baseline: counted, not lost
    before = sum(r.baseline == "-" and r.outcome in ("failed", "invalid") for r in records)
    if before:
        parts.append(f"{before} not compared (failed or invalid first)")
    partial = sum(1 for r in judged if r.baseline in ("pass", "regression") and r.baseline_uncompared)
    if partial:
        parts.append(f"{partial} compared in part (a result without a usable baseline)")
    rows = [row for r in judged for row in r.baseline_rows]
    timelines = [row for row in rows if row["metric"] == baseline.TIMELINE]
    rows = [row for row in rows if row["metric"] != baseline.TIMELINE]
    worse = sum(row["verdict"] in baseline.FAILING for row in rows)
    # an exact metric that moved for the better is "changed": counted once, among the failing above
    better = sum(row["verdict"] == "improvement" for row in rows)
    unfailable = sum(row["verdict"] == "not-gated" and row["reason"].startswith(baseline.UNFAILABLE) for row in rows)
    few = sum(row["verdict"] == "not-gated" for row in rows) - unfailable
    untimed = sum(r.untimed for r in judged)
    if untimed:
        parts.append(f"{untimed} with timing reported, not gated (a baseline of another CPU, or one naming none)")
    tests = len(judged) + before
    return (f"baselines: {tests} test{'s' if tests != 1 else ''}: " + ", ".join(parts)
            + f"; {worse} metric{'s' if worse != 1 else ''} regressed or changed, {better} improved"
            + (f"; {len(timelines)} paging timeline{'s' if len(timelines) != 1 else ''} changed" if timelines else "")
            + (f"; {few} percentile{'s' if few != 1 else ''} not gated (too few samples for them)" if few else "")
            + (f"; {unfailable} metric{'s' if unfailable != 1 else ''} not gated (allowed a fall of 100% or more: "
               "could not fail)" if unfailable else ""))


def write(directory: Path, records: Sequence[TestRecord], session: Mapping[str, Any]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    # a record names only the pictures that exist: one that failed, or a session stopped before they were drawn
    records = [replace(r, plots=[p for p in r.plots if (directory / p).exists()]) for r in records]
    results, summary = directory / "results.json", directory / "summary.md"
    results.write_text(json.dumps(strict_json(document(records, session)), indent=1, sort_keys=True, default=str,
                                  allow_nan=False) + "\n")
    text = markdown(records, session)
    summary.write_text(text)
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        with open(step, "a") as f:
            f.write(text)
    return [results, summary]


# -- comparing two results files -----------------------------------------------------------------
def load(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable results file ({e})") from None
    if isinstance(data, dict) and "entries" in data and "tests" not in data:
        raise ValueError(f"{path}: a stored baseline, not a results.json: give the results.json that "
                         "--llmperf-report wrote (to judge a run against stored baselines, run pytest with "
                         "--llmperf-baseline=compare)")
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA or not isinstance(data.get("tests"), list) \
            or not isinstance(data.get("session"), dict):
        raise ValueError(f"{path}: not a pytest-llmperf results.json of schema {RESULTS_SCHEMA} (written by --llmperf-report)")
    return data


def result_name(res: Mapping[str, Any]) -> str:
    return res["label"] + (" (partial)" if res.get("summary", {}).get("partial") else "") + _trace_note(res)


def _trace_note(res: Mapping[str, Any]) -> str:
    """A replayed trace's requests clipped or skipped to fit: the result measured less than the trace."""
    trace = (res.get("workload") or {}).get("trace") or {}
    changed = [f"{trace[k]} {k}" for k in ("clipped", "skipped") if trace.get(k)]
    return f" (trace: {', '.join(changed)})" if changed else ""


def _outcome(outcome: str) -> str:
    return {"passed": "pass", "failed": "**FAIL**", "invalid": "**INVALID**"}.get(outcome, outcome)


_ROW_WORDS = {"regression": "regressed", "changed": "changed (improved)", "improvement": "improved"}


def _turn_text(turn: Mapping[str, Any]) -> str:
    cached = turn["prefix_cached_share"]
    return (f"turn {turn['turn']}: {turn['requests']} requests, TTFT p50 {cell(turn['ttft']['p50'])} ms "
            f"p99 {cell(turn['ttft']['p99'])} ms" + (f", prefix cached {cached:.0%}" if cached is not None else ""))


def _ttfo_text(summary: Mapping[str, Any]) -> str:
    ttfo, ttft = summary["ttfo"], summary["ttft"]
    answers = (f"first answer token (TTFO) p50 {cell(ttfo['p50'])} ms p99 {cell(ttfo['p99'])} ms over {ttfo['count']} "
               "answers" if ttfo["count"] else "no answer began (all output was reasoning)")
    return (f"{summary['reasoned']} sequences streamed reasoning first; {answers}; TTFT, reasoning tokens counted as "
            f"output, p50 {cell(ttft['p50'])} ms p99 {cell(ttft['p99'])} ms")


def terminal_lines(records: Sequence[TestRecord]) -> list[str]:
    """The session's llmperf section of the terminal summary: the headline table (the columns and
    number format of summary.md), each test's limit margins, the baseline counts and every metric
    that moved against its baseline."""
    rows = _table(records, str, str)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    for rec in records:
        if rec.limits:
            shown = [format_margin(m) + (f" [{m['result']}]" if len(rec.results) > 1 else "") for m in rec.limits]
            lines.append(f"  limits of {rec.test}: " + "; ".join(shown))
        for i, result in enumerate(rec.results):
            summary = result.get("summary", {})
            if summary.get("by_turn"):
                lines.append(f"  turns of {rec.test} [{result.get('label') or i}]: "
                             + "; ".join(map(_turn_text, summary["by_turn"])))
            if summary.get("reasoned"):
                lines.append(f"  reasoning of {rec.test} [{result.get('label') or i}]: {_ttfo_text(summary)}")
    gated = baseline_counts(records)
    if gated:
        lines.append(gated)
    for rec in records:
        for row in rec.baseline_rows:
            if row["metric"] == baseline.TIMELINE:
                lines.append(f"  paging timeline {row['verdict']}: {rec.test} {row['label']!r}: {row['reason']}")
                continue
            kind = _ROW_WORDS.get(row["verdict"])
            if kind is not None:
                lines.append(f"  {kind}: {rec.test} {row['label']!r} {row['metric']} "
                             f"{' -> '.join(apart(row['baseline'], row['current'], cell))} ({change(row['change'])})")
    return lines
