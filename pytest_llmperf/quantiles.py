"""What a percentile of n samples can say: distribution-free order-statistic intervals.

The number of samples at or below the true q-th quantile is Binomial(n, q) whatever the latency
distribution, so the interval between two sorted samples holds the quantile with a known
probability. A p99 of 16 requests has no upper end inside the sample: nothing that small can bound a
p99, and gating it against a limit or a baseline false-alarms or passes by chance. `needed` says how
many samples a percentile needs before an interval exists at all (MLPerf's early-stopping rule asks
662 for a p99 at 99% one-sided confidence; this two-sided 95% interval needs 368).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
_PERCENTILE = re.compile(r"p(\d+)_(ttft|tpot|itl|e2e|ttfo)_ms")


def percentile_of(metric: str) -> tuple[float, str] | None:
    """(q as a fraction, latency name) of a flat percentile metric: `p99_ttft_ms` -> (0.99, "ttft")."""
    m = _PERCENTILE.fullmatch(metric)
    return (int(m.group(1)) / 100, m.group(2)) if m else None


def needed(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples for which both ends of the two-sided interval of the q-th quantile are sample
    values: p50 6, p90 36, p95 72, p99 368 at 95%."""
    tail = (1 - confidence) / 2
    return math.ceil(math.log(tail) / math.log(max(q, 1 - q)))


def interval(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """(lower, upper) ends of the interval that holds the q-th quantile with `confidence`; an end the
    sample is too small to give is None."""
    return _interval(np.sort(np.asarray(values, dtype=float)), q, confidence)


def relative_halfwidth(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> float | None:
    """The interval's larger half over the point estimate (numpy's linear percentile), or None where
    the sample gives no interval: the uncertainty a comparison of this percentile must allow."""
    ranked = np.sort(np.asarray(values, dtype=float))
    lo, hi = _interval(ranked, q, confidence)
    point = float(np.percentile(ranked, q * 100)) if ranked.size else 0.0
    if lo is None or hi is None or point <= 0:
        return None
    return max(hi - point, point - lo) / point


def _interval(ranked: np.ndarray, q: float, confidence: float) -> tuple[float | None, float | None]:
    n = ranked.size
    if n == 0:
        return None, None
    from scipy.stats import binom

    tail = (1 - confidence) / 2
    lo_rank = int(binom.ppf(tail, n, q))  # P(fewer than lo_rank samples <= quantile) < tail
    hi_rank = int(binom.ppf(1 - tail, n, q)) + 1
    lo = float(ranked[lo_rank - 1]) if lo_rank >= 1 else None
    hi = float(ranked[hi_rank - 1]) if hi_rank <= n else None
    return lo, hi


def not_gated(metric: str, samples: int) -> str | None:
    """Why a percentile cannot be gated on `samples` independent samples, or None when it can."""
    parsed = percentile_of(metric)
    if parsed is None:
        return None
    q, _ = parsed
    need = needed(q)
    if samples >= need:
        return None
    return f"not gated: {samples} samples, a p{round(q * 100)} needs about {need}"
