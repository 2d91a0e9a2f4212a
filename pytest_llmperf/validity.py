"""Whether a measurement is valid at all, apart from whether it passed: an invalid result never passes a
limit and never updates a baseline, and its message says what to change.

Behind schedule: in an open-loop workload (timed arrivals, no closed loop) each request has a time to be
sent. A request sent more than `LATE_S` after it is late; when more than `LATE_SHARE` of a pass's requests
are late, the client did not offer the load the workload describes, so the run measured the client, not
the engine. The bound: on the project's 2-core CPU the in-process vLLM client sent 339 requests in 0.73 s
(a trace replayed at 1/160 of its time) and 400 requests at 2,000 requests/s no more than 28 ms late
(2026-12-03), so 100 ms is 3.5 times what a client that keeps up shows there, and one stall that delays a
request or two does not make a whole pass invalid. Engines that stamp a request's scheduled time as its
submission (transformers' static batches) are never late by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

from .trace import RunTrace
from .workload import Workload

LATE_S = 0.1
LATE_SHARE = 0.05


def schedule_lags(trace: RunTrace, workload: Workload) -> list[float]:
    """Seconds each sequence was sent after its scheduled time; empty where there is no schedule (an
    offline batch, a closed loop)."""
    if workload.is_offline or workload.concurrency is not None:
        return []
    arrivals = [r.arrival_s for r in workload.requests]
    return [s.submit_t - trace.start_t - arrivals[s.index] for s in trace.sequences]


def behind_schedule(traces: Sequence[RunTrace], workload: Workload) -> str:
    """Why the result is invalid ("" when every pass kept to its schedule)."""
    for k, trace in enumerate(traces):
        lags = schedule_lags(trace, workload)
        late = [lag for lag in lags if lag > LATE_S]
        if lags and len(late) > LATE_SHARE * len(lags):
            where = f" in pass {k + 1} of {len(traces)}" if len(traces) > 1 else ""
            return (f"the client fell behind its arrival schedule{where}: {len(late)} of {len(lags)} requests were sent "
                    f"more than {LATE_S * 1e3:.0f} ms late (at worst {max(late) * 1e3:.0f} ms), so the run measured the "
                    "client, not the engine: offer fewer requests per second (a larger time_scale, a lower qps) or "
                    "use a closed loop (Workload.closed_loop)")
    return ""
