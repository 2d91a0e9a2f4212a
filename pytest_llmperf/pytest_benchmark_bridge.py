"""pytest-benchmark users keep their tools: each llmperf result also becomes a pytest-benchmark entry
(its JSON, `--benchmark-json`, autosave and compare), with the repeats as rounds and the llmperf
metrics in `extra_info`, whenever one of those outputs is asked for.

pytest-benchmark has no public API for adding measurements taken elsewhere, so this builds its
`BenchmarkFixture` the way its own `benchmark` fixture does and feeds the rounds to the stats object
(checked on pytest-benchmark 5.3.1). Nothing happens when the plugin is absent or disabled.
"""

from __future__ import annotations

from typing import Any

import pytest

from .runner import LLMPerf


def add(item: pytest.Item, perf: LLMPerf) -> None:
    session = getattr(item.config, "_benchmarksession", None)
    if session is None or session.disabled or session.skip:
        return
    if not (getattr(session, "json", None) or getattr(session, "save", None) or getattr(session, "autosave", None)):
        return  # only when pytest-benchmark output was asked for: no extra table in every llmperf session
    from pytest_benchmark.fixture import BenchmarkFixture

    for i, result in enumerate(perf.results):
        fixture = BenchmarkFixture(item, add_stats=session.benchmarks.append, logger=session.logger,
                                   warner=item.warn, disabled=False, **session.options)
        if len(perf.results) > 1:
            fixture.name = f"{fixture.name}[llmperf:{result.label or i}]"
            fixture.fullname = f"{fixture.fullname}[llmperf:{result.label or i}]"
        fixture.extra_info.update(_finite(result.flat()))
        fixture.extra_info["llmperf_engine"] = result.engine
        fixture.extra_info["llmperf_workload_hash"] = result.workload_hash
        stats = fixture._make_stats(1)
        for repeat in result.per_repeat:
            stats.update(repeat["duration_s"])
        fixture._mode = "llmperf"  # marks the fixture as used, so pytest-benchmark does not warn


def _finite(metrics: dict[str, Any]) -> dict[str, Any]:
    return {f"llmperf_{k}": v for k, v in metrics.items() if v is not None}
