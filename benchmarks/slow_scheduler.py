"""An injected regression for benchmarks/detection_power.py: the paging recorder (on the scheduler vLLM
would choose) plus a fixed sleep in every scheduler step (`LLMPERF_BENCH_STEP_DELAY_S`), as a slower
engine build would add."""

import os
import time

from pytest_llmperf.engines.vllm_sampler import recorder_class

DELAY_S = float(os.environ.get("LLMPERF_BENCH_STEP_DELAY_S", "0"))


def slow_scheduler(*args, **kwargs):
    base = recorder_class(kwargs.get("vllm_config", args[0] if args else None))

    def schedule(self, *a, **k):
        time.sleep(DELAY_S)
        return base.schedule(self, *a, **k)

    return type(f"Slow{base.__name__}", (base,), {"schedule": schedule})(*args, **kwargs)
