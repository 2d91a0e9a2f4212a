"""`llmperf.run`: warm up (until steady on a GPU), drive the workload `repeats` times, summarise, remember the result."""

from __future__ import annotations

import gc
import math
import numbers
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from .engines.base import Engine
from .gpu import GpuError, NvmlSampler, memory_held_by, process_exists
from .metrics import PerfResult, summarize, throughput, with_timing_noise
from .stats import pass_noise
from .sweep import Sweep, SweepPoint, holds, unknown_latency_metrics
from .timing import PhaseTimes
from .trace import GpuSample, Roofline, RunTrace, SequenceTrace
from .validity import why_invalid
from .workload import Workload, whole_number

WARMUP_REQUESTS = 4
# "quick": a few requests load kernels and allocate buffers (enough on a CPU). "steady": then whole
# passes of the workload until two in a row agree on output throughput, and one more: a GPU engine keeps
# getting faster for several passes as it meets new batch shapes (docs/performance.md, detection
# power); once per engine, since the engine stays warm for the session's later runs. "auto": steady
# where a GPU is sampled, quick elsewhere. The spread of the last three passes is the engine's
# pass-to-pass noise: every later result of that engine carries it, so a baseline comparison is never
# tighter than it.
WARMUP_MODES = ("auto", "quick", "steady")
STEADY_AGREEMENT = 0.03
STEADY_MAX_PASSES = 6
# A workload whose pass takes tens of seconds (transformers' static batches of an 8B shape: about 20 s)
# stops after three passes once the warm-up has taken this long: six such passes cost two minutes per
# engine start, and three passes already give the noise figure the comparison needs.
STEADY_MAX_SECONDS = 60.0
# salts: warm-up and every repeat get their own token ids, so no pass finds another's prefix cache
_WARMUP_SALT = 10_000


@dataclass(frozen=True)
class Run:
    """One `llmperf.run` of a test: its result, the workload it drove and the engine it ran on. The one
    record that judging, the baseline gate and the reports read (an engine restarted for a second look
    replaces `engine` here, for every run of the old one)."""

    result: PerfResult
    workload: Workload
    engine: Engine

    def environment(self) -> dict[str, Any]:
        """What ran: the engine, its version and its configuration as the engine reports them."""
        return {"engine": self.engine.name, "engine_version": self.engine.version,
                "model": getattr(getattr(self.engine, "model", None), "name", None),
                "engine_config": dict(self.engine.config)}


class Results(Sequence[PerfResult]):
    """`llmperf.results`: the test's results in the order they were made. `clear()` unbinds them from
    the test (a test whose failures were its point)."""

    def __init__(self, runs: list[Run]) -> None:
        self._runs = runs

    def __getitem__(self, index: Any) -> Any:
        picked = self._runs[index]
        return [r.result for r in picked] if isinstance(index, slice) else picked.result

    def __len__(self) -> int:
        return len(self._runs)

    def clear(self) -> None:
        self._runs.clear()


@dataclass(repr=False)
class LLMPerf:
    """The `llmperf` fixture: runs workloads and binds their results to the current test.

    `on_broken` is told about an engine that raised mid-run, so that the pool can restart it for the
    next test instead of handing out a half-dead engine.
    """

    test_id: str = ""
    on_broken: Callable[[Engine], None] | None = None
    # an engine ready to measure again: the same one, or its configuration restarted when the pool has
    # since closed it (a test that measured transformers, then vLLM)
    revive: Callable[[Engine], Engine] | None = None
    restart: Callable[[Engine], Engine] | None = None  # the same configuration in a fresh engine start
    # the processes of engines idle beside the measured one (the pool's group), whose memory is not its own
    beside: Callable[[Engine], frozenset[int]] | None = None
    gpu_index: int | None = None  # sample this device with NVML during every measured pass
    # this worker's devices (gpu_index first): an engine of several GPUs is sampled on its first `gpus`
    gpu_indices: tuple[int, ...] = ()
    gpu_interval_s: float = 0.01
    roofline_of: Callable[[Engine], Roofline | None] | None = None  # the engine's floor on this GPU
    # judges each result as it is made (Hypothesis tests: a violation must fail the example inside
    # the test body for shrinking to work); gets a function that measures the workload again (the n-th time)
    check: Callable[[PerfResult, Workload, Callable[[int], PerfResult]], None] | None = None
    times: PhaseTimes = field(default_factory=PhaseTimes)  # the session's, where the plugin runs it
    warmup_mode: str = "auto"  # what warmup=True means (--llmperf-warmup)
    # False where the test's baseline gates no timing metric (its llmperf_gate): "auto" then warms up
    # quickly on a GPU too, since the steady warm-up serves timing only (paging repeats exactly after any)
    timing_gated: bool = True
    # engines warmed until steady, with the pass-to-pass noise their warm-up saw (the session's)
    steady_engines: MutableMapping[Engine, float] = field(default_factory=weakref.WeakKeyDictionary)
    # per sweep kind ("rate", "concurrency"), the latency limits the test's min_capacity marker judges it by: a
    # sweep given no `under=` takes them, so that its saturated points count as over capacity (validity) and its
    # capacity is compared with the baseline, as for a sweep that names its own
    capacity_under: dict[str, dict[str, float]] = field(default_factory=dict)
    sweeps: list[Sweep] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)

    def __repr__(self) -> str:
        # short: Hypothesis prints each fixture of a falsifying example, and the runs it holds are thousands of lines
        return f"<llmperf fixture of {self.test_id or 'a test'}: {len(self.runs)} runs>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis's printer (IPython's protocol), which would otherwise print a dataclass field by field."""
        printer.text(repr(self))

    @property
    def results(self) -> Results:
        return Results(self.runs)

    def run(self, engine: Engine, workload: Workload, repeats: int = 1, warmup: bool | str = True,
            label: str = "") -> PerfResult:
        _check_args(engine, workload, repeats)
        if self.check is None:  # a property test keeps one example's result at a time
            _check_label(label, self.runs)
        mode = self._warmup(warmup)
        engine.check_fits(workload)
        traces: list[RunTrace] = []
        passes = 0
        measuring = False
        try:
            if mode is not None:
                with self.times.timed("warm-up"):
                    passes = self._warm_up(engine, workload, mode)
            measuring = True
            for i in range(repeats):
                traces.append(self._measured(engine, workload, salt=i))
        except BaseException as e:
            if self.on_broken is not None and not isinstance(e, GpuError):  # the card's reading, not the engine
                self.on_broken(engine)
            died = getattr(e, "trace", None)  # the measured pass an engine died in: its failed requests count
            if measuring and died is not None:
                traces.append(died)
            if traces:  # what was measured before the crash is reported, marked partial, never a pass
                self._keep_result(summarize(traces, workload.hash, len(workload), label=label, partial=True),
                                  engine, workload)
            raise
        result = replace(summarize(traces, workload.hash, len(workload), label=label, turns=workload.turns),
                         warmup=mode or "none", warmup_passes=passes, invalid=why_invalid(traces, workload))
        result = with_timing_noise(result, self.steady_engines.get(engine, 0.0))
        self._keep_result(result, engine, workload)
        if self.check is not None:
            self.check(result, workload, lambda n: self._again(engine, workload, repeats, label, n))
        return result

    def sweep(self, engine: Engine, workload_factory: Callable[[float], Workload], *,
              concurrency: Sequence[int] | None = None, rates: Sequence[float] | None = None, repeats: int = 1,
              warmup: bool | str = True, label: str = "sweep", under: Mapping[str, float] | None = None) -> Sweep:
        """One run per concurrency (or request rate): `workload_factory(value)` builds each point's
        workload. Points are results too (labelled `label@value`); limit markers judge the curve
        through `min_capacity`, not each point."""
        kind, values = _sweep_values(concurrency, rates)
        self._check_sweep_label(label)
        problem = unknown_latency_metrics(under or {})
        if problem:  # before any point runs, not after the whole sweep
            raise ValueError(problem)
        points = []
        for i, value in enumerate(values):
            result = self.run(engine, _workload_of(workload_factory, value), repeats=repeats,
                              warmup=warmup if i == 0 else False, label=f"{label}@{value:g}")
            points.append(SweepPoint(value, result))
        return self._keep(Sweep(kind, label, tuple(points), dict(under or self.capacity_under.get(kind, {}))))

    def find_capacity(self, engine: Engine, rate_factory: Callable[[float], Workload], *,
                      under: Mapping[str, float], lo: float, hi: float, max_runs: int = 8, rel_tol: float = 0.1,
                      repeats: int = 1, label: str = "capacity") -> Sweep:
        """The largest sustainable request rate under `under` (e.g. {"p99_ttft_ms": 500}) by bisection
        between `lo` and `hi`, in at most `max_runs` runs; `.max_rate` on the returned sweep."""
        if not 0 < lo < hi or max_runs < 2:
            raise ValueError(f"find_capacity needs 0 < lo < hi and max_runs >= 2, got lo={lo}, hi={hi}, max_runs={max_runs}")
        if not isinstance(under, Mapping) or not under:
            raise ValueError(f"find_capacity's under={under!r} must name latency limits, e.g. {{'p99_ttft_ms': 500}}")
        problem = unknown_latency_metrics(under)
        if problem:  # before the first point, not after it
            raise ValueError(problem)
        self._check_sweep_label(label)
        points: list[SweepPoint] = []

        def name(rate: float) -> str:
            return f"{label}@{rate:.6g}"

        def measure(rate: float) -> bool:
            result = self.run(engine, _workload_of(rate_factory, rate), repeats=repeats, warmup=not points,
                              label=name(rate))
            points.append(SweepPoint(rate, result))
            return holds(result, under)

        if name(lo) == name(hi):
            raise ValueError(f"find_capacity's lo={lo} and hi={hi} are too close to name apart: widen the range")
        if measure(lo) and not measure(hi):
            while len(points) < max_runs and (hi - lo) / hi > rel_tol:
                mid = (lo + hi) / 2
                if name(mid) in {name(p.value) for p in points}:
                    break  # closer than a point's name tells apart: the search has converged
                lo, hi = (mid, hi) if measure(mid) else (lo, mid)
        points.sort(key=lambda p: p.value)
        return self._keep(Sweep("rate", label, tuple(points), dict(under), searched=True))

    def _warmup(self, warmup: bool | str) -> str | None:
        """The warm-up this run gets: None, "quick" or "steady"."""
        if warmup is False:
            return None
        mode = self.warmup_mode if warmup is True else warmup
        if mode not in WARMUP_MODES:
            raise ValueError(f"warmup={mode!r}: choose True, False or one of {', '.join(WARMUP_MODES)}")
        if mode == "auto":
            return "steady" if self.gpu_index is not None and self.timing_gated else "quick"
        return mode

    def _warm_up(self, engine: Engine, workload: Workload, mode: str) -> int:
        """Returns the whole-workload passes a steady warm-up took (0 for quick, or for an engine an
        earlier run already brought to a steady rate)."""
        _drive(engine, _warmup_of(workload), _WARMUP_SALT)
        if mode == "quick" or engine in self.steady_engines:
            return 0
        offline = workload.as_offline()  # arrival times would cap the rate this watches
        rates: list[float] = []
        start = time.monotonic()

        def one_pass() -> None:
            rates.append(throughput(_drive(engine, offline, _WARMUP_SALT + 1 + len(rates))).output_tokens_per_s)

        while len(rates) < STEADY_MAX_PASSES:
            one_pass()
            if len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= STEADY_AGREEMENT * rates[-2]:
                # The rule stopped because these two passes agreed, so their spread understates the
                # engine's noise: on a noisy H200 an engine settled this way and unchanged runs still
                # landed at 0.81-1.19 of its baseline (docs/performance.md). One more pass, which the
                # rule did not choose, measures it.
                one_pass()
                self.steady_engines[engine] = pass_noise(rates)
                return len(rates)
            if len(rates) >= 3 and time.monotonic() - start >= STEADY_MAX_SECONDS:
                break
        noise = self.steady_engines[engine] = pass_noise(rates)
        warnings.warn(
            f"llmperf: output throughput still changing after {len(rates)} warm-up passes in "
            f"{time.monotonic() - start:.0f} s ({', '.join(f'{r:.0f}' for r in rates)} tok/s): the engine is not steady, "
            "so results may drift; "
            f"its timing metrics carry ±{noise:.0%} of noise, which baseline comparisons allow for. Use repeats >= 3, "
            "a CUDA-graph (non-eager) configuration, or a longer workload", stacklevel=3)
        return len(rates)

    def _check_sweep_label(self, label: str) -> None:
        """A sweep's label names its capacity's baseline entry: two sweeps of one label (a concurrency and a rate
        sweep, whose points' names differ) would share it, and one capacity would never be compared. A property
        test keeps one example's result at a time, so it can hold no curve."""
        if self.check is not None:
            raise ValueError("llmperf.sweep and find_capacity measure a curve, and a property test's examples are "
                             "judged one llmperf.run each: sweep in a plain test")
        if any(s.label == label for s in self.sweeps):
            raise ValueError(f"this test already recorded a sweep labelled {label!r}: give each sweep and find_capacity "
                             "of a test a label of its own (label=...)")

    def _keep(self, sweep: Sweep) -> Sweep:
        self.sweeps.append(sweep)
        return sweep

    @property
    def sweep_labels(self) -> set[str]:
        return {p.result.label for s in self.sweeps for p in s.points}

    def remeasure(self, index: int, salt: int) -> PerfResult:
        """The test's `index`-th result measured once more on its (still warm) engine, as it was first
        measured; not bound to the test. How the baseline gate tells noise from a regression. Give each
        call of one result its own `salt` (1, 2, ...)."""
        result, engine, workload = self.runs[index].result, self.runs[index].engine, self.runs[index].workload
        try:
            engine = self._revived(index)
            again = self._again(engine, workload, result.repeats, result.label, salt, "re-measurement")
        except BaseException:
            if self.on_broken is not None:
                self.on_broken(engine)
            raise
        return with_timing_noise(again, self.steady_engines.get(engine, 0.0))

    def restart_engine(self, index: int) -> Engine:
        """The engine of the `index`-th result started afresh and warmed up as its first run was; every
        result of the old engine now points at the new one. Unchanged where no `restart` is given."""
        old = self.runs[index].engine
        if self.restart is None:
            return old
        live = self.restart(old)
        if live is not old:
            mode = self._warmup_had(old, index)
            self.runs[:] = [replace(r, engine=live) if r.engine is old else r for r in self.runs]
            self._warm(live, mode, index)
        return live

    def _warmup_had(self, old: Engine, index: int) -> str:
        """The warm-up an engine started in place of `old` gets: steady where any of `old`'s results had one (a
        sweep's later points ride on its first point's), else the quick one. The session's mode gave a run
        measured after a quick warm-up a steady one (and a steady engine's noise allowance) in its second look,
        better warmed than its baseline; a run that took none may still have found its shared engine warm from
        earlier tests, so a fresh start gets the quick warm-up at least."""
        had = {r.result.warmup for r in self.runs if r.engine is old} | {self.runs[index].result.warmup}
        return "steady" if "steady" in had else "quick"

    def _warm(self, engine: Engine, mode: str, index: int) -> None:
        with self.times.timed("warm-up"):
            self._warm_up(engine, self.runs[index].workload, mode)

    def _revived(self, index: int) -> Engine:
        """The engine of the `index`-th result, started again (and warmed up as the first run was) when
        the pool has closed it since."""
        engine = self.runs[index].engine
        if self.revive is None:
            return engine
        live = self.revive(engine)
        if live is not engine:
            mode = self._warmup_had(engine, index)
            self.runs[index] = replace(self.runs[index], engine=live)
            self._warm(live, mode, index)
        return live

    def _again(self, engine: Engine, workload: Workload, repeats: int, label: str, salt: int,
               phase: str = "measurement") -> PerfResult:
        # salts of their own (above the first measurement's), so no pass finds another's prefix cache
        traces = [self._measured(engine, workload, 100 + salt * repeats + i, phase) for i in range(repeats)]
        return replace(summarize(traces, workload.hash, len(workload), label=label, turns=workload.turns),
                       invalid=why_invalid(traces, workload))

    def _keep_result(self, result: PerfResult, engine: Engine, workload: Workload) -> None:
        if self.check is not None:
            # one example of a property test: only its own result stays bound to the test
            self.runs.clear()
        self.runs.append(Run(result, workload, engine))

    def _measured(self, engine: Engine, workload: Workload, salt: int, phase: str = "measurement") -> RunTrace:
        with self.times.timed(phase):
            trace = self._pass(engine, workload, salt)
        if trace.gpu and self.roofline_of is not None:  # outside the clock: a first call probes the bandwidth
            trace = replace(trace, roofline=self.roofline_of(engine))
        return trace

    def _pass(self, engine: Engine, workload: Workload, salt: int) -> RunTrace:
        if self.gpu_index is None:
            return _drive(engine, workload, salt)
        devices = self._devices_of(engine)
        # a neighbour whose processes are gone (its engine core died idle) holds nothing: NVML charging it no
        # memory is then no sign of a container that hides process ids
        neighbours = frozenset(p for p in (self.beside(engine) if self.beside is not None else ()) if process_exists(p))
        held = memory_held_by(devices, neighbours) if neighbours else {}
        with NvmlSampler(devices, self.gpu_interval_s) as sampler:
            trace = _drive(engine, workload, salt)
        if sampler.error:
            warnings.warn(f"llmperf: {sampler.error}; GPU figures cover only the samples before it", stacklevel=3)
        if not neighbours:
            return replace(trace, gpu=sampler.samples)
        after = memory_held_by(devices, neighbours)
        held = {d: max(held[d], after[d]) for d in devices}
        if not any(held.values()):
            raise GpuError(f"NVML charges no memory to the engines beside this one (processes {sorted(neighbours)}; in a "
                           "container without the host's process ids it cannot), so the card's memory reading cannot "
                           "be this engine's alone: run with --llmperf-side-by-side=off")
        return replace(trace, gpu=own_memory(sampler.samples, held))

    def _devices_of(self, engine: Engine) -> tuple[int, ...]:
        mine = self.gpu_indices or (self.gpu_index or 0,)
        if engine.gpus > len(mine):
            raise GpuError(f"the {engine.name} engine spreads over {engine.gpus} GPUs and this worker has "
                           f"{len(mine)} ({', '.join(map(str, mine))}): run with --llmperf-gpus-per-worker={engine.gpus}")
        return mine[:engine.gpus]


def own_memory(samples: tuple[GpuSample, ...], held: dict[int, int]) -> tuple[GpuSample, ...]:
    """The card's readings less what engines idle beside the measured one hold (`held`, per device): the
    reading the engine alone would give, as its baselines were recorded (within 17 MiB on an H100:
    benchmarks/side_by_side_starts.py)."""
    return tuple(replace(s, memory_used_bytes=s.memory_used_bytes - held.get(s.device, 0)) for s in samples)


@contextmanager
def static_heap() -> Iterator[None]:
    """Keeps every object alive before a pass out of the garbage collector's work during it, as
    `vllm serve` marks its startup heap static (`gc.freeze()`). The test process's heap (pytest, torch,
    other engines, earlier results) made one full collection per 1,024-request pass take 0.4-0.7 s,
    on the CPU and on an H200 (docs/performance.md): a stall in the front end of an in-process engine
    that delays every token stamped behind it. Collections still run over what the pass creates."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


NO_ANSWER = "the engine returned nothing for this request"


def _drive(engine: Engine, workload: Workload, salt: int) -> RunTrace:
    with static_heap():
        trace = engine.run(workload, salt=salt)
    return with_unanswered(trace, workload)


def with_unanswered(trace: RunTrace, workload: Workload) -> RunTrace:
    """`trace` with a failed sequence for each sample of each request the engine returned nothing for:
    an engine (a third party's, registered by entry point) that drops a request must not make it vanish
    from the error rate, which counts the sequences it got."""
    got = {(s.index, s.sample) for s in trace.sequences}
    lost = tuple(SequenceTrace(i, k, r.prompt_len, r.output_len, trace.start_t, (), NO_ANSWER)
                 for i, r in enumerate(workload.requests) for k in range(r.n) if (i, k) not in got)
    return replace(trace, sequences=(*trace.sequences, *lost)) if lost else trace


def _sweep_values(concurrency: Sequence[int] | None, rates: Sequence[float] | None) -> tuple[str, list[float]]:
    if (concurrency is None) == (rates is None):
        raise ValueError("llmperf.sweep takes exactly one of concurrency=[...] or rates=[...]")
    kind, given = ("concurrency", concurrency) if concurrency is not None else ("rate", rates)
    if not given or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0
                        for v in given):
        raise ValueError(f"sweep {kind} values must be a non-empty list of finite positive numbers, got {given!r}")
    if kind == "concurrency" and not all(whole_number(v) for v in given):
        raise ValueError(f"sweep concurrency values must be whole numbers of requests in flight, got {given!r}")
    # plain Python numbers (numpy's too): each point's label and its workload factory see 4, not np.int64(4)
    values = [int(v) if kind == "concurrency" or isinstance(v, numbers.Integral) else float(v) for v in given]
    if len(set(values)) != len(values):
        raise ValueError(f"sweep {kind} values {given!r} repeat a value: each point is measured once")
    return kind, sorted(values)


def _workload_of(factory: Callable[[float], Workload], value: float) -> Workload:
    workload = factory(value)
    if not isinstance(workload, Workload):
        raise TypeError(f"the sweep's workload factory returned {type(workload).__name__} for {value}: return a Workload")
    return workload


def _warmup_of(workload: Workload) -> Workload:
    """A few of the workload's own requests, offline: enough to load kernels and allocate buffers."""
    return Workload(workload.requests[:WARMUP_REQUESTS], seed=workload.seed, kind="warmup").as_offline()


def _check_label(label: str, runs: Sequence[Run]) -> None:
    """A label names one result of a test (an unlabelled one is named by its place, "0", "1", ...): its
    baseline entry, and the engine it is measured again on. Two results of one name would share both."""
    mine = label or str(len(runs))
    if any((run.result.label or str(i)) == mine for i, run in enumerate(runs)):
        raise ValueError(f"llmperf.run(label={mine!r}): this test already recorded a result named {mine!r}; give each "
                         "llmperf.run, sweep and find_capacity of a test a label of its own (a sweep's points are "
                         "named label@value)")


def _check_args(engine: Any, workload: Any, repeats: Any) -> None:
    if not isinstance(workload, Workload):
        raise TypeError(f"llmperf.run needs a Workload, got {type(workload).__name__}: build one with Workload.offline(...)")
    if not isinstance(engine, Engine):
        raise TypeError(f"llmperf.run needs an engine fixture (hf_engine, vllm_engine, llm_engine), got {engine!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an int >= 1")
