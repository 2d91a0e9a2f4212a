"""`llmperf.run`: warm up, drive the workload `repeats` times, summarise, remember the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .engines.base import Engine
from .gpu import NvmlSampler
from .metrics import PerfResult, summarize
from .trace import RunTrace
from .workload import Workload

WARMUP_REQUESTS = 4
# salts: warm-up and every repeat get their own token ids, so no pass finds another's prefix cache
_WARMUP_SALT = 10_000


@dataclass
class LLMPerf:
    """The `llmperf` fixture: runs workloads and binds their results to the current test.

    `on_broken` is told about an engine that raised mid-run, so that the pool can restart it for the
    next test instead of handing out a half-dead engine.
    """

    test_id: str = ""
    on_broken: Callable[[Engine], None] | None = None
    gpu_index: int | None = None  # sample this device with NVML during every measured pass
    gpu_interval_s: float = 0.01
    # judges each result as it is made (Hypothesis tests: a violation must fail the example inside
    # the test body for shrinking to work); gets a function that measures the workload again
    check: Callable[[PerfResult, Workload, Callable[[], PerfResult]], None] | None = None
    results: list[PerfResult] = field(default_factory=list)
    engines: list[Engine] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)

    def run(self, engine: Engine, workload: Workload, repeats: int = 1, warmup: bool = True,
            label: str = "") -> PerfResult:
        _check_args(engine, workload, repeats)
        engine.check_fits(workload)
        traces: list[RunTrace] = []
        try:
            if warmup:
                engine.run(_warmup_of(workload), salt=_WARMUP_SALT)
            for i in range(repeats):
                traces.append(self._measured(engine, workload, salt=i))
        except BaseException:
            if self.on_broken is not None:
                self.on_broken(engine)
            raise
        result = summarize(traces, workload.hash, len(workload), label=label)
        if self.check is not None:
            # one example of a property test: only its own result stays bound to the test
            self.results.clear()
            self.engines.clear()
            self.workloads.clear()
        self.results.append(result)
        self.engines.append(engine)
        self.workloads.append(workload)
        if self.check is not None:
            self.check(result, workload, lambda: self._again(engine, workload, repeats, label))
        return result

    def _again(self, engine: Engine, workload: Workload, repeats: int, label: str) -> PerfResult:
        traces = [self._measured(engine, workload, salt=100 + i) for i in range(repeats)]
        return summarize(traces, workload.hash, len(workload), label=label)


    def _measured(self, engine: Engine, workload: Workload, salt: int) -> RunTrace:
        if self.gpu_index is None:
            return engine.run(workload, salt=salt)
        with NvmlSampler(self.gpu_index, self.gpu_interval_s) as sampler:
            trace = engine.run(workload, salt=salt)
        return replace(trace, gpu=sampler.samples)


def _warmup_of(workload: Workload) -> Workload:
    """A few of the workload's own requests, offline: enough to load kernels and allocate buffers."""
    return Workload(workload.requests[:WARMUP_REQUESTS], seed=workload.seed, kind="warmup").as_offline()


def _check_args(engine: Any, workload: Any, repeats: Any) -> None:
    if not isinstance(workload, Workload):
        raise TypeError(f"llmperf.run needs a Workload, got {type(workload).__name__}: build one with Workload.offline(...)")
    if not isinstance(engine, Engine):
        raise TypeError(f"llmperf.run needs an engine fixture (hf_engine, vllm_engine, llm_engine), got {engine!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an int >= 1")
