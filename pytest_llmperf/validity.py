"""Whether a measurement is valid at all, apart from whether it passed: an invalid result never passes a
limit and never updates a baseline, and its message says what to change.

Behind schedule: in an open-loop workload (timed arrivals, no closed loop) each request has a time to be
sent. A request sent more than `LATE_S` after it is late; when more than `LATE_SHARE` of a pass's requests
are late, and more than `STALL_REQUESTS`, the client did not offer the load the workload describes, so the
run measured the client, not the engine. The bound: on the project's 2-core CPU the in-process vLLM client
sent 339 requests in 0.73 s (a trace replayed at 1/160 of its time) and 400 requests at 2,000 requests/s no more than 28 ms late
(2026-12-03), so 100 ms is 3.5 times what a client that keeps up shows there, and one stall that delays a
request or two does not make a whole pass invalid. Engines that stamp a request's scheduled time as its
submission (transformers' static batches) are never late by construction.

Saturated: under an open-loop load the engine keeps up or it does not. When it does not, the queue grows
for as long as requests keep arriving, TTFT rises with arrival time, and every percentile measures how
long the run was rather than the engine. A pass is saturated when, over its requests in arrival order,
TTFT rises steadily (Spearman rank correlation with the time each was sent >= `RISING_RANK`), the last quarter's
median TTFT is at least `RISE` times the first quarter's, and it is still rising at the end (the last
quarter's median above the third's). A stable load shows a rank correlation near zero once the first
requests have filled the batch; a burst in a replayed trace lifts a stretch of it, not the whole run.
Fewer than `MIN_SATURATION_REQUESTS` requests are too few to tell. Of a multi-turn session workload only
the first turns count (the ones it schedules): a later turn's TTFT grows with its history. Measured on the project's 2-core CPU
(vLLM 0.32, tiny shape, 96 Poisson requests, 2026-12-04): at 5-20 requests/s the rank correlation was
0.14-0.62 and TTFT grew at most 1.8 times; at 40-1,000/s it was 0.97-0.99 and TTFT grew 17-33 times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .trace import RunTrace, SequenceTrace
from .workload import Workload

if TYPE_CHECKING:
    from .sweep import Sweep

LATE_S = 0.1
LATE_SHARE = 0.05
STALL_REQUESTS = 2  # late requests one stall may explain, however few the pass has
RISING_RANK = 0.8
RISE = 2.0
MIN_SATURATION_REQUESTS = 16
SATURATED = "the engine saturated under this open-loop load"


def why_invalid(traces: Sequence[RunTrace], workload: Workload) -> str:
    """Why a result measured in these passes is not a valid measurement; "" when it is."""
    return behind_schedule(traces, workload) or saturated(traces, workload)


def schedule_lags(trace: RunTrace, workload: Workload) -> list[float]:
    """Seconds each sequence was sent after its scheduled time; empty where there is no schedule (an
    offline batch, a closed loop)."""
    if not _open_loop(workload):
        return []
    return [s.submit_t - trace.start_t - workload.requests[s.index].arrival_s for s in scheduled(trace, workload)]


def scheduled(trace: RunTrace, workload: Workload) -> list[SequenceTrace]:
    """The sequences the workload sends at a time it sets: a session's later turns are due after an answer,
    with the history so far in their prompt, so neither their lag nor their TTFT says anything of a queue."""
    return [s for s in trace.sequences if workload.requests[s.index].turn == 0]


def behind_schedule(traces: Sequence[RunTrace], workload: Workload) -> str:
    """Why the result is invalid ("" when every pass kept to its schedule)."""
    for k, trace in enumerate(traces):
        lags = schedule_lags(trace, workload)
        late = [lag for lag in lags if lag > LATE_S]
        if lags and len(late) > max(STALL_REQUESTS, LATE_SHARE * len(lags)):
            where = f" in pass {k + 1} of {len(traces)}" if len(traces) > 1 else ""
            return (f"the client fell behind its arrival schedule{where}: {len(late)} of {len(lags)} requests were sent "
                    f"more than {LATE_S * 1e3:.0f} ms late (at worst {max(late) * 1e3:.0f} ms), so the run measured the "
                    f"client, not the engine: offer fewer requests per second ({_slower(workload)}) or "
                    "use a closed loop (Workload.closed_loop)")
    return ""


def _slower(workload: Workload) -> str:
    """How this workload offers fewer requests per second: a replayed trace by its time_scale, others by qps."""
    return "a larger time_scale in Workload.from_trace" if workload.trace is not None else "a lower qps"


def _open_loop(workload: Workload) -> bool:
    """Timed arrivals: neither an offline batch, nor a closed loop, nor sessions whose first turns are all due at
    once (no qps), which are a batch too: their TTFT rises with the order they were handed over, as any batch's
    does, and a client hands a batch over at its own pace."""
    if workload.is_offline or workload.concurrency is not None:
        return False
    return len({r.arrival_s for r in workload.requests if r.turn == 0}) > 1


def saturated(traces: Sequence[RunTrace], workload: Workload) -> str:
    """Why the result is invalid because the engine fell behind an open-loop load ("" when it kept up)."""
    if not _open_loop(workload):
        return ""
    for k, trace in enumerate(traces):
        rise = ttft_rise(trace, workload)
        if rise is None:
            continue
        first, last, rank = rise
        where = f" in pass {k + 1} of {len(traces)}" if len(traces) > 1 else ""
        return (f"{SATURATED}{where}: median TTFT rose from {first * 1e3:.1f} ms "
                f"(first quarter of arrivals) to {last * 1e3:.1f} ms (last quarter) and was still rising at the end "
                f"(rank correlation with arrival time {rank:.2f}), so the queue grew through the run and its "
                f"percentiles measure the run's length, not the engine: offer fewer requests per second "
                f"({_slower(workload)}), or find the rate it sustains with llmperf.find_capacity")
    return ""


def over_capacity(sweeps: Iterable[Sweep]) -> set[str]:
    """The points of capacity curves (sweeps with `under=`) that the engine could not keep up with: what a capacity
    search looks for, judged through its curve (sweep.holds) rather than as measurements that went wrong."""
    return {p.result.label for s in sweeps if s.under for p in s.points if p.result.invalid.startswith(SATURATED)}


def ttft_rise(trace: RunTrace, workload: Workload) -> tuple[float, float, float] | None:
    """(first-quarter median TTFT, last-quarter median TTFT, rank correlation) of a pass whose TTFT rose
    steadily with arrival time to its end; None when it did not (or too few requests finished)."""
    import numpy as np
    from scipy.stats import spearmanr

    # a session's later turns would read as saturation: a 6-session chat on a busy 2-core CPU went 9 ms -> 95 ms
    # (2026-12-05) with its history growing, not a queue
    points = sorted((s.submit_t, s.chunks[0].t - s.submit_t) for s in scheduled(trace, workload) if s.ok)
    if len(points) < MIN_SATURATION_REQUESTS:
        return None
    arrival, ttft = np.array(points).T
    if np.ptp(ttft) == 0 or np.ptp(arrival) == 0:  # a flat TTFT never rose; no rank without two arrival times
        return None
    quarter = len(ttft) // 4
    first, third, last = (float(np.median(part)) for part in
                          (ttft[:quarter], ttft[2 * quarter:3 * quarter], ttft[-quarter:]))
    rank = float(spearmanr(arrival, ttft).statistic)
    if rank >= RISING_RANK and last >= RISE * first and last > third:
        return first, last, rank
    return None
