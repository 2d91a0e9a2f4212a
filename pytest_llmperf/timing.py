"""Where a session's wall time goes: engine starts and stops, warm-up, measured passes, passes measured
again to tell noise from a regression, the GPU's bandwidth probe, and the plots drawn for `--llmperf-report`.

The rest of the wall time (collection, pytest itself, judging, reports) is what is left over. Shown in
the terminal summary and `results.json` as the time to verdict, so that a slow gate shows what to cut.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PHASES = ("engine start", "warm-up", "measurement", "re-measurement", "engine stop", "bandwidth probe", "plots")
# shown in the line only where they took time: a session without a GPU or without a report has none
OPTIONAL = ("bandwidth probe", "plots")


@dataclass
class PhaseTimes:
    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t

    def summary(self) -> dict[str, float]:
        wall = time.perf_counter() - self.started
        spent = {k: round(v, 2) for k, v in self.seconds.items()}
        return {"wall": round(wall, 2), **spent, "other": round(max(wall - sum(self.seconds.values()), 0.0), 2)}

    def line(self, starts: int) -> str:
        s = self.summary()
        return (f"time to verdict: {s['wall']:.0f} s = engine start {s['engine start']:.0f} s ({starts} starts), "
                f"warm-up {s['warm-up']:.0f} s, measurement {s['measurement']:.0f} s, re-measurement "
                f"{s['re-measurement']:.0f} s, engine stop {s['engine stop']:.0f} s, "
                + "".join(f"{phase} {s[phase]:.0f} s, " for phase in OPTIONAL if s[phase])
                + f"other (pytest, judging, reports) {s['other']:.0f} s")
