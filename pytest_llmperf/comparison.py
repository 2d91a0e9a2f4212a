"""Engines side by side: one table of the figures a framework comparison reads (throughput, TTFT and
TPOT medians and tails, KV use), one column per engine, from results measured on the same workload."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .formatting import cell
from .metrics import PerfResult

# (row name, how to read it from a result); None where the engine does not measure it: the table says "-"
ROWS: tuple[tuple[str, Callable[[PerfResult], float | int | None]], ...] = (
    ("output tokens/s", lambda r: r.throughput.output_tokens_per_s),
    ("requests/s", lambda r: r.throughput.requests_per_s),
    ("TTFT p50 ms", lambda r: r.ttft.p50),
    ("TTFT p99 ms", lambda r: r.ttft.p99),
    ("TPOT p50 ms", lambda r: r.tpot.p50),
    ("TPOT p99 ms", lambda r: r.tpot.p99),
    ("KV usage peak", lambda r: r.kv.usage_peak),
    ("KV blocks peak", lambda r: r.kv.blocks_peak),
    ("KV waste (fragmentation mean)", lambda r: r.kv.fragmentation_mean),
    ("preemptions", lambda r: r.kv.preemptions),
    ("prefix hit rate", lambda r: r.kv.prefix_hit_rate),
    ("failed requests", lambda r: r.failed),
)


def side_by_side(results: Mapping[str, PerfResult]) -> str:
    """A Markdown table, a row per figure and a column per engine (`{"vllm": r1, "llama.cpp": r2}`).
    A figure an engine does not measure reads `-`, never 0."""
    if not results:
        raise ValueError("side_by_side needs at least one result: {label: PerfResult, ...}")
    names = list(results)
    lines = ["| figure | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for row, read in ROWS:
        lines.append(f"| {row} | " + " | ".join(cell(read(results[n])) for n in names) + " |")
    return "\n".join(lines)
