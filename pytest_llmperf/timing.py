"""Where a session's wall time goes: engine starts and stops, warm-up, measured passes, passes measured
again to tell noise from a regression, the GPU's bandwidth probe, the plots drawn for `--llmperf-report`,
collecting the tests, and judging them (baselines, limits, records).

The rest of the wall time (pytest itself, the reports) is what is left over. Shown in the terminal
summary and `results.json` as the time to verdict, so that a slow gate shows what to cut. Phases nest
(judging a test may measure it again, which may start an engine): a second counts in the innermost
phase only, so the phases and the rest add up to the wall time. Under pytest-xdist the engines run in the
workers: the controller adds up each worker's phases (`workers_line`), which add up to the workers' own time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PHASES = ("engine start", "warm-up", "measurement", "re-measurement", "engine stop", "bandwidth probe", "plots",
          "collection", "judging")
# shown in the line only where they took time: a session without a GPU or without a report has none
OPTIONAL = ("bandwidth probe", "plots", "collection", "judging")


@dataclass
class PhaseTimes:
    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    clock: Callable[[], float] = time.perf_counter
    _open: list[list[Any]] = field(default_factory=list)  # [phase, since] of the phases entered, innermost last

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        now = self.clock()
        if self._open:  # the enclosing phase pauses while this one runs
            outer = self._open[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._open.append([phase, now])
        try:
            yield
        finally:
            now = self.clock()
            self.seconds[phase] += now - self._open.pop()[1]
            if self._open:
                self._open[-1][1] = now

    def summary(self) -> dict[str, float]:
        wall = self.clock() - self.started
        spent = {k: round(v, 2) for k, v in self.seconds.items()}
        return {"wall": round(wall, 2), **spent, "other": round(max(wall - sum(self.seconds.values()), 0.0), 2)}

    def line(self, starts: int) -> str:
        s = self.summary()
        return f"time to verdict: {s['wall']:.0f} s = {_phases(s, starts)}"


def workers_line(wall: float, workers: list[dict[str, Any]]) -> str:
    """The controller's line under pytest-xdist: its own wall time, then the workers' summaries (each
    `PhaseTimes.summary()` with its `engine_starts`) added up, phase by phase, in worker-seconds."""
    total = {key: sum(w[key] for w in workers) for key in ("wall", *PHASES, "other", "engine_starts")}
    return (f"time to verdict: {wall:.0f} s, {len(workers)} pytest-xdist workers side by side: "
            f"{total['wall']:.0f} worker-seconds = {_phases(total, int(total['engine_starts']))}")


def _phases(s: dict[str, float], starts: int) -> str:
    return (f"engine start {s['engine start']:.0f} s ({starts} starts), "
            f"warm-up {s['warm-up']:.0f} s, measurement {s['measurement']:.0f} s, re-measurement "
            f"{s['re-measurement']:.0f} s, engine stop {s['engine stop']:.0f} s, "
            + "".join(f"{phase} {s[phase]:.0f} s, " for phase in OPTIONAL if s[phase])
            + f"other (pytest, reports) {s['other']:.0f} s")
