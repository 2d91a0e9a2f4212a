"""The adapter interface every engine implements, and the engine pool that caches engines."""

from __future__ import annotations

import asyncio
import atexit
import importlib
import importlib.util
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..models import ModelSpec
from ..timing import PhaseTimes
from ..trace import RunTrace
from ..workload import Request, Workload
from .registry import BUILTIN, GROUP


class Schedule:
    """When each request of one run may be sent: at its arrival time since `start` (perf_counter
    seconds), when a closed loop has a free slot, or `think_s` after the answer to the previous turn of
    its session arrived. An engine awaits `wait(i)` before it sends request i and calls `done(i)` once
    that request ended, whether it was sent, answered or failed (a later turn is sent either way: its
    history is the workload's own, not the answer)."""

    def __init__(self, workload: Workload, start: float) -> None:
        self._workload, self._start = workload, start
        self._slots = asyncio.Semaphore(workload.concurrency) if workload.concurrency else None
        self._holding: set[int] = set()
        self._answered: dict[int, asyncio.Future[float]] = {}
        self._sessions = bool(workload.turns)  # only then does a request wait for another's answer

    def _answer(self, index: int) -> asyncio.Future[float]:
        if index not in self._answered:
            self._answered[index] = asyncio.get_running_loop().create_future()
        return self._answered[index]

    async def wait(self, index: int) -> None:
        if self._slots is not None:
            await self._slots.acquire()
            self._holding.add(index)
            return
        request: Request = self._workload.requests[index]
        before = self._workload.previous_turn(index)
        due = self._start + request.arrival_s if before is None else await self._answer(before) + request.think_s
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

    def done(self, index: int) -> None:
        if index in self._holding:
            self._holding.discard(index)
            self._slots.release()  # type: ignore[union-attr]
        if self._sessions and not (answer := self._answer(index)).done():
            answer.set_result(time.perf_counter())


class EngineError(RuntimeError):
    """An engine could not start or could not run: the message says what to do next. `trace` is what
    a run measured before its engine died (its failed requests counted), kept for the reports."""

    def __init__(self, message: str, trace: RunTrace | None = None) -> None:
        super().__init__(message)
        self.trace = trace


class EngineOptionError(EngineError):
    """The engine does not take an option it was given: a mistake in the test's or the session's options,
    reported as one line that names where the options came from (nothing ran)."""


def need(module: str, extra: str) -> Any:
    """`module`, imported, or an EngineError naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise EngineError(f"{module.split('.')[0]} is missing: pip install 'pytest-llmperf[{extra}]'") from None


def gpus_of(config: Mapping[str, Any]) -> int:
    """GPUs an engine configuration asks for: vLLM's `tensor_parallel_size` x `pipeline_parallel_size`."""
    return int(config.get("tensor_parallel_size") or 1) * int(config.get("pipeline_parallel_size") or 1)


class Engine(ABC):
    """One loaded model behind one inference framework."""

    name: str
    version: str
    model: ModelSpec
    max_model_len: int
    vocab_size: int
    holds_device = True  # False for a client of a server someone else runs (nothing to free)
    # True when the KV pool's size is set by the configuration, not by the machine's free memory: with an
    # offline workload, paging then repeats exactly and is compared with its baseline exactly
    fixed_kv_budget = False

    @property
    @abstractmethod
    def config(self) -> dict[str, Any]:
        """The resolved configuration, defaults the framework chose included (goes into baselines)."""

    @property
    def model_path(self) -> str:
        return self.model.path

    @property
    def gpus(self) -> int:
        """The GPUs the engine spreads over (tensor x pipeline parallel): the runner samples that many
        of this worker's devices and sums their energy and memory."""
        return gpus_of(self.config)

    @classmethod
    def preload(cls) -> None:
        """Import what a start of this engine needs, touching no device: the session imports it while
        the GPU's bandwidth probe runs. A missing package is left to the start, which says what to install."""
        return None

    @abstractmethod
    def run(self, workload: Workload, salt: int = 0) -> RunTrace:
        """Drive one pass of `workload`; `salt` varies token ids so passes never share a prefix cache."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release every process and all device memory; safe to call twice."""

    def check_fits(self, workload: Workload) -> None:
        too_long = [i for i, r in enumerate(workload.requests) if r.total_len > self.max_model_len]
        if too_long:
            r = workload.requests[too_long[0]]
            raise ValueError(
                f"{len(too_long)} request(s) do not fit the engine's max_model_len={self.max_model_len}: "
                f"request {too_long[0]} has prompt {r.prompt_len} + output {r.output_len} = {r.total_len}. "
                "Shorten the workload or raise max_model_len with @pytest.mark.llmperf_engine(max_model_len=...)"
            )

    def __repr__(self) -> str:
        model = getattr(getattr(self, "model", None), "name", "?")
        return f"<{type(self).__name__} {self.name} {getattr(self, 'version', '?')} model={model}>"


def engine_class(name: str, engines: Mapping[str, str] = BUILTIN) -> type[Engine]:
    """The class registered as `name` (engines.registry), imported now."""
    if name not in engines:
        raise EngineError(f"unknown engine {name!r}: choose one of {', '.join(sorted(engines))}, or install a "
                          f"package that registers it under the entry-point group {GROUP!r}")
    module, _, attr = engines[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise EngineError(f"engine {name!r} is registered as {engines[name]!r}, which is not a subclass of "
                          "pytest_llmperf.engines.base.Engine")
    return cls


def default_engine() -> str:
    """vLLM when it is installed, else transformers."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def config_key(name: str, model: ModelSpec, config: dict[str, Any]) -> str:
    return repr((name, model.name, sorted(config.items(), key=lambda kv: kv[0])))


class EnginePool:
    """Engines cached by their full configuration, at most one running at a time.

    Loading a model is the expensive part and a GPU holds one engine at a time, so asking for a
    different configuration shuts the live engine down (and frees its memory) before the next starts.
    With `stop_in_background` (a machine without a GPU: nothing waits for device memory) the old engine's
    stop, seconds of vLLM's worker exiting, runs beside the next engine's start instead, and is waited
    for before the new engine measures anything.
    """

    def __init__(self, after_close: Callable[[], None] | None = None, times: PhaseTimes | None = None,
                 engines: Mapping[str, str] = BUILTIN, stop_in_background: bool = False) -> None:
        self.engines = engines  # name -> "module:Class" (engines.registry)
        self._key: str | None = None
        self.times = times or PhaseTimes()
        self._engine: Engine | None = None
        self.after_close = after_close  # e.g. wait until the GPU shows the engine's memory freed
        self.stop_in_background = stop_in_background
        # one thread, started on first use; Python joins it at exit, so a stop is never cut short
        self._stopper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmperf-engine-stop")
        self._stopping: list[Future[None]] = []
        self.starts = 0
        # (engine, model, seconds) of every start, so a slow gate shows which configuration to share or cut
        self.start_seconds: list[tuple[str, str, float]] = []
        # how each engine this pool started was asked for, so a closed one can be started again
        self._made: weakref.WeakKeyDictionary[Engine, tuple[str, ModelSpec, dict[str, Any]]] = weakref.WeakKeyDictionary()
        atexit.register(self.close)  # also on Ctrl-C and crashes that skip pytest's own teardown

    def get(self, name: str, model: ModelSpec, config: dict[str, Any]) -> Engine:
        key = config_key(name, model, config)
        if self._engine is not None and key == self._key and getattr(self._engine, "alive", True):
            return self._engine
        self._retire()
        cls = engine_class(name, self.engines)
        try:
            with self.times.timed("engine start"):
                began = time.perf_counter()
                self._engine = cls(model, dict(config))
                seconds = time.perf_counter() - began
        finally:
            self._wait_for_stops()  # the engine before it is gone before this one measures anything
        self._key = key
        self.starts += 1
        self.start_seconds.append((name, model.name, round(seconds, 2)))
        self._made[self._engine] = (name, model, dict(config))
        return self._engine

    def _retire(self) -> None:
        """The live engine makes way for another: stopped now, or in the background (`stop_in_background`)."""
        if not self.stop_in_background:
            self.close()
            return
        engine, self._engine, self._key = self._engine, None, None
        if engine is None:
            return
        self._stopping.append(self._stopper.submit(engine.shutdown))

    def _wait_for_stops(self) -> None:
        """Every background stop ended; the first that failed raises its error here."""
        if not self._stopping:
            return
        with self.times.timed("engine stop"):
            while self._stopping:
                self._stopping.pop(0).result()

    def live(self, engine: Engine) -> Engine:
        """`engine` while it is the live one; else the same configuration started again (the pool
        closed it to start another, as a test comparing two engines does, or it broke). An engine this
        pool did not start is returned as it is."""
        if engine is self._engine and getattr(engine, "alive", True):
            return engine
        made = self._made.get(engine)
        return engine if made is None else self.get(*made)

    def restart(self, engine: Engine) -> Engine:
        """`engine`'s configuration in a fresh engine start: how a suspected regression is measured
        again, since a baseline is always compared across engine starts (a start of its own may sit a
        few percent off the last; within one start passes agree). An engine this pool did not start
        is returned as it is."""
        made = self._made.get(engine)
        if made is None:
            return engine
        if engine is self._engine:
            self._retire()
        return self.get(*made)

    def discard(self, engine: Engine) -> None:
        """Forget an engine that broke mid-run so that the next test starts a fresh one."""
        if engine is self._engine:
            self.close()

    def close(self) -> None:
        """Every engine of this pool stopped, the live one and any still stopping in the background."""
        engine, self._engine, self._key = self._engine, None, None
        try:
            if engine is not None:
                with self.times.timed("engine stop"):
                    engine.shutdown()
                    if self.after_close is not None and engine.holds_device:
                        self.after_close()
        finally:
            self._wait_for_stops()
