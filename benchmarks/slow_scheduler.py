"""An injected regression for benchmarks/detection_power.py: the paging recorder (on the scheduler vLLM
would choose) plus a wait in every scheduler step, as a slower engine build would add.

The wait is a share of the step's own time (`LLMPERF_BENCH_STEP_SLOWDOWN`, the time since the last
`schedule()` call less the wait added then), so that throughput falls by slowdown / (1 + slowdown)
whatever the step takes on this machine. A fixed `time.sleep` sized from a mean step cost 20-25% of
throughput on the H200 where 5-10% was meant (docs/performance.md, 2026-12-01e): sub-millisecond sleeps
overshoot. A gap longer than IDLE_S is an idle engine, not a step: no wait.

Where the wait goes (`LLMPERF_BENCH_SLOW_ON`):
- `cpu` (default): spun in `schedule()`, a slower scheduler. It costs throughput only where the engine
  core's CPU is the bottleneck (a small model, or the CPU backend).
- `gpu`: a GPU kernel that spins for the wait (`torch.cuda._sleep`), queued before the step's own
  kernels, a slower model. On a model whose steps are GPU-bound (an 8B shape on an H200, whose engine
  core was busy 0.6-0.7 of each pass) a CPU spin can hide in the core's slack under vLLM's async
  scheduling, as a slower scheduler would there.
"""

import os
import time

from pytest_llmperf.engines.vllm_sampler import recorder_class

SLOWDOWN = float(os.environ.get("LLMPERF_BENCH_STEP_SLOWDOWN", "0"))
ON = os.environ.get("LLMPERF_BENCH_SLOW_ON", "cpu")
IDLE_S = 0.25


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _GpuSpin:
    """Spins the current CUDA stream for a given time: `torch.cuda._sleep` takes clock cycles, so the
    cycles per second are measured once on this card."""

    def __init__(self):
        import torch

        self.torch, cycles = torch, 50_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # the first launch loads the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_s = cycles / (start.elapsed_time(end) / 1e3)

    def __call__(self, seconds: float) -> None:
        self.torch.cuda._sleep(int(seconds * self.cycles_per_s))


def slow_scheduler(*args, **kwargs):
    base = recorder_class(kwargs.get("vllm_config", args[0] if args else None))
    wait = _GpuSpin() if ON == "gpu" else _spin

    def schedule(self, *a, **k):
        now = time.perf_counter()
        step = now - self._llmperf_since - self._llmperf_waited if self._llmperf_since is not None else IDLE_S
        self._llmperf_waited = SLOWDOWN * step if step < IDLE_S else 0.0
        if self._llmperf_waited:
            wait(self._llmperf_waited)
        self._llmperf_since = now
        return base.schedule(self, *a, **k)

    attrs = {"schedule": schedule, "_llmperf_since": None, "_llmperf_waited": 0.0}
    return type(f"Slow{base.__name__}", (base,), attrs)(*args, **kwargs)
