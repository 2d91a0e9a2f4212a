"""How uncertain a measured figure is: the percentile intervals (order statistics, `quantiles`; a
bootstrap that resamples whole engine steps), how many independent samples a percentile rests on, an
engine's pass-to-pass noise, and the significance test across repeats. Used by `metrics` (each
result's noise and sample counts) and `baseline` (the comparison)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import quantiles

NOISE_PERCENTILES = (50, 99)
_RESAMPLES = 200


def percentile_noise(values: Sequence[float], q: float, events: Sequence[Any] | None = None) -> float | None:
    """Relative half-width of the 95% bootstrap interval of the q-th percentile: how far the
    estimate could move on the same traffic by chance. A p99 of 30 requests is far less certain than a
    p50 of 3000 gaps, and a baseline comparison must not be tighter than that.

    `events`: what produced each value, where one event produces many (the engine step that ended a
    token gap, for every request that step served). Those values rise and fall together, so they are
    resampled together: one stalled step of 64 running requests is one chance event, not 64, and a
    p99 set by one or two such steps is as uncertain as the count of such steps."""
    arr = np.asarray(values, dtype=float)
    point = float(np.percentile(arr, q)) if arr.size else 0.0
    if arr.size < 2 or point <= 0:
        return None
    rng = np.random.default_rng(0)  # fixed: the same data always gets the same interval
    resamples = max(20, min(_RESAMPLES, 2_000_000 // arr.size))
    codes = _event_codes(events, arr.size)
    if codes is None:
        estimates = np.percentile(arr[rng.integers(0, arr.size, size=(resamples, arr.size))], q, axis=1)
    else:
        estimates = _grouped_percentiles(arr, codes, q, rng, resamples)
    lo, hi = np.percentile(estimates, [2.5, 97.5])
    return float((hi - lo) / 2 / point)


def _event_codes(events: Sequence[Any] | None, n: int) -> np.ndarray | None:
    """Each value's event as an index, None where every value is an event of its own."""
    if events is None:
        return None
    if len(events) != n:
        raise ValueError(f"{len(events)} events for {n} values: give one event per value")
    index: dict[Any, int] = {}
    codes = np.fromiter((index.setdefault(e, len(index)) for e in events), dtype=np.int64, count=n)
    return codes if len(index) < n else None


def _grouped_percentiles(arr: np.ndarray, codes: np.ndarray, q: float, rng: np.random.Generator,
                         resamples: int) -> np.ndarray:
    """The q-th percentile of each of `resamples` resamples that draw whole events with replacement:
    an event drawn k times weighs its values k times (inverted-CDF percentile over the weights)."""
    order = np.argsort(arr, kind="stable")
    ranked, ranked_codes = arr[order], codes[order]
    n_events = int(codes.max()) + 1
    drawn = rng.multinomial(n_events, np.full(n_events, 1 / n_events), size=resamples)
    cumulative = np.cumsum(drawn[:, ranked_codes], axis=1)
    targets = q / 100 * cumulative[:, -1]
    return ranked[np.minimum((cumulative < targets[:, None]).sum(axis=1), arr.size - 1)]


def pass_noise(rates: Sequence[float]) -> float:
    """How far one whole pass of an engine may land from the next by chance, from a steady warm-up's
    pass throughputs: half the range of the last three over their median. Settled, the two that agreed
    and the pass after them; not settled, the drift that kept the engine from settling."""
    tail = list(rates[-3:])
    mid = float(np.median(tail)) if len(tail) >= 2 else 0.0
    return (max(tail) - min(tail)) / 2 / mid if mid else 0.0


def latency_noise(samples: dict[str, Sequence[float]], percentiles: Sequence[int],
                  events: dict[str, Sequence[Any]] | None = None) -> dict[str, float]:
    """Per percentile, the wider of its order-statistic interval (`quantiles`) and, for p50 and p99,
    a bootstrap that keeps each event's values together. `events`: per metric, what produced each
    sample (`percentile_noise`); gaps ended by one engine step rise and fall together, which the
    order statistics, counting every gap as independent, would miss."""
    out = {}
    for name, values in samples.items():
        for q in percentiles:
            widths = [quantiles.relative_halfwidth(values, q / 100)]
            if q in NOISE_PERCENTILES:
                widths.append(percentile_noise(values, q, (events or {}).get(name)))
            present = [w for w in widths if w is not None]
            if present:
                out[f"p{q}_{name}_ms"] = round(max(present), 6)
    return out


def independent_samples(samples: dict[str, Sequence[float]], events: dict[str, Sequence[Any]] | None = None
                        ) -> dict[str, int]:
    """How many independent samples each metric's percentiles rest on: its values, or the distinct
    events that produced them (the engine steps that ended ITL gaps)."""
    out = {}
    for name, values in samples.items():
        produced_by = (events or {}).get(name)
        out[name] = len(set(produced_by)) if produced_by is not None and len(produced_by) == len(values) else len(values)
    return out


def significant(old: Sequence[Mapping[str, float | None]], new: Sequence[Mapping[str, float | None]],
                metric: str, higher_better: bool, level: float) -> bool:
    """One-sided Mann-Whitney U across repeats; with fewer than 3 repeats a side, trust the tolerance."""
    a = [p[metric] for p in old if p.get(metric) is not None]
    b = [p[metric] for p in new if p.get(metric) is not None]
    if len(a) < 3 or len(b) < 3:
        return True
    from scipy.stats import mannwhitneyu

    alternative = "less" if higher_better else "greater"
    # <=: with 3 repeats a side the exact one-sided p is at least 0.05, reached only when every
    # current repeat is worse than every baseline repeat
    return mannwhitneyu(b, a, alternative=alternative).pvalue <= level
