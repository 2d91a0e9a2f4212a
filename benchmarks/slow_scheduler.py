"""An injected regression for benchmarks/detection_power.py: the paging recorder (on the scheduler vLLM
would choose) plus a wait in every scheduler step, as a slower engine build would add.

The wait is a share of the step's own time (`LLMPERF_BENCH_STEP_SLOWDOWN`, the time from the end of
the last wait to this `schedule()` call), spun rather than slept, so that throughput falls by
slowdown / (1 + slowdown) whatever the step takes on this machine. A fixed `time.sleep` sized from a
mean step cost 20-25% of throughput on the H200 where 5-10% was meant (docs/performance.md, session 7):
sub-millisecond sleeps overshoot. A gap longer than IDLE_S is an idle engine, not a step: no wait.
"""

import os
import time

from pytest_llmperf.engines.vllm_sampler import recorder_class

SLOWDOWN = float(os.environ.get("LLMPERF_BENCH_STEP_SLOWDOWN", "0"))
IDLE_S = 0.25


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def slow_scheduler(*args, **kwargs):
    base = recorder_class(kwargs.get("vllm_config", args[0] if args else None))

    def schedule(self, *a, **k):
        now = time.perf_counter()
        step = now - self._llmperf_since if self._llmperf_since is not None else IDLE_S
        if step < IDLE_S:
            _spin(SLOWDOWN * step)
        self._llmperf_since = time.perf_counter()
        return base.schedule(self, *a, **k)

    return type(f"Slow{base.__name__}", (base,), {"schedule": schedule, "_llmperf_since": None})(*args, **kwargs)
