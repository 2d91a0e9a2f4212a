"""Curves: one PerfResult per concurrency or request rate, and what users read off them.

Pure values and functions over results (metrics layer: no engine, no pytest): the largest load whose
latency limits hold (capacity), the throughput-latency Pareto front, the best-balance point, and
output tokens per second per GiB of GPU memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .metrics import LATENCY_METRIC_NAMES, PerfResult, throughput_per_gib


@dataclass(frozen=True)
class SweepPoint:
    value: float  # the concurrency or request rate of this point
    result: PerfResult


@dataclass(frozen=True)
class Sweep:
    kind: str  # "concurrency" or "rate"
    label: str
    points: tuple[SweepPoint, ...]
    under: Mapping[str, float] = field(default_factory=dict)  # latency limits capacity is judged by
    searched: bool = False  # a bisection (find_capacity) rather than a fixed list

    @property
    def capacity_label(self) -> str:
        """The label of its capacity's baseline entry."""
        return f"{self.label}:capacity"

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]

    def capacity(self, under: Mapping[str, float] | None = None) -> float | None:
        """The largest load whose points all hold every limit up to it (the curve is cut at the first
        point that breaks a limit: a lucky point beyond a failing one is not capacity)."""
        limits = dict(under if under is not None else self.under)
        best = None
        for point in sorted(self.points, key=lambda p: p.value):
            if not holds(point.result, limits):
                break
            best = point.value
        return best

    @property
    def max_rate(self) -> float | None:
        return self.capacity() if self.kind == "rate" else None

    @property
    def capped(self) -> bool:
        """Whether every load held, the largest included: the capacity is at least that load, not found."""
        return bool(self.points and self.under) and self.capacity() == max(self.values)

    def pareto(self, latency: str = "p99_tpot_ms") -> list[SweepPoint]:
        """Points no other point beats on both output throughput (higher) and `latency` (lower)."""
        # a point with failed requests, or over capacity, is no operating point to choose
        rows = [(p, p.result.throughput.output_tokens_per_s, p.result.flat().get(latency)) for p in self.points
                if not p.result.failed and not p.result.invalid]
        rows = [r for r in rows if r[2] is not None]
        front = [p for p, thr, lat in rows
                 if not any(t2 >= thr and l2 <= lat and (t2 > thr or l2 < lat) for _, t2, l2 in rows)]
        return sorted(front, key=lambda p: p.value)

    def best_balance(self, latency: str = "p99_tpot_ms") -> SweepPoint | None:
        """The Pareto point with the most throughput per unit of latency (the knee of the curve)."""
        front = self.pareto(latency)
        if not front:
            return None
        return max(front, key=lambda p: p.result.throughput.output_tokens_per_s / max(p.result.flat()[latency], 1e-9))

    def summary(self) -> dict[str, Any]:
        best = self.best_balance()
        return {"kind": self.kind, "label": self.label, "values": self.values, "capacity": self.capacity(),
                "max_rate": self.max_rate, "searched": self.searched, "capped": self.capped,
                "under": dict(self.under), "pareto": [p.value for p in self.pareto()],
                "best_balance": best.value if best else None,
                "throughput_per_gib": [throughput_per_gib(p.result) for p in self.points]}


def unknown_latency_metrics(limits: Mapping[str, Any]) -> str | None:
    """What is wrong with latency limits (None when nothing is): a name that is no latency metric, or a
    bound that is not a finite number >= 0 (a NaN bound would hold at every load)."""
    unknown = [str(k) for k in limits if k not in LATENCY_METRIC_NAMES]
    if unknown:
        return (f"under= names {', '.join(map(repr, unknown))}, not a latency metric: choose among "
                f"{', '.join(LATENCY_METRIC_NAMES)}")
    for name, bound in limits.items():
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound) or bound < 0:
            return f"under[{name!r}]={bound!r} must be a finite number of milliseconds >= 0"
    return None


def holds(result: PerfResult, limits: Mapping[str, float]) -> bool:
    """Every latency limit (flat metric name -> upper bound) holds, no request failed, and the load was
    offered and kept up with: a point where the engine saturated is over capacity, and one whose client fell
    behind its schedule never offered its load (validity.py)."""
    values = result.flat()
    if result.failed or result.invalid:
        return False
    for metric, bound in limits.items():
        value = values.get(metric)
        if metric not in LATENCY_METRIC_NAMES:
            raise ValueError(f"capacity limit on {metric!r}: not a measured metric; use names like p99_ttft_ms")
        if value is None:
            raise ValueError(f"capacity limit on {metric!r}: not measured at this load (TPOT and ITL need outputs of "
                             "2 tokens or more, TTFO an answer after the reasoning): limit a metric every point measures")
        if value > bound:
            return False
    return True
