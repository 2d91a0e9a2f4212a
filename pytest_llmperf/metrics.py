"""Turning run traces into summary metrics. Definitions are contracts (docs/metrics.md):

- TTFT: submit -> first output token received.      - E2E: submit -> last token received.
- TPOT per sequence: (E2E - TTFT) / (output tokens - 1), as `vllm bench serve`.
- ITL: the gap between consecutive streamed chunks (a chunk may carry several tokens).
- Percentiles use numpy's linear interpolation (as vLLM's benchmarks), over sequences for
  TTFT/TPOT/E2E and over gaps for ITL. Failed sequences are left out and counted.
- Throughput: output tokens / (last completion - first submission); total adds prompt tokens.
- KV fragmentation at a step: 1 - tokens stored / (blocks used x block size); max over steps and
  the slot-weighted mean (sum of tokens / sum of slots over steps).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from . import stats
from .paging_timeline import Timeline
from .trace import GpuSample, KVSample, RunTrace, SequenceTrace, ServerTimes

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "ttfo")
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
# the flat names of every latency statistic: p99_ttft_ms, p50_itl_ms, ...
LATENCY_METRIC_NAMES = tuple(f"{stat}_{name}_ms" for name in LATENCY_METRICS for stat in LATENCY_STATS)
_GIB = 1024**3


@dataclass(frozen=True)
class LatencyStats:
    """One latency metric in milliseconds; every field is None when nothing was measured."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    mean: float | None = None
    count: int = 0

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> LatencyStats:
        if len(values_ms) == 0:
            return cls()
        arr = np.asarray(values_ms, dtype=float)
        p50, p90, p95, p99 = (float(x) for x in np.percentile(arr, PERCENTILES))
        return cls(p50, p90, p95, p99, float(arr.max()), float(arr.mean()), int(arr.size))


@dataclass(frozen=True)
class Throughput:
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float


@dataclass(frozen=True)
class KVStats:
    """Paging metrics; None where the engine cannot tell."""

    fragmentation_max: float | None = None
    fragmentation_mean: float | None = None
    usage_peak: float | None = None
    usage_mean: float | None = None
    blocks_peak: int | None = None
    blocks_total: int | None = None
    block_size: int | None = None
    preemptions: int | None = None
    prefix_hit_rate: float | None = None
    # (seconds since run start, usage, fragmentation, blocks used, preemptions so far), for plots
    timeline: tuple[tuple[float, float, float, int, int], ...] = field(default=(), repr=False)
    # what the scheduler did at each step (running, waiting, blocks, admitted, preempted): for baselines
    steps: Timeline | None = field(default=None, repr=False)


@dataclass(frozen=True)
class GpuStats:
    """NVML figures of the engine's devices during the pass; None without a GPU. Memory is per GPU
    (`memory_peak_gib`: the busiest card, the one that runs out), with the sum over the engine's GPUs
    beside it; energy and power are the engine's, summed over its GPUs."""

    memory_peak_gib: float | None = None
    memory_idle_gib: float | None = None  # at the start of the pass, the busiest card
    memory_total_gib: float | None = None  # capacity of one card
    devices: int = 1
    memory_peak_per_gpu_gib: tuple[float, ...] = ()
    memory_peak_all_gib: float | None = None  # the largest sum over the engine's GPUs at one sample
    utilization_per_gpu_pct: tuple[float | None, ...] = ()
    framework_peak_gib: float | None = None
    energy_per_token_j: float | None = None
    utilization_mean_pct: float | None = None
    power_mean_w: float | None = None
    # (peak - idle) over all the engine's GPUs / the most sequences in flight at once
    memory_per_request_mib: float | None = None
    # time the busy engine steps must take at the device's memory bandwidth (weights + KV read per
    # step) over the time they took; 1.0 is the roofline (meaningful for decode-dominated workloads)
    roofline_fraction: float | None = None
    # (seconds since run start, memory used GiB summed over the engine's GPUs), for plots
    timeline: tuple[tuple[float, float], ...] = field(default=(), repr=False)

    @property
    def memory_peak_fraction(self) -> float | None:
        if self.memory_peak_gib is None or not self.memory_total_gib:
            return None
        return self.memory_peak_gib / self.memory_total_gib


@dataclass(frozen=True)
class SequenceMetrics:
    index: int
    sample: int
    prompt_len: int
    output_len: int
    ttft: float | None
    tpot: float | None
    e2e: float | None
    itl: float | None  # the sequence's largest gap, so a worst-requests list can point at it
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, where the engine says
    server_times: ServerTimes | None = None  # the engine's own timing of it, where it reports it
    # time to first output: the answer's first token (after reasoning streamed apart from it), else its TTFT;
    # None where the output was all reasoning
    ttfo: float | None = None


@dataclass(frozen=True)
class ServerLatency:
    """The engine's own per-request timing (`ServerTimes`) over the result's sequences: queue wait, TTFT
    from scheduling, decode time. Empty (count 0) where the engine reports none: `vllm serve` needs
    `--enable-per-request-metrics`, vLLM in-process `disable_log_stats=False`."""

    queue: LatencyStats = field(default_factory=LatencyStats)
    ttft: LatencyStats = field(default_factory=LatencyStats)
    generation: LatencyStats = field(default_factory=LatencyStats)

    @classmethod
    def of(cls, sequences: Sequence[SequenceMetrics]) -> ServerLatency:
        told = [s.server_times for s in sequences if s.server_times is not None]

        def stats(name: str) -> LatencyStats:
            return LatencyStats.of([v for t in told if (v := getattr(t, name)) is not None])

        return cls(stats("queue_ms"), stats("ttft_ms"), stats("generation_ms"))


@dataclass(frozen=True)
class TurnStats:
    """One turn of a session workload over all its sessions: how many requests, their TTFT, and the
    share of their prompt tokens the engine served from its prefix cache (None where it does not say)."""

    turn: int
    requests: int
    ttft: LatencyStats
    prefix_cached_share: float | None


@dataclass(frozen=True)
class PerfResult:
    """What `llmperf.run` returns: summary metrics over all repeats, plus per-sequence rows."""

    engine: str
    workload_hash: str
    repeats: int
    n_requests: int
    n_sequences: int
    failed: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    throughput: Throughput
    kv: KVStats
    gpu: GpuStats
    sequences: tuple[SequenceMetrics, ...] = field(repr=False)
    per_repeat: tuple[dict[str, float | None], ...] = field(repr=False)
    errors: tuple[str, ...] = field(default=(), repr=False)
    # relative half-width of the 95% interval of each latency percentile (p50_ttft_ms: 0.04): the wider
    # of its order-statistic interval and a bootstrap that resamples engine steps whole (`latency_noise`)
    noise: dict[str, float] = field(default_factory=dict, repr=False)
    # independent samples behind each latency metric's percentiles (ttft: requests; itl: engine steps)
    samples: dict[str, int] = field(default_factory=dict, repr=False)
    duration_s: float = 0.0
    label: str = ""
    partial: bool = False  # the run crashed after these repeats: reported, never a pass
    warmup: str = "none"  # "quick", "steady" or "none" (runner.py says what each does)
    warmup_passes: int = 0  # whole passes a steady warm-up took (0: the engine was steady from an earlier run)
    # why the measurement is not valid (validity.py: the client fell behind its arrival schedule); "" when valid
    invalid: str = ""
    # a session workload's TTFT and prefix-cache hits turn by turn (`by_turn`); empty for other workloads
    by_turn: tuple[TurnStats, ...] = ()
    # the engine's own timing of the same requests (queue, TTFT from scheduling, decode), where it says
    server: ServerLatency = field(default_factory=ServerLatency)
    # why a metric the engine has was not measured in a pass (flat metric name -> reason)
    unmeasured: dict[str, str] = field(default_factory=dict)
    # time to first output: the answer's first token, after the reasoning the engine streamed apart from it
    # (a sequence without reasoning: its TTFT, as AIPerf has it; one that was all reasoning: left out). TTFT
    # counts reasoning tokens as output, as `vllm bench serve`, GuideLLM and AIPerf do
    ttfo: LatencyStats = field(default_factory=LatencyStats)
    reasoned: int = 0  # sequences whose engine streamed reasoning apart from the answer, first
    # requests sent a second time because their connection failed before any answer (an HTTP engine's
    # keep-alive race); their TTFT counts from the first send, and the test's report says how many
    resent: int = 0

    @property
    def error_rate(self) -> float:
        return self.failed / self.n_sequences if self.n_sequences else 0.0

    def flat(self) -> dict[str, float | None]:
        """Flat `<stat>_<metric>_<unit>` names, as `vllm bench serve` prints them."""
        return flat_metrics(self)

    def worst(self, metric: str, k: int = 3) -> list[SequenceMetrics]:
        rows = [s for s in self.sequences if getattr(s, metric) is not None]
        return sorted(rows, key=lambda s: getattr(s, metric), reverse=True)[:k]

    def goodput(self, **limits_ms: float) -> float:
        """Sequences per second that completed and met every given latency limit (ttft=, tpot=, e2e=, ttfo=,
        in ms; with none, the completed ones, as `vllm bench serve` counts); a sequence whose output was all
        reasoning has no TTFO and does not meet a ttfo= limit."""
        unknown = set(limits_ms) - {"ttft", "tpot", "e2e", "ttfo"}
        if unknown:
            raise ValueError(f"goodput takes ttft=, tpot=, e2e=, ttfo= limits in ms, not {sorted(unknown)}")
        good = sum(s.e2e is not None  # a failed sequence has no timing: it met nothing, limits or none
                   and all((v := _goodput_value(s, m)) is not None and v <= lim for m, lim in limits_ms.items())
                   for s in self.sequences)
        return good / self.duration_s if self.duration_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        # the per-step records are dropped: left out before asdict, which would copy them all first
        lean = replace(self, sequences=(), kv=replace(self.kv, timeline=(), steps=None), gpu=replace(self.gpu, timeline=()))
        d = asdict(lean)
        d.pop("sequences")
        d["kv"].pop("timeline")
        d["kv"].pop("steps")
        d["gpu"].pop("timeline")
        d["flat"] = self.flat()
        return d


THROUGHPUT_METRICS = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s")


def _goodput_value(s: SequenceMetrics, metric: str) -> float | None:
    """A sequence's value for a goodput limit: a single output token has no TPOT, and counts as 0 ms as in
    `vllm bench serve` (it met any TPOT limit; a sequence without a first token met none)."""
    value = getattr(s, metric)
    return 0.0 if value is None and metric == "tpot" and s.ttft is not None else value


def flat_metrics(r: PerfResult) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in LATENCY_METRICS:
        stats: LatencyStats = getattr(r, name)
        for stat in LATENCY_STATS:
            out[f"{stat}_{name}_ms"] = getattr(stats, stat)
    out.update(
        output_tokens_per_s=r.throughput.output_tokens_per_s,
        total_tokens_per_s=r.throughput.total_tokens_per_s,
        requests_per_s=r.throughput.requests_per_s,
        output_tokens_per_s_per_gib=throughput_per_gib(r),
        error_rate=r.error_rate,
        duration_s=r.duration_s,
    )
    for k in ("fragmentation_max", "fragmentation_mean", "usage_peak", "usage_mean", "blocks_peak",
              "preemptions", "prefix_hit_rate"):
        out[f"kv_{k}"] = getattr(r.kv, k)
    for k in ("memory_peak_gib", "memory_peak_fraction", "framework_peak_gib", "energy_per_token_j",
              "memory_per_request_mib", "roofline_fraction"):
        out[f"gpu_{k}"] = getattr(r.gpu, k)
    # a metric one pass did not measure is not measured: the other passes' value would stand for it in a
    # baseline comparison (which reads these names), while the limit checks already refuse it
    return {k: None if k in r.unmeasured else v for k, v in out.items()}


def throughput_per_gib(r: PerfResult) -> float | None:
    """Output tokens/s per GiB of device memory at the peak, over all the engine's GPUs at once (None without
    NVML): one card's peak would flatter a tensor-parallel engine by its number of cards. A sweep's curve
    and a plain run are judged by this one definition."""
    peak = r.gpu.memory_peak_all_gib
    return r.throughput.output_tokens_per_s / peak if peak else None


# -- per trace -------------------------------------------------------------------------------------
def sequence_metrics(s: SequenceTrace) -> SequenceMetrics:
    if not s.ok:
        return SequenceMetrics(s.index, s.sample, s.prompt_len, s.output_len, None, None, None, None, s.cached_tokens,
                               s.server_times)
    ttft = (s.chunks[0].t - s.submit_t) * 1e3
    e2e = (s.chunks[-1].t - s.submit_t) * 1e3
    n = s.output_tokens
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None
    gaps = itl_gaps_ms(s)
    answer_t = s.answer_t if s.reasoning else s.chunks[0].t
    ttfo = (answer_t - s.submit_t) * 1e3 if answer_t is not None else None
    return SequenceMetrics(s.index, s.sample, s.prompt_len, s.output_len, ttft, tpot, e2e, max(gaps) if gaps else None,
                           s.cached_tokens, s.server_times, ttfo)


def by_turn(sequences: Sequence[SequenceMetrics], turns: Sequence[int]) -> tuple[TurnStats, ...]:
    """TTFT and prefix-cache share per turn; `turns[i]` is request i's turn (Workload.turns)."""
    out = []
    for turn in sorted(set(turns)):
        mine = [s for s in sequences if turns[s.index] == turn]
        told = [s for s in mine if s.cached_tokens is not None]
        share = sum(s.cached_tokens for s in told) / sum(s.prompt_len for s in told) if told else None  # type: ignore[misc]
        out.append(TurnStats(turn, len(mine), LatencyStats.of([s.ttft for s in mine if s.ttft is not None]), share))
    return tuple(out)


def itl_gaps_ms(s: SequenceTrace) -> list[float]:
    ts = [c.t for c in s.chunks]
    return [(b - a) * 1e3 for a, b in zip(ts, ts[1:])]


def itl_gap_ends(traces: Sequence[RunTrace]) -> list[tuple[int, float]]:
    """The event that ended each ITL gap of `summarize`'s pooled gaps, in the same order: per repeat, the
    first instant of the burst its chunk arrived in. In-process engines stamp every token of a step alike
    (vLLM's token clock; a transformers batch step is one forward), so a step is one instant. A client reading
    a stream stamps each line as it reads it: one step's lines, or several steps' delivered together, arrive
    microseconds apart, and counted as instants of their own they made a `vllm serve` step of 32 streams 32
    events (benchmarks/itl_steps_http.py: 992 events for 33 engine steps), so the noise of an ITL percentile
    over HTTP collapsed. Arrivals within STEP_WINDOW_S of a burst's first are that burst."""
    ends = []
    for i, t in enumerate(traces):
        stamps = [c.t for s in t.sequences if s.ok for c in s.chunks[1:]]
        burst = _bursts(stamps)
        ends += [(i, burst[x]) for x in stamps]
    return ends


STEP_WINDOW_S = 1e-3  # below an engine step's time (a decode step is milliseconds), above a client's read of a line


def _bursts(stamps: Sequence[float]) -> dict[float, float]:
    """Each instant -> the first instant of its burst: instants sorted, a burst takes what arrives within
    STEP_WINDOW_S of its first. Anchored on the first, not chained from arrival to arrival: a stream that never
    pauses for the window (steps under 1 ms, or more lines than a client reads in a step) would otherwise be one
    event for the whole run. Distinct steps within the window merge, which widens the noise, the side that raises
    no false alarm; a step's lines read over more than the window count as more than one event."""
    first: dict[float, float] = {}
    start = -math.inf
    for x in sorted(set(stamps)):
        if x - start > STEP_WINDOW_S:
            start = x
        first[x] = start
    return first


def throughput(trace: RunTrace) -> Throughput:
    ok = [s for s in trace.sequences if s.ok]
    if not ok:
        return Throughput(0.0, 0.0, 0.0)
    first = min(s.submit_t for s in trace.sequences)
    last = max(s.chunks[-1].t for s in ok)
    span = max(last - first, 1e-9)
    out_tokens = sum(s.output_tokens for s in ok)
    # a prompt is processed once however many samples it has
    prompt_tokens = sum(s.prompt_len for s in ok if s.sample == 0)
    requests = len({s.index for s in ok})
    return Throughput(out_tokens / span, (out_tokens + prompt_tokens) / span, requests / span)


def kv_stats(trace: RunTrace) -> KVStats:
    measures = trace.kv_measures
    # a server whose /metrics has no block counts (llama.cpp) still counts requests and prefix hits
    samples = [k for k in trace.kv if k.blocks_total or "usage" not in measures]
    if not measures or not samples:
        return KVStats()
    busy = [k for k in samples if k.blocks_used]
    slots = sum(k.slots for k in busy)
    first = samples[0]
    frag_max = max((k.fragmentation for k in busy), default=0.0)
    frag_mean = 1.0 - sum(k.tokens_stored for k in busy) / slots if slots else 0.0
    last = samples[-1]
    hit_rate = None
    if "prefix_hit_rate" in measures and last.prefix_queries:
        hit_rate = last.prefix_hits / last.prefix_queries
    return KVStats(
        fragmentation_max=frag_max if "fragmentation" in measures else None,
        fragmentation_mean=frag_mean if "fragmentation" in measures else None,
        usage_peak=max(k.usage for k in samples) if "usage" in measures else None,
        usage_mean=float(np.mean([k.usage for k in busy])) if "usage" in measures and busy else None,
        # block counts come with usage: scrapes that saw no request in flight read 0 blocks, not the peak
        blocks_peak=max(k.blocks_used for k in samples) if first.blocks_total and "usage" not in trace.unmeasured
        else None,
        blocks_total=first.blocks_total or None,
        block_size=first.block_size or None,
        preemptions=last.preemptions if "preemptions" in measures else None,
        prefix_hit_rate=hit_rate,
        timeline=tuple(_timeline_row(k, trace.start_t) for k in samples),
        steps=Timeline.of(samples),
    )


def _timeline_row(k: KVSample, start: float) -> tuple[float, float, float, int, int]:
    return (round(k.t - start, 6), k.usage, k.fragmentation, k.blocks_used, k.preemptions)


def peak_concurrency(sequences: Sequence[SequenceTrace]) -> int:
    """The most sequences in flight (submitted, last token not yet received) at any moment."""
    events = sorted([(s.submit_t, 1) for s in sequences if s.ok] + [(s.chunks[-1].t, -1) for s in sequences if s.ok],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def gpu_stats(trace: RunTrace, output_tokens: int) -> GpuStats:
    g = trace.gpu
    framework = trace.framework_peak_bytes / _GIB if trace.framework_peak_bytes is not None else None
    if not g:
        return GpuStats(framework_peak_gib=framework, roofline_fraction=roofline_fraction(trace))
    devices: dict[int, list[GpuSample]] = {}
    ticks: dict[float, int] = {}  # the sampler reads every device of a tick at one time
    for s in g:
        devices.setdefault(s.device, []).append(s)
        ticks[s.t] = ticks.get(s.t, 0) + s.memory_used_bytes
    peaks = {d: max(s.memory_used_bytes for s in samples) for d, samples in devices.items()}
    busiest = max(peaks, key=lambda d: peaks[d])
    idle_all = sum(samples[0].memory_used_bytes for samples in devices.values())
    concurrency = peak_concurrency(trace.sequences)
    util = [s.utilization_pct for s in g if s.utilization_pct is not None]
    first = devices[busiest][0]
    return GpuStats(
        memory_peak_gib=peaks[busiest] / _GIB,
        memory_idle_gib=first.memory_used_bytes / _GIB,
        memory_total_gib=first.memory_total_bytes / _GIB if first.memory_total_bytes else None,
        devices=len(devices),
        memory_peak_per_gpu_gib=tuple(peaks[d] / _GIB for d in sorted(devices)),
        memory_peak_all_gib=max(ticks.values()) / _GIB,
        utilization_per_gpu_pct=tuple(_mean_of([s.utilization_pct for s in devices[d]]) for d in sorted(devices)),
        memory_per_request_mib=(max(ticks.values()) - idle_all) / 1024**2 / concurrency if concurrency else None,
        timeline=tuple((round(t - trace.start_t, 6), used / _GIB) for t, used in ticks.items()),
        framework_peak_gib=framework,
        energy_per_token_j=_energy_per_token(devices.values(), output_tokens),
        utilization_mean_pct=float(np.mean(util)) if util else None,
        power_mean_w=_sum_of(_mean_of([s.power_w for s in samples]) for samples in devices.values()),
        roofline_fraction=roofline_fraction(trace),
    )


def _energy_per_token(devices: Iterable[Sequence[GpuSample]], output_tokens: int) -> float | None:
    """Joules per output token over all the engine's GPUs: each card's counter at the two ends."""
    spent = [s[-1].energy_mj - s[0].energy_mj for s in devices if s[0].energy_mj is not None and s[-1].energy_mj is not None]
    return sum(spent) / 1e3 / output_tokens if spent and output_tokens else None


def _mean_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _sum_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(sum(present)) if present else None


def roofline_fraction(trace: RunTrace) -> float | None:
    """Sum over busy steps of (weights + KV bytes held) / bandwidth, over the time those steps took
    (from each step's sample to the next, the last one to the end of the run)."""
    roof, kv = trace.roofline, trace.kv
    if roof is None or not kv or roof.bandwidth_bytes_per_s <= 0:
        return None
    floor = took = 0.0
    ends = [k.t for k in kv[1:]] + [trace.end_t]
    for k, end in zip(kv, ends):
        if k.running == 0 or end <= k.t:
            continue
        # tensor parallel: each card reads its share of the weights and the KV cache at the same time
        floor += ((roof.weight_bytes + roof.kv_bytes_per_token * k.tokens_stored)
                  / roof.bandwidth_bytes_per_s / roof.tensor_parallel)
        took += end - k.t
    return floor / took if took > 0 else None


def with_timing_noise(result: PerfResult, noise: float) -> PerfResult:
    """`result` with every timing metric's noise raised to at least `noise` (a relative half-width, as
    `latency_noise`): a whole pass is as uncertain as the engine's pass-to-pass variation. Paging and
    memory are not timing and keep theirs."""
    if noise <= 0:
        return result
    flat = result.per_repeat[0] if result.per_repeat else {}
    timing = [k for k in flat if k.endswith("_ms") or k in THROUGHPUT_METRICS]
    return replace(result, noise={**result.noise, **{k: round(max(result.noise.get(k, 0.0), noise), 6) for k in timing}})


# -- over repeats --------------------------------------------------------------------------------
def summarize(traces: Sequence[RunTrace], workload_hash: str, n_requests: int, label: str = "",
              partial: bool = False, turns: Sequence[int] = ()) -> PerfResult:
    """Pool the sequences of every repeat for percentiles; take the median throughput of the
    repeats; take the worst (max) KV and memory figures over the repeats. `turns` (each request's turn
    in its session) adds `by_turn`."""
    if not traces:
        raise ValueError("summarize needs at least one run trace")
    gaps_of = [[g for s in t.sequences if s.ok for g in itl_gaps_ms(s)] for t in traces]
    per_trace = [_one(t, g, workload_hash, n_requests) for t, g in zip(traces, gaps_of)]
    events = {"itl": itl_gap_ends(traces)}
    if len(per_trace) == 1:
        only = per_trace[0]
        latencies = _latencies(only.sequences, gaps_of[0])
        return replace(only, label=label, partial=partial, noise=stats.latency_noise(latencies, PERCENTILES, events),
                       samples=stats.independent_samples(latencies, events),
                       by_turn=by_turn(only.sequences, turns) if turns else (), server=ServerLatency.of(only.sequences))
    seqs = tuple(s for r in per_trace for s in r.sequences)
    gaps = [g for trace_gaps in gaps_of for g in trace_gaps]
    thr = [r.throughput for r in per_trace]
    latencies = _latencies(seqs, gaps)
    return PerfResult(
        engine=traces[0].engine,
        workload_hash=workload_hash,
        repeats=len(traces),
        n_requests=n_requests,
        n_sequences=sum(r.n_sequences for r in per_trace),
        failed=sum(r.failed for r in per_trace),
        ttft=LatencyStats.of(latencies["ttft"]),
        tpot=LatencyStats.of(latencies["tpot"]),
        itl=LatencyStats.of(gaps),
        e2e=LatencyStats.of(latencies["e2e"]),
        noise=stats.latency_noise(latencies, PERCENTILES, events),
        samples=stats.independent_samples(latencies, events),
        throughput=Throughput(
            float(np.median([t.output_tokens_per_s for t in thr])),
            float(np.median([t.total_tokens_per_s for t in thr])),
            float(np.median([t.requests_per_s for t in thr])),
        ),
        kv=_worst_kv([r.kv for r in per_trace]),
        gpu=_worst_gpu([r.gpu for r in per_trace]),
        sequences=seqs,
        per_repeat=tuple(r.per_repeat[0] for r in per_trace),
        errors=tuple(e for r in per_trace for e in r.errors),
        duration_s=sum(r.duration_s for r in per_trace),
        label=label,
        partial=partial,
        by_turn=by_turn(seqs, turns) if turns else (),
        server=ServerLatency.of(seqs),
        unmeasured={k: v for r in per_trace for k, v in r.unmeasured.items()},
        resent=sum(r.resent for r in per_trace),
        ttfo=LatencyStats.of(latencies["ttfo"]),
        reasoned=sum(r.reasoned for r in per_trace),
    )


def _one(trace: RunTrace, gaps: list[float], workload_hash: str, n_requests: int) -> PerfResult:
    """One repeat's figures (`gaps`: its ITL gaps, which `summarize` pools too); its percentile noise is
    left to `summarize`, which bootstraps the pooled values once (a bootstrap per repeat would be
    thrown away)."""
    seqs = tuple(sequence_metrics(s) for s in trace.sequences)
    ok = [s for s in trace.sequences if s.ok]
    out_tokens = sum(s.output_tokens for s in ok)
    latencies = _latencies(seqs, gaps)
    result = PerfResult(
        engine=trace.engine,
        workload_hash=workload_hash,
        repeats=1,
        n_requests=n_requests,
        n_sequences=len(trace.sequences),
        failed=len(trace.sequences) - len(ok),
        ttft=LatencyStats.of(latencies["ttft"]),
        tpot=LatencyStats.of(latencies["tpot"]),
        itl=LatencyStats.of(gaps),
        e2e=LatencyStats.of(latencies["e2e"]),
        throughput=throughput(trace),
        kv=kv_stats(trace),
        gpu=gpu_stats(trace, out_tokens),
        sequences=seqs,
        per_repeat=(),
        errors=tuple(f"request {s.index}.{s.sample}: {s.error}" for s in trace.sequences if s.error),
        duration_s=trace.end_t - trace.start_t,
        resent=int(trace.extra.get("requests_sent_again", 0)),
        ttfo=LatencyStats.of(latencies["ttfo"]),
        reasoned=sum(s.reasoning for s in trace.sequences),
    )
    result = replace(result, unmeasured=unmeasured_metrics(trace.unmeasured, flat_metrics(result)))
    return replace(result, per_repeat=(flat_metrics(result),))


# flat metrics a KV measure feeds besides its own `kv_<measure>*` names
FEEDS = {"usage": ("kv_blocks_peak",)}


def unmeasured_metrics(measures: Mapping[str, str], flat: Mapping[str, Any]) -> dict[str, str]:
    """A KV measure's reason for each flat metric it feeds (usage: kv_usage_peak, kv_usage_mean and
    kv_blocks_peak)."""
    return {name: why for measure, why in measures.items() for name in flat
            if name == f"kv_{measure}" or name.startswith(f"kv_{measure}_") or name in FEEDS.get(measure, ())}


def _latencies(seqs: Sequence[SequenceMetrics], gaps: list[float]) -> dict[str, list[float]]:
    return {"ttft": [s.ttft for s in seqs if s.ttft is not None], "tpot": [s.tpot for s in seqs if s.tpot is not None],
            "itl": gaps, "e2e": [s.e2e for s in seqs if s.e2e is not None], "ttfo": [s.ttfo for s in seqs if s.ttfo is not None]}


def _max_or_none(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _mean_or_none(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _worst_kv(kvs: Sequence[KVStats]) -> KVStats:
    first = kvs[0]
    return KVStats(
        fragmentation_max=_max_or_none([k.fragmentation_max for k in kvs]),
        fragmentation_mean=_mean_or_none([k.fragmentation_mean for k in kvs]),
        usage_peak=_max_or_none([k.usage_peak for k in kvs]),
        usage_mean=_mean_or_none([k.usage_mean for k in kvs]),
        blocks_peak=_max_or_none([k.blocks_peak for k in kvs]),
        blocks_total=first.blocks_total,
        block_size=first.block_size,
        preemptions=_max_or_none([k.preemptions for k in kvs]),
        prefix_hit_rate=_min_or_none([k.prefix_hit_rate for k in kvs]),
        timeline=first.timeline,
        steps=first.steps,
    )


def _min_or_none(values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _worst_gpu(gpus: Sequence[GpuStats]) -> GpuStats:
    return GpuStats(
        memory_peak_gib=_max_or_none([g.memory_peak_gib for g in gpus]),
        memory_idle_gib=_mean_or_none([g.memory_idle_gib for g in gpus]),
        memory_total_gib=gpus[0].memory_total_gib,
        devices=gpus[0].devices,
        memory_peak_per_gpu_gib=tuple(max(v) for v in zip(*(g.memory_peak_per_gpu_gib for g in gpus))),
        memory_peak_all_gib=_max_or_none([g.memory_peak_all_gib for g in gpus]),
        utilization_per_gpu_pct=gpus[0].utilization_per_gpu_pct,
        memory_per_request_mib=_max_or_none([g.memory_per_request_mib for g in gpus]),
        timeline=gpus[0].timeline,
        framework_peak_gib=_max_or_none([g.framework_peak_gib for g in gpus]),
        energy_per_token_j=_mean_or_none([g.energy_per_token_j for g in gpus]),
        utilization_mean_pct=_mean_or_none([g.utilization_mean_pct for g in gpus]),
        power_mean_w=_mean_or_none([g.power_mean_w for g in gpus]),
        roofline_fraction=_min_or_none([g.roofline_fraction for g in gpus]),
    )
