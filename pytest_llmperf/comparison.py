"""Engines side by side: one table of the figures a framework comparison reads (throughput, TTFT and
TPOT medians and tails, KV use), one column per engine, from results measured on the same workload."""

from __future__ import annotations

from collections.abc import Mapping

from .formatting import cell
from .metrics import PerfResult

# (flat metric name, as `PerfResult.flat()` and results.json name it; row label). A figure the engine does
# not measure is None there, and the table says "-"
ROWS = (("output_tokens_per_s", "output tokens/s"), ("requests_per_s", "requests/s"),
        ("p50_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"),
        ("p50_tpot_ms", "TPOT p50 ms"), ("p99_tpot_ms", "TPOT p99 ms"),
        ("kv_usage_peak", "KV usage peak"), ("kv_blocks_peak", "KV blocks peak"),
        ("kv_fragmentation_mean", "KV waste (fragmentation mean)"), ("kv_preemptions", "preemptions"),
        ("kv_prefix_hit_rate", "prefix hit rate"), ("failed", "failed requests"))


def side_by_side(results: Mapping[str, PerfResult]) -> str:
    """A Markdown table, a row per figure and a column per engine (`{"vllm": r1, "llama.cpp": r2}`).
    A figure an engine does not measure reads `-`, never 0."""
    if not results:
        raise ValueError("side_by_side needs at least one result: {label: PerfResult, ...}")
    workloads = {name: r.workload_hash for name, r in results.items()}
    if len(set(workloads.values())) > 1:  # engines compared on different traffic: a table of nothing
        raise ValueError("side_by_side compares engines on one workload, and these results ran different ones "
                         f"(workload hashes {workloads}): run each engine on the same Workload")
    figures = {name: {**r.flat(), "failed": r.failed} for name, r in results.items()}
    lines = ["| figure | " + " | ".join(figures) + " |", "| --- |" + " --- |" * len(figures)]
    for key, label in ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(f[key]) for f in figures.values()) + " |")
    return "\n".join(lines)
