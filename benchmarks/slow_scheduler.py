"""An injected regression for benchmarks/detection_power.py: the paging recorder plus a fixed sleep in
every scheduler step (`LLMPERF_BENCH_STEP_DELAY_S`), as a slower engine build would add."""

import os
import time

from pytest_llmperf.engines.vllm_sampler import PagingRecorder

DELAY_S = float(os.environ.get("LLMPERF_BENCH_STEP_DELAY_S", "0"))


class SlowRecorder(PagingRecorder):
    def schedule(self, *args, **kwargs):
        time.sleep(DELAY_S)
        return super().schedule(*args, **kwargs)
