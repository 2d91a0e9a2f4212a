"""The adapter interface every engine implements, and the engine pool that caches engines."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import importlib.util
import threading
import time
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
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


class SideBySideWarning(UserWarning):
    """Engines planned side by side were started one at a time instead (EnginePool): filter it by this class."""


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


PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size")


def parallel_sizes_problem(config: Mapping[str, Any]) -> str | None:
    """What is wrong with an engine configuration's parallel sizes (each a whole number of GPUs, 1 or more),
    or None: checked where the options are given, before anything sizes the GPUs each worker claims."""
    for key in PARALLEL_SIZES:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"{key}={value!r} must be a whole number of GPUs, 1 or more"
    return None


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

    @classmethod
    def starts_beside(cls) -> bool:
        """Whether engines of this class can start side by side in one process, each one's measurements its
        own, and name processes that hold their device memory and no other engine's."""
        return False

    def device_pids(self) -> frozenset[int]:
        """The processes holding this engine's device memory (NVML charges memory per process): what is
        taken off the card's reading while another engine is measured beside it."""
        return frozenset()

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


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (Linux's /proc; none elsewhere): the workers an engine core started."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name (field 2) may hold spaces and parentheses: the parent pid follows its last ")"
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def all_at_once(calls: Sequence[Callable[[], None]]) -> list[BaseException]:
    """Runs `calls` at once, each in a thread, and returns what they raised. At interpreter exit (the
    pool's atexit stop), where no new thread may start, one after another."""
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - returned to the caller, which raises the first
            errors.append(e)

    threads = [threading.Thread(target=run, args=(call,), name="llmperf-at-once") for call in calls]
    try:
        for t in threads:
            t.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
        for call, t in zip(calls, threads):
            if t.ident is None:
                run(call)
    for t in threads:
        if t.ident is not None:
            t.join()
    return errors


def _running(engine: Engine | None) -> bool:
    return engine is not None and getattr(engine, "alive", True)


class EnginePool:
    """Engines cached by their full configuration, one running at a time, or a planned group side by side.

    Loading a model is the expensive part and a GPU holds one engine at a time, so asking for a
    different configuration shuts the live engine down (and frees its memory) before the next starts.
    With `stop_in_background` (a machine without a GPU: nothing waits for device memory) the old engine's
    stop, seconds of vLLM's worker exiting, runs beside the next engine's start instead, and is waited
    for before the new engine measures anything.

    `plan` names groups of configurations that may live side by side (engines of a fixed KV budget whose
    tests gate no timing: selection.side_by_side_groups): asking for one the first time starts the whole
    group at once and waits until every one has started, so that none measures while another starts; each
    is then handed out as asked for, the others idle beside it (`beside` names their processes, whose
    memory the runner takes off the card's reading). Asking for a configuration outside the group stops
    the group; asking for a member again later starts that one alone. Where a member fails to start beside
    the others, or `check_beside` finds their memory cannot be told apart (NVML without the host's process
    ids), the group is stopped with a SideBySideWarning and every engine starts one at a time from then on.
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
        self._groups: dict[str, tuple[tuple[str, ModelSpec, dict[str, Any]], ...]] = {}  # key -> its planned group
        self._entered: set[tuple[str, ...]] = set()  # groups started once (their members' keys)
        self._beside: dict[str, Engine] = {}  # the started group's engines, by key
        self._pending: list[Future[Engine]] = []  # a group's starts not yet waited for (Ctrl-C while they ran)
        # why the engines of a started group cannot be measured apart (None: they can), e.g. gpu.beside_checker
        self.check_beside: Callable[[Sequence[frozenset[int]]], str | None] | None = None
        self._books = threading.Lock()
        self._refusal: str | None = None  # why no engine may start any more (refuse_starts)
        atexit.register(self.close)  # also on Ctrl-C and crashes that skip pytest's own teardown

    def plan(self, groups: Sequence[Sequence[tuple[str, ModelSpec, dict[str, Any]]]]) -> None:
        """Configurations (name, model, config) to start side by side, a group at a time; a group of one
        starts as any other engine. Configurations whose class cannot start beside another are left out."""
        for group in groups:
            members = tuple(m for m in group if self._may_start_beside(m[0]))
            if len(members) > 1:
                for member in members:  # a configuration of two runs of tests belongs to the first
                    self._groups.setdefault(config_key(*member), members)

    def get(self, name: str, model: ModelSpec, config: dict[str, Any]) -> Engine:
        key = config_key(name, model, config)
        if key == self._key and _running(self._engine):
            return self._engine
        if key in self._groups:
            return self._get_beside(key)
        self._close_beside()
        self._retire()
        cls = engine_class(name, self.engines)
        try:
            with self.times.timed("engine start"):
                self._engine = self._start(name, model, config, cls)
                self._key = key
        finally:
            self._wait_for_stops()  # the engine before it is gone before this one measures anything
        return self._engine

    def refuse_starts(self, why: str) -> None:
        """No engine starts from now on; each start raises EngineError(why). For a session being ended (SIGTERM):
        its exit is an `Exception`, and code that catches one where the signal lands (NVML's check of a group,
        a re-measurement's fallback) would otherwise go on to start the next engine before the session ends."""
        self._refusal = why

    def _start(self, name: str, model: ModelSpec, config: dict[str, Any], cls: type[Engine] | None = None) -> Engine:
        if self._refusal is not None:
            raise EngineError(f"{name} engine not started: {self._refusal}")
        began = time.perf_counter()
        engine = (cls or engine_class(name, self.engines))(model, dict(config))
        with self._books:  # starts of a group end in threads of their own
            self.starts += 1
            self.start_seconds.append((name, model.name, round(time.perf_counter() - began, 2)))
            self._made[engine] = (name, model, dict(config))
        return engine

    def _may_start_beside(self, name: str) -> bool:
        try:
            return engine_class(name, self.engines).starts_beside()
        except (EngineError, ImportError, AttributeError):  # its test fails at setup with that error, alone
            return False

    def _get_beside(self, key: str) -> Engine:
        """`key`'s engine of its group: the first time, the whole group started side by side (each in a
        thread: an engine's start waits on its own processes); later, `key`'s alone if it is not running,
        its error its own."""
        if _running(self._beside.get(key)):
            return self._beside[key]
        group = self._groups[key]
        keys = tuple(config_key(*m) for m in group)
        if any(k not in keys for k in self._beside):
            self._close_beside()  # another group's
        self._retire()
        self._wait_for_stops()
        first = keys not in self._entered
        self._entered.add(keys)
        if not first:  # asked for again (a re-measurement, a broken engine): its start is its own
            errors = self._start_together([group[keys.index(key)]])
            if errors:
                raise errors[0]
            return self._beside[key]
        errors = self._start_together(group)
        if errors:
            # a start that failed beside the others may have met a passing fault (on an H100, 2026-12-07: the port
            # vLLM found free for an engine core's torch.distributed store was taken before it listened, beside
            # three other cores' sockets): the failed ones once more, beside those that started. A lasting cause
            # (the card's memory) fails again, and the session goes on one engine at a time
            errors = self._start_together([m for m in group if config_key(*m) not in self._beside])
        why = next((f"{type(e).__name__}: {e}" for e in errors), None)
        if why is None and self.check_beside is not None:
            try:
                why = self.check_beside([self._beside[k].device_pids() for k in keys])
            except Exception as e:  # noqa: BLE001 - NVML failing here is one more reason to start them alone
                why = f"{type(e).__name__}: {e}"
        if why is not None:
            return self._one_at_a_time(group[keys.index(key)], why)
        return self._beside[key]

    def _one_at_a_time(self, member: tuple[str, ModelSpec, dict[str, Any]], why: str) -> Engine:
        """Side by side given up for the session (what failed here, the card's memory or NVML's view of
        processes, would fail the next group too): the group stopped and `member` started alone."""
        self._groups.clear()  # first: whatever follows raises, no engine starts beside another again
        try:
            self._close_beside()
        finally:
            warnings.warn(SideBySideWarning(f"llmperf: engines not started side by side ({why}); they start one at a "
                                            "time from now on, as with --llmperf-side-by-side=off"), stacklevel=4)
        return self.get(*member)

    def _start_together(self, members: Sequence[tuple[str, ModelSpec, dict[str, Any]]]) -> list[BaseException]:
        """`members` started at once and waited for; the started ones join the group, the errors of the
        others are returned. Interrupted (Ctrl-C), the starts still running are kept for `_close_beside`."""
        if self._pending:  # an earlier group start was interrupted, and the session went on
            self._close_beside()
        # a member already running (a group overlapping one started before) is kept; one that broke is stopped
        # before its key gets a new engine: overwritten unstopped, its processes kept their memory to the end
        members = [m for m in members if not _running(self._beside.get(config_key(*m)))]
        self._stop_broken([config_key(*m) for m in members])
        if not members:
            return []
        starter = ThreadPoolExecutor(len(members), "llmperf-engine-start")
        started = {config_key(*m): starter.submit(self._start, *m) for m in members}
        starter.shutdown(wait=False)
        self._pending = list(started.values())
        with self.times.timed("engine start"):
            wait(self._pending)
        self._beside.update({k: f.result() for k, f in started.items() if f.exception() is None})
        self._pending = []  # after the update: an interrupt between the two leaves each engine known to close
        return [e for e in (f.exception() for f in started.values()) if e is not None]

    def _stop_broken(self, keys: Sequence[str]) -> None:
        broken = [self._beside.pop(k) for k in keys if k in self._beside]
        if broken:
            with self.times.timed("engine stop"):
                all_at_once([e.shutdown for e in broken])  # best effort: they broke already, their errors said so

    def beside(self, engine: Engine) -> frozenset[int]:
        """The processes of the group's other engines, idle beside `engine` while it is measured; only engines
        still running (one that broke holds no memory)."""
        return frozenset().union(*(e.device_pids() for e in self._beside.values() if e is not engine and _running(e)))

    def _close_beside(self) -> None:
        """The group's engines stopped, side by side, and the card's memory waited for once; starts still
        running (a session interrupted while a group started) are waited for and stopped too."""
        engines, self._beside = list(self._beside.values()), {}
        pending, self._pending = self._pending, []
        if not engines and not pending:
            return
        with self.times.timed("engine stop"):
            wait(pending)
            engines += [e for e in (f.result() for f in pending if f.exception() is None) if e not in engines]
            errors = all_at_once([e.shutdown for e in engines])
            if self.after_close is not None and any(e.holds_device for e in engines):
                self.after_close()
        if errors:
            raise errors[0]  # the first that failed, every one having been stopped

    def _retire(self) -> None:
        """The live engine makes way for another: stopped now, or in the background (`stop_in_background`)."""
        if not self.stop_in_background:
            self._close_live()
            return
        engine, self._engine, self._key = self._engine, None, None
        if engine is None:
            return
        self._stopping.append(self._stopper.submit(engine.shutdown))

    def _wait_for_card(self, engine: Engine) -> None:
        if self.after_close is not None and engine.holds_device:
            self.after_close()

    def _wait_for_stops(self) -> None:
        """Every background stop ended; the first that failed raises its error here."""
        if not self._stopping:
            return
        with self.times.timed("engine stop"):
            while self._stopping:
                self._stopping.pop(0).result()

    def live(self, engine: Engine) -> Engine:
        """`engine` while it is the live one (or one of the group beside it); else the same configuration
        started again (the pool closed it to start another, as a test comparing two engines does, or it
        broke). An engine this pool did not start is returned as it is."""
        if (engine is self._engine or engine in self._beside.values()) and _running(engine):
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
        self._drop_beside(engine)
        return self.get(*made)

    def discard(self, engine: Engine) -> None:
        """Forget an engine that broke mid-run so that the next test starts a fresh one."""
        if engine is self._engine:
            self._close_live()
        self._drop_beside(engine)

    def _drop_beside(self, engine: Engine) -> None:
        key = next((k for k, e in self._beside.items() if e is engine), None)
        if key is not None:
            del self._beside[key]
            with self.times.timed("engine stop"):
                engine.shutdown()

    def close(self) -> None:
        """Every engine of this pool stopped: the live one, the group beside it, any still stopping in the
        background."""
        try:
            self._close_live()
        finally:
            self._close_beside()

    def _close_live(self) -> None:
        engine, self._engine, self._key = self._engine, None, None
        try:
            if engine is not None:
                with self.times.timed("engine stop"):
                    try:
                        engine.shutdown()
                    except BaseException:  # it may still have freed the card: the next start waits for it, and
                        with contextlib.suppress(Exception):  # the stop's error is the one said
                            self._wait_for_card(engine)
                        raise
                    self._wait_for_card(engine)
        finally:
            self._wait_for_stops()
