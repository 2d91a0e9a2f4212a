"""The paging recorder, run inside vLLM's engine-core process as `scheduler_cls`.

`scheduler_cls` names `recording_scheduler`, which builds the recorder on the scheduler vLLM itself
would have chosen: `AsyncScheduler` when the engine runs with async scheduling (the GPU default in
0.26; with a plain `Scheduler` subclass vLLM gives up the overlap of scheduling with the forward pass
and warns of "degraded performance"), `Scheduler` otherwise (the CPU backend in 0.32). The recorder
writes `#scheduler=<vLLM class>` first, so the adapter can say which one ran.

vLLM's v1 engine core owns the block pool and runs in its own process, so the recorder is a
`Scheduler` subclass (the one hook that reaches `kv_cache_manager` with multiprocessing on, in every v1
version from 0.10 to 0.34) that records one line per step and appends them to the file named by
`LLMPERF_KV_TRACE` when the engine goes idle, followed by `#cost_ns=` and the time the recorder has
spent in its own code so far; the test process reads the lines a run produced. The variable is set once
per test process and names `{instance}`, which the recorder fills with its engine's
`vllm_config.instance_id` (made per engine by the front end and pickled to its engine core; checked on
0.26.0 on a GPU and 0.31.0 and 0.32.0 on a CPU; a vLLM without it shares one file, which engines one at a
time can): engines started side by side in one process each write a file of their own, although every
engine-core process inherits the same environment. The recorder also writes `#pid=` (its process): the engine's memory on the card.
Access paths, and the versions they were checked on:

- `self.kv_cache_manager.block_pool.{num_gpu_blocks, get_num_free_blocks()}` (0.10.0-0.34.0;
  slot 0 is the null block, so usable blocks are num_gpu_blocks - 1),
- `...coordinator.single_type_managers[0].{req_to_blocks, block_size}` (0.10.0-0.34.0),
- `request.num_computed_tokens` after `schedule()` includes the tokens scheduled this step,
- `self.kv_cache_manager.prefix_cache_stats.{queries, hits}` (0.10.0-0.34.0; vLLM swaps in a new object
  each time it reports, so deltas are taken per object). vLLM counts them only with log stats on; the
  plugin runs with them off (the front end's per-step stat loggers cost ~4% throughput,
  docs/performance.md), so the recorder turns on the KV manager's own counting (`log_stats`,
  `PrefixCacheStats()`, 0.10.0-0.34.0): the same counts by the same code, nothing reported upstream,
- `RequestStatus.PREEMPTED` on a request that was running before `schedule()` (0.10.0-0.34.0).

Offline batches must be handed to the scheduler atomically, or the first steps depend on how fast
the front end forwards requests and the paging fingerprint is flaky. Requests whose id carries
`llmperf-g<N>-<run>-` are held back until all N sequences of that run have arrived, then released
together; other requests pass straight through.

This module imports vLLM, so only the engine-core process (and the vLLM adapter) imports it.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

try:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
except ImportError:  # vLLM without async scheduling
    AsyncScheduler = None  # type: ignore[assignment,misc]

TRACE_ENV = "LLMPERF_KV_TRACE"
INSTANCE = "{instance}"  # in TRACE_ENV's path: the engine's vllm_config.instance_id
PID_PREFIX = "#pid="
ERROR_PREFIX = "ERROR,"
SCHEDULER_PREFIX = "#scheduler="
COST_PREFIX = "#cost_ns="
GATE = re.compile(r"llmperf-g(\d+)-(\d+)-")
# [<sample>_]llmperf-[g<N>-]<run>-<index>[-<suffix vLLM may add to make ids unique>]
OWN_ID = re.compile(r"(?:(\d+)_)?llmperf-(?:g\d+-)?\d+-(\d+)(?:-[0-9a-zA-Z]+)?")
# column order of a trace line; the adapter parses with the same tuple
FIELDS = ("t", "blocks_used", "blocks_total", "block_size", "tokens_stored", "running", "waiting",
          "preemptions", "prefix_queries", "prefix_hits", "logical_blocks", "admitted", "preempted")
EVENT_SEPARATOR = "|"  # between the request indices of one step's admitted or preempted requests


class _Recording:
    """The recorder, mixed into the scheduler class vLLM runs (see `recording_scheduler`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        path = trace_path(os.environ.get(TRACE_ENV), getattr(self, "vllm_config", None))
        self._out = open(path, "a") if path else None  # noqa: SIM115 - lives as long as the engine
        self._rows: list[tuple[Any, ...]] = []  # this run's samples, written when the engine goes idle
        if self._out is not None:
            vllm_class = next(c.__name__ for c in type(self).__mro__ if c.__module__.startswith("vllm."))
            self._write(f"{SCHEDULER_PREFIX}{vllm_class}\n{PID_PREFIX}{os.getpid()}\n")
        self._held: dict[str, list[Any]] = {}
        self._preemptions = 0
        self._queries = self._hits = 0
        self._stats_obj: Any = None
        self._stats_seen = (0, 0)
        self._broken = False
        # wall time spent in the recorder's own code, cumulative: the share of the engine's critical path
        # the plugin takes, measured where throughput ratios between passes are too noisy to show it
        self._cost_ns = 0
        if self._out is not None:
            self._guarded(self._count_prefix_hits)
            self._guarded(self._sample)  # a missing access path is reported before the first request

    # -- the offline gate -------------------------------------------------------------------
    def add_request(self, request: Any) -> None:
        t0 = time.perf_counter_ns()
        m = GATE.search(request.request_id)
        if m is None:
            self._cost_ns += time.perf_counter_ns() - t0
            return super().add_request(request)
        expected, run = int(m.group(1)), m.group(2)
        held = self._held.setdefault(run, [])
        held.append(request)
        released = self._held.pop(run) if len(held) >= expected else ()
        self._cost_ns += time.perf_counter_ns() - t0
        for r in released:
            super().add_request(r)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        # an abort of a request still held at the gate: drop it there, vLLM never saw it
        t0 = time.perf_counter_ns()
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids or ())
        for run, held in list(self._held.items()):
            self._held[run] = [r for r in held if r.request_id not in ids]
        self._cost_ns += time.perf_counter_ns() - t0
        out = super().finish_requests(request_ids, finished_status)
        self._flush_if_idle()  # aborted runs end here, not in update_from_output
        return out

    # -- one sample per step ----------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        before = list(self.running)
        t1 = time.perf_counter_ns()
        out = super().schedule(*args, **kwargs)
        t2 = time.perf_counter_ns()
        # An idle step (nothing running or waiting) says nothing about paging, and the one that reports
        # a run's last finished requests can land after the client saw the run end: skipping idle
        # steps keeps the fingerprint of a run identical from one run to the next.
        if self._out is not None and not self._broken and (before or self.running or self.waiting):
            preempted = [r for r in before if r.status == RequestStatus.PREEMPTED]
            self._preemptions += len(preempted)
            row = self._guarded(self._sample)
            if row is not None:
                self._rows.append((*row, _events(self.running, before), _names(preempted)))
        self._cost_ns += t1 - t0 + time.perf_counter_ns() - t2
        return out

    # A write per step cost ~3% of throughput on a 2-core CPU (docs/performance.md): samples are kept
    # in memory, formatted and written when the engine goes idle, in the same call that finishes the last
    # requests, so the file is complete before the client sees the run end.
    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        out = super().update_from_output(*args, **kwargs)
        self._flush_if_idle()
        return out

    def _flush_if_idle(self) -> None:
        t0 = time.perf_counter_ns()
        text = ""
        if self._rows and not self.running and not self.waiting:
            text = "".join(",".join(map(str, row)) + "\n" for row in self._rows)
            self._rows.clear()
        # the one write per run is left out of the count: the total goes out in that write
        self._cost_ns += time.perf_counter_ns() - t0
        if text:
            self._write(f"{text}{COST_PREFIX}{self._cost_ns}\n")

    def _write(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()

    def _guarded(self, read: Any) -> tuple[Any, ...] | None:
        """Run one read of vLLM internals; a failure is written to the trace (the test process turns
        it into an error naming the vLLM version) and sampling stops, the engine keeps serving."""
        try:
            return read()
        except (AttributeError, KeyError, IndexError, TypeError, ImportError) as e:
            self._broken = True
            import vllm

            self._write(f"{ERROR_PREFIX}vLLM {vllm.__version__}: {type(e).__name__}: {e}\n")
            return None

    def _sample(self) -> tuple[Any, ...]:
        kvm = self.kv_cache_manager
        pool = kvm.block_pool
        mgr = kvm.coordinator.single_type_managers[0]
        bs = mgr.block_size
        total = pool.num_gpu_blocks - 1
        physical = total - pool.get_num_free_blocks()
        # This O(running) loop is most of the recorder's cost (the recorder took 1.6% of a 1,024-sequence
        # H200 run, docs/performance.md): a local lookup and no min() call halve it in a micro-benchmark.
        blocks_of = mgr.req_to_blocks.get
        logical = tokens = 0
        for r in self.running:
            n = len(blocks_of(r.request_id, ()))
            logical += n
            computed, room = r.num_computed_tokens, n * bs
            tokens += computed if computed < room else room
        # Blocks are shared only when full (prefix caching, parallel samples), so every logical
        # block beyond the physical count is a full duplicate: take its tokens off once.
        tokens -= bs * max(0, logical - physical)
        self._count_prefix_stats(kvm.prefix_cache_stats)
        return (time.monotonic(), physical, total, bs, max(tokens, 0), len(self.running), len(self.waiting),
                self._preemptions, self._queries, self._hits, logical)

    def _count_prefix_hits(self) -> None:
        """With vLLM's stats off its KV manager counts no prefix-cache queries and hits: turn on that
        counting only. The scheduler never asks for the counts then, so one object accumulates."""
        kvm = self.kv_cache_manager
        if not kvm.log_stats:
            from vllm.v1.metrics.stats import PrefixCacheStats

            kvm.prefix_cache_stats = PrefixCacheStats()
            kvm.log_stats = True

    def _count_prefix_stats(self, stats: Any) -> None:
        if stats is None:
            return
        q, h = int(stats.queries), int(stats.hits)
        if stats is self._stats_obj:
            dq, dh = q - self._stats_seen[0], h - self._stats_seen[1]
        else:
            dq, dh = q, h
        self._queries += max(dq, 0)
        self._hits += max(dh, 0)
        self._stats_obj, self._stats_seen = stats, (q, h)


def trace_path(template: str | None, vllm_config: Any) -> str | None:
    """The file an engine's recorder writes: `template` (LLMPERF_KV_TRACE) with `{instance}` its engine's
    instance id. The test process calls it with the same config once the engine has started."""
    if not template:
        return None
    return template.replace(INSTANCE, str(getattr(vllm_config, "instance_id", "") or "engine"))


def _events(running: Any, before: list[Any]) -> str:
    """The requests this step admitted (running now, not before it): one set lookup per running request."""
    seen = {r.request_id for r in before}
    return _names([r for r in running if r.request_id not in seen])


def _names(requests: list[Any]) -> str:
    """Request names for the paging timeline: the workload index ending the plugin's request ids
    (`llmperf-<run>-<index>`; `<index>.<k>` for the k-th parallel sample, which vLLM names
    `<k>_<parent id>`), never the run number, so that two runs name requests alike; other ids with the
    trace's separators taken out."""
    return EVENT_SEPARATOR.join(_name(r.request_id) for r in requests)


def _name(request_id: str) -> str:
    m = OWN_ID.fullmatch(request_id)
    if m is None:
        return request_id.replace(",", "").replace(EVENT_SEPARATOR, "")
    return m.group(2) + (f".{m.group(1)}" if m.group(1) else "")


class PagingRecorder(_Recording, Scheduler):
    pass


if AsyncScheduler is not None:

    class AsyncPagingRecorder(_Recording, AsyncScheduler):
        pass


def recorder_class(vllm_config: Any) -> type[Scheduler]:
    """The recorder on the scheduler class vLLM would have chosen for this configuration."""
    if AsyncScheduler is not None and getattr(vllm_config.scheduler_config, "async_scheduling", False):
        return AsyncPagingRecorder
    return PagingRecorder


def recording_scheduler(*args: Any, **kwargs: Any) -> Scheduler:
    """What vLLM calls as its scheduler class (`scheduler_cls`): builds `recorder_class(vllm_config)`."""
    return recorder_class(kwargs.get("vllm_config", args[0] if args else None))(*args, **kwargs)
