"""The marker catalogue: one plain function per marker, with the signature users write.

Each function validates its arguments and returns the `Limit`s it sets; `check` evaluates limits
against the results a test recorded. The `pytest --markers` text is generated from these signatures
and docstrings, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import quantiles
from .formatting import apart, closest, number
from .metrics import PerfResult, SequenceMetrics, throughput_per_gib
from .sweep import LATENCY_METRIC_NAMES, Sweep, unknown_latency_metrics


class MarkerError(Exception):
    """A marker was given arguments it cannot use, or asks for a metric nobody measured."""


@dataclass(frozen=True)
class Limit:
    marker: str  # how the user wrote it, e.g. "max_p99_ms(ttft=250)"
    metric: str  # flat metric name, e.g. "p99_ttft_ms"
    bound: float
    upper: bool  # True: the measured value must be <= bound
    unit: str = ""
    sequence_metric: str | None = None  # per-request metric to list the worst requests by
    under: tuple[tuple[str, float], ...] = ()  # capacity limits: the latency limits capacity is judged by

    @property
    def on_sweeps(self) -> bool:
        return self.metric.startswith("capacity_")

    def on_curve(self, sweeps: Sequence[Any]) -> bool:
        """Judged on the recorded sweeps rather than result by result: a capacity always, the throughput
        per GiB whenever the test recorded a sweep (its best point counts)."""
        return self.on_sweeps or (bool(sweeps) and self.metric == "output_tokens_per_s_per_gib")

    def holds(self, value: float) -> bool:
        return value <= self.bound if self.upper else value >= self.bound


@dataclass(frozen=True)
class Violation:
    limit: Limit
    measured: float
    result: PerfResult = field(repr=False)
    worst: tuple[SequenceMetrics, ...] = ()
    context: str = ""  # replaces the "measured on" line (curves)


# -- argument checks -------------------------------------------------------------------------------
def _number(value: Any, what: str, *, fraction: bool = False, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MarkerError(f"{what}={value!r} is not a number")
    if not math.isfinite(value) or value < 0:
        raise MarkerError(f"{what}={value!r} must be a finite number >= 0")
    if fraction and value > 1:
        raise MarkerError(f"{what}={value!r} is a fraction and must be within [0, 1]")
    if integer and value != int(value):
        raise MarkerError(f"{what}={value!r} must be a whole number")
    return float(value)


def _floor(value: Any, what: str, *, fraction: bool = False) -> float:
    """A lower limit: one of 0 always holds, so it is refused (a limit that cannot fail guards nothing)."""
    bound = _number(value, what, fraction=fraction)
    if bound == 0:
        raise MarkerError(f"{what}={value!r} must be above 0: a floor of 0 always holds; give a floor or drop the marker")
    return bound


def _share_ceiling(value: Any, what: str) -> float:
    """An upper limit on a share (0-1): one of 1 always holds, so it is refused."""
    bound = _number(value, what, fraction=True)
    if bound == 1:
        raise MarkerError(f"{what}={value!r} must be below 1: a share never exceeds 1, so this limit always holds; "
                          "give a share (0.05 is 5%) or drop the marker")
    return bound


def _need_one(kwargs: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    given = {k: v for k, v in kwargs.items() if v is not None}
    if not given:
        raise MarkerError(f"give at least one of {', '.join(n + '=' for n in names)}")
    return given


def _written(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


# -- the catalogue ---------------------------------------------------------------------------------
_LATENCY_UNITS = {"ttft": "ms", "tpot": "ms", "itl": "ms", "e2e": "ms", "ttfo": "ms"}


def _percentile_marker(p: int) -> Callable[..., list[Limit]]:
    def marker(*, ttft: float | None = None, tpot: float | None = None, itl: float | None = None,
               e2e: float | None = None, ttfo: float | None = None) -> list[Limit]:
        given = _need_one({"ttft": ttft, "tpot": tpot, "itl": itl, "e2e": e2e, "ttfo": ttfo}, list(_LATENCY_UNITS))
        name = f"max_p{p}_ms"
        return [
            Limit(_written(name, (), {k: v}), f"p{p}_{k}_ms", _number(v, k), True, "ms", k)
            for k, v in given.items()
        ]

    marker.__name__ = f"max_p{p}_ms"
    marker.__doc__ = (f"fail when the p{p} of a latency is above its limit in ms "
                      f"(TTFT, TPOT, E2E and TTFO, time to a reasoning model's answer, over requests; ITL over "
                      "streamed chunks).")
    return marker


max_p50_ms = _percentile_marker(50)
max_p90_ms = _percentile_marker(90)
max_p95_ms = _percentile_marker(95)
max_p99_ms = _percentile_marker(99)


def min_throughput(*, output_tokens_per_s: float | None = None, total_tokens_per_s: float | None = None,
                   requests_per_s: float | None = None) -> list[Limit]:
    """fail when throughput (median over repeats) is below any given floor."""
    given = _need_one(locals(), ["output_tokens_per_s", "total_tokens_per_s", "requests_per_s"])
    return [Limit(_written("min_throughput", (), {k: v}), k, _floor(v, k), False, k.split("_per_")[0] + "/s")
            for k, v in given.items()]


def max_kv_fragmentation(limit: float, stat: str = "max") -> list[Limit]:
    """fail when KV-cache internal fragmentation (1 - tokens stored / slots allocated) is above limit;
    stat="max" is the worst step, stat="mean" the slot-weighted mean over steps."""
    if stat not in ("max", "mean"):
        raise MarkerError(f"stat={stat!r} must be 'max' or 'mean'")
    return [Limit(_written("max_kv_fragmentation", (limit,), {"stat": stat} if stat != "max" else {}),
                  f"kv_fragmentation_{stat}", _share_ceiling(limit, "limit"), True)]


def max_kv_usage(limit: float) -> list[Limit]:
    """fail when the peak share of KV blocks in use (0-1) is above limit."""
    return [Limit(_written("max_kv_usage", (limit,), {}), "kv_usage_peak", _share_ceiling(limit, "limit"), True)]


def max_preemptions(n: int) -> list[Limit]:
    """fail when the engine preempted more than n requests (recomputation or swap under KV pressure)."""
    return [Limit(_written("max_preemptions", (n,), {}), "kv_preemptions", _number(n, "n", integer=True), True)]


def min_prefix_cache_hit_rate(rate: float) -> list[Limit]:
    """fail when the prefix-cache hit rate (hit tokens / queried tokens) is below rate."""
    return [Limit(_written("min_prefix_cache_hit_rate", (rate,), {}), "kv_prefix_hit_rate",
                  _floor(rate, "rate", fraction=True), False)]


def max_gpu_memory(*, gib: float | None = None, fraction: float | None = None) -> list[Limit]:
    """fail when the device memory peak (NVML, all processes) is above gib GiB, or above fraction of the card;
    per GPU for an engine on several (its busiest card: the one that runs out of memory)."""
    given = _need_one({"gib": gib, "fraction": fraction}, ["gib", "fraction"])
    limits = []
    if "gib" in given:
        limits.append(Limit(_written("max_gpu_memory", (), {"gib": gib}), "gpu_memory_peak_gib", _number(gib, "gib"),
                            True, "GiB"))
    if "fraction" in given:
        limits.append(Limit(_written("max_gpu_memory", (), {"fraction": fraction}), "gpu_memory_peak_fraction",
                            _share_ceiling(fraction, "fraction"), True))
    return limits


def max_memory_per_request(*, mib: float) -> list[Limit]:
    """fail when device memory per concurrent request, (peak - idle) / peak concurrency, is above mib MiB;
    over all the engine's GPUs for an engine on several."""
    return [Limit(_written("max_memory_per_request", (), {"mib": mib}), "gpu_memory_per_request_mib",
                  _number(mib, "mib"), True, "MiB")]


def max_energy_per_token(*, joules: float) -> list[Limit]:
    """fail when the GPU energy per output token (NVML total-energy counter, summed over the engine's
    GPUs) is above joules J."""
    return [Limit(_written("max_energy_per_token", (), {"joules": joules}), "gpu_energy_per_token_j",
                  _number(joules, "joules"), True, "J")]


def min_capacity(*, concurrency: float | None = None, rate: float | None = None,
                 under: Mapping[str, float] | None = None) -> list[Limit]:
    """fail when the largest concurrency (or request rate) of a recorded sweep whose latency limits
    still hold is below the bound; under={"p99_ttft_ms": 500} (default: the sweep's own under=)."""
    given = _need_one({"concurrency": concurrency, "rate": rate}, ["concurrency", "rate"])
    zero = [k for k, v in given.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0]
    if zero:
        raise MarkerError(f"{zero[0]}={given[zero[0]]!r} must be above 0: a capacity of at least 0 always holds")
    limits_under: tuple[tuple[str, float], ...] = ()
    if under is not None:
        if not isinstance(under, Mapping) or not under:
            raise MarkerError(f"under={under!r} must be a mapping of latency metrics to limits, e.g. {{'p99_ttft_ms': 500}}")
        problem = unknown_latency_metrics(under)
        if problem:
            raise MarkerError(problem)
        limits_under = tuple((str(k), _number(v, f"under[{k!r}]")) for k, v in under.items())
    return [Limit(_written("min_capacity", (), {k: v, **({"under": dict(under)} if under else {})}), f"capacity_{k}",
                  _number(v, k), False, "req/s" if k == "rate" else "", under=limits_under) for k, v in given.items()]


def min_throughput_per_gib(*, tokens_per_s: float) -> list[Limit]:
    """fail when output tokens/s per GiB of GPU memory (NVML peak) is below the floor; for a sweep,
    its best point counts."""
    return [Limit(_written("min_throughput_per_gib", (), {"tokens_per_s": tokens_per_s}),
                  "output_tokens_per_s_per_gib", _floor(tokens_per_s, "tokens_per_s"), False, "tok/s/GiB")]


def max_error_rate(rate: float) -> list[Limit]:
    """fail when more than this share of requests failed (default without the marker: 0)."""
    return [Limit(_written("max_error_rate", (rate,), {}), "error_rate", _number(rate, "rate", fraction=True), True)]


MARKERS: dict[str, Callable[..., list[Limit]]] = {
    f.__name__: f
    for f in (max_p50_ms, max_p90_ms, max_p95_ms, max_p99_ms, min_throughput, max_kv_fragmentation,
              max_kv_usage, max_preemptions, min_prefix_cache_hit_rate, max_gpu_memory, max_memory_per_request,
              max_energy_per_token, max_error_rate, min_capacity, min_throughput_per_gib)
}


# markers whose limit reads time or the card's power: an engine idle beside the one measured could move them, so
# their tests' engines never start side by side (selection.side_by_side_groups)
TIMING_MARKERS = frozenset({"max_p50_ms", "max_p90_ms", "max_p95_ms", "max_p99_ms", "min_throughput", "min_capacity",
                            "min_throughput_per_gib", "max_energy_per_token"})


def marker_help(name: str) -> str:
    """The `pytest --markers` line, built from the function itself."""
    fn = MARKERS[name]
    params = ", ".join(str(p) for p in inspect.signature(fn).parameters.values()).replace("'", "")
    return f"{name}({params}): llmperf: {inspect.getdoc(fn)}"


def _did_you_mean(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> str:
    """`; did you mean ttft=250?` for each keyword the marker does not take that is close to one it does."""
    return "".join(f"; did you mean {match}={kwargs[k]!r}?" for k, match in closest(kwargs, inspect.signature(fn).parameters))


# -- evaluation ------------------------------------------------------------------------------------
def parse(name: str, args: Sequence[Any], kwargs: Mapping[str, Any], hardware: str | None,
          classes: Collection[str] = ()) -> list[Limit]:
    """Validate one marker as written on a test; errors say which marker and what is wrong. `classes`:
    the hardware classes a per-hardware limit may name (none given: any)."""
    fn = MARKERS[name]
    try:
        args = [_for_hardware(a, hardware, classes) for a in args]
        kwargs = {k: _for_hardware(v, hardware, classes) if k != "under" else _under_for_hardware(v, hardware, classes)
                  for k, v in kwargs.items()}
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise MarkerError(f"@pytest.mark.{_written(name, args, kwargs)}: {e}{_did_you_mean(fn, kwargs)}; "
                          f"usage: {marker_help(name)}") from None
    except MarkerError as e:
        raise MarkerError(f"@pytest.mark.{_written(name, args, kwargs)}: {e}") from None
    try:
        return fn(*args, **kwargs)
    except MarkerError as e:
        raise MarkerError(f"@pytest.mark.{_written(name, args, kwargs)}: {e}") from None


def _for_hardware(value: Any, hardware: str | None, classes: Collection[str]) -> Any:
    """A limit may be a mapping from hardware class to value, with an optional "default". A class no one
    declared is refused: a mistyped key would otherwise hand that hardware the default in silence."""
    if not isinstance(value, Mapping):
        return value
    unknown = [k for k in value if k != "default" and k != hardware and classes and k not in classes]
    if unknown:
        raise MarkerError(f"the limit {dict(value)!r} names hardware class {unknown[0]!r}, which is none of the "
                          f"classes known here ({', '.join(sorted(classes))}): correct it, or declare a class of your "
                          "own in the llmperf_hardware_classes ini value")
    if hardware in value:
        return value[hardware]
    if "default" in value:
        return value["default"]
    raise MarkerError(f"the limit {dict(value)!r} has no value for hardware class {hardware!r} and no 'default' key")


def _under_for_hardware(under: Any, hardware: str | None, classes: Collection[str]) -> Any:
    """`under` is itself a mapping (metric -> limit): each of its limits may be per hardware, or the whole
    mapping may be ({"h200": {"p99_ttft_ms": 250}, "default": {...}}): whole when it names no latency metric
    and maps each key to a mapping, so a mistyped class is named as one."""
    if (isinstance(under, Mapping) and under and all(isinstance(v, Mapping) for v in under.values())
            and not any(k in LATENCY_METRIC_NAMES for k in under)):
        under = _for_hardware(under, hardware, classes)
    if not isinstance(under, Mapping):
        return under
    return {k: _for_hardware(v, hardware, classes) for k, v in under.items()}


DEFAULT_ERROR_LIMIT = Limit("max_error_rate(0) [default]", "error_rate", 0.0, True)


def with_default_error_limit(limits: Sequence[Limit]) -> list[Limit]:
    """Any failed request fails a test unless it says otherwise with max_error_rate."""
    if any(lim.metric == "error_rate" for lim in limits):
        return list(limits)
    return [*limits, DEFAULT_ERROR_LIMIT]


def check(limits: Iterable[Limit], results: Sequence[PerfResult]) -> list[Violation]:
    """Every violated limit of every result; MarkerError when a limit's metric was not measured."""
    violations = []
    for result in results:
        values = result.flat()
        for limit in limits:
            measured = values.get(limit.metric)
            # a repeat that missed it (a metrics scrape that failed) may be the busiest: the others cannot stand for it
            if measured is None or limit.metric in result.unmeasured:
                raise MarkerError(_unmeasured(limit, result))
            if not limit.holds(measured) and _confirmed(limit, result):
                worst = tuple(result.worst(limit.sequence_metric)) if limit.sequence_metric else ()
                violations.append(Violation(limit, float(measured), result, worst))
    return violations


def _unmeasured(limit: Limit, result: PerfResult) -> str:
    """Why a limit cannot be checked: the engine's own reason for this run where it gave one."""
    head = (f"@pytest.mark.{limit.marker} cannot be checked: engine {result.engine!r} did not measure "
            f"{limit.metric} in {'every repeat of ' if result.repeats > 1 else ''}this run")
    why = result.unmeasured.get(limit.metric)
    if why:
        return f"{head}: {why}"
    return (f"{head} (e.g. no GPU, or a metric the engine cannot observe). "
            "Remove the marker for this engine or run where the metric exists.")


def _per_request(result: PerfResult, name: str) -> list[float] | None:
    """A latency metric's per-request values (ITL gaps are not kept per request: None)."""
    if name == "itl":
        return None
    return [v for s in result.sequences if (v := getattr(s, name)) is not None]


def _undersampled(limit: Limit, result: PerfResult) -> tuple[float, str, int] | None:
    """(q, latency name, samples) of an upper percentile limit measured on fewer samples than that
    percentile needs; None for any other limit."""
    parsed = quantiles.percentile_of(limit.metric)
    if parsed is None or not limit.upper:
        return None
    q, name = parsed
    n = result.samples.get(name)
    return None if n is None or n >= quantiles.needed(q) else (q, name, n)


def _confirmed(limit: Limit, result: PerfResult) -> bool:
    """Whether a violated percentile limit is violated beyond chance: on fewer samples than the
    percentile needs, only when even the lower end of its 95% interval is over the limit (a p99 of
    16 requests is their largest: one slow request would fail it). Samples too few for any lower end
    (a median of 5 or fewer) must all be over it: the least of them is the lowest end they can give, and
    a limit that no sample could fail would guard nothing."""
    few = _undersampled(limit, result)
    values = _per_request(result, few[1]) if few else None
    if values is None:
        return True
    lo, _ = quantiles.interval(values, few[0])
    lo = lo if lo is not None else min(values, default=None)
    return lo is not None and lo > limit.bound


def sample_notes(limits: Iterable[Limit], results: Sequence[PerfResult]) -> list[str]:
    """What the percentile limits could not settle for lack of samples: a violation not gated, or a
    pass that does not prove the limit holds. Shown with the test's report, never a silent pass."""
    notes = []
    for result in results:
        values = result.flat()
        for limit in limits:
            few, measured = _undersampled(limit, result), values.get(limit.metric)
            if few is None or measured is None:
                continue
            label = f" [{result.label}]" if result.label else ""
            why = quantiles.not_gated(limit.metric, few[2])
            if not limit.holds(measured) and not _confirmed(limit, result):
                values_of = _per_request(result, few[1]) or []
                lower = ("the lower end of its 95% interval is within the limit"
                         if quantiles.interval(values_of, few[0])[0] is not None else
                         f"{few[2]} samples give no lower end of a 95% interval: it fails only when every sample is "
                         "over the limit")
                notes.append(f"{limit.metric} = {number(measured)} ms > limit {number(limit.bound)} ms (from "
                             f"@pytest.mark.{limit.marker}){label}: {why}, and {lower}; measure more requests to gate it")
            elif limit.holds(measured):
                notes.append(f"{limit.metric} = {number(measured)} ms <= limit {number(limit.bound)} ms (from "
                             f"@pytest.mark.{limit.marker}){label} holds in this sample, but proves little: {why}")
    return notes


def could_be_noise(violations: Sequence[Violation], offline: bool) -> bool:
    """Whether measuring again could clear these violations of one result: not when a request failed (a
    failure is never noise: a pass without one would hide it), nor when every one is a paging metric of an
    offline workload, which the same engine repeats exactly."""
    if any(v.limit.metric == "error_rate" for v in violations):
        return False
    return not (offline and all(v.limit.metric.startswith("kv_") for v in violations))


def check_sweeps(limits: Iterable[Limit], sweeps: Sequence[Sweep]) -> list[Violation]:
    """Curve limits against the recorded sweeps; MarkerError when no sweep of the right kind exists."""
    return [Violation(limit, value, sweep.points[-1].result, context=context)
            for limit in limits for sweep, value, context in sweep_values(limit, sweeps) if not limit.holds(value)]


def sweep_values(limit: Limit, sweeps: Sequence[Sweep]) -> list[tuple[Sweep, float, str]]:
    """What a curve limit judges in each sweep it applies to (a capacity, or the best throughput per GiB),
    with the words that say where it came from; MarkerError when it cannot be judged."""
    if limit.metric == "output_tokens_per_s_per_gib":
        out = []
        for sweep in sweeps:
            best = max((v for p in sweep.points if (v := throughput_per_gib(p.result)) is not None), default=None)
            if best is None:
                raise MarkerError(f"@pytest.mark.{limit.marker} cannot be checked: no GPU memory was measured")
            out.append((sweep, best, f"best point of sweep {sweep.label!r}"))
        return out
    kind = limit.metric.removeprefix("capacity_")
    matching = [s for s in sweeps if s.kind == kind]
    if not matching:
        raise MarkerError(f"@pytest.mark.{limit.marker} needs a {kind} sweep: call llmperf.sweep(engine, factory, "
                          f"{'concurrency' if kind == 'concurrency' else 'rates'}=[...]) or llmperf.find_capacity(...)")
    out = []
    for sweep in matching:
        under = dict(limit.under) or dict(sweep.under)
        if not under:
            raise MarkerError(f"@pytest.mark.{limit.marker}: give under={{'p99_ttft_ms': ...}} here or in the sweep")
        cap = sweep.capacity(under)
        shown = ", ".join(f"{k} <= {number(v)}" for k, v in under.items())
        context = (f"sweep {sweep.label!r} over {kind} {', '.join(number(v) for v in sweep.values)}; "
                   f"capacity = the largest {kind} with {shown} and no failed request")
        out.append((sweep, cap if cap is not None else 0.0, context))
    return out


def margins(limits: Sequence[Limit], results: Sequence[PerfResult], sweeps: Sequence[Sweep] = ()) -> list[dict[str, Any]]:
    """Each point limit against each result's first pass, and each curve limit against each sweep it
    judges, as the summary table shows them: the measured value, the bound, and the share of the bound
    left to spare (negative: violated). A metric the result did not measure is left out."""
    measured: list[tuple[str, Limit, float]] = []
    for i, result in enumerate(results):
        values = result.flat()
        measured += [(result.label or str(i), limit, float(values[limit.metric])) for limit in limits
                     if not limit.on_curve(sweeps) and values.get(limit.metric) is not None]
    for limit in (lim for lim in limits if lim.on_curve(sweeps)):
        try:
            measured += [(sweep.label, limit, float(value)) for sweep, value, _ in sweep_values(limit, sweeps)]
        except MarkerError:  # not judgeable: the test's failure says why
            continue
    return [{"result": label, "marker": limit.marker, "metric": limit.metric, "bound": limit.bound,
             "upper": limit.upper, "unit": limit.unit, "measured": value,
             "margin": ((limit.bound - value if limit.upper else value - limit.bound) / limit.bound
                        if limit.bound else None)} for label, limit, value in measured]


def format_margin(row: Mapping[str, Any]) -> str:
    """`p99_ttft_ms 26.3 ms <= 5000 ms (99% to spare)`, or `kv_preemptions 26 > 0 (over the limit)`: the
    comparison as it came out, so that a violated limit never reads as a true statement."""
    unit = f" {row['unit']}" if row["unit"] else ""
    upper, measured, bound = row["upper"], row["measured"], row["bound"]
    within = measured <= bound if upper else measured >= bound
    op = ("<=" if within else ">") if upper else (">=" if within else "<")
    missed = "over" if upper else "short"
    if row["margin"] is None:  # a bound of 0: no share of it to give
        note = "" if within else (" (over the limit)" if upper else " (short of the limit)")
    else:
        share = abs(row["margin"])
        # never "over by 0%" for a limit missed
        shown = f"{share:.0%}" if share >= 0.1 else f"{share:.1%}" if share >= 0.0005 else "less than 0.1%"
        note = (" (at the limit)" if share == 0 else f" ({shown} to spare)" if row["margin"] >= 0
                else f" ({missed} by {shown})")
    value, limit = apart(measured, bound)  # a miss by a hair never prints as `3000 < 3000`
    return f"{row['metric']} {value}{unit} {op} {limit}{unit}{note}"


def format_violations(violations: Sequence[Violation]) -> str:
    lines = [f"llmperf: {len(violations)} performance limit{'s' if len(violations) != 1 else ''} violated"]
    for v in violations:
        lim, r = v.limit, v.result
        op = ">" if lim.upper else "<"
        unit = f" {lim.unit}" if lim.unit else ""
        label = f" [{r.label}]" if r.label and not v.context else ""
        value, bound = apart(v.measured, lim.bound)
        lines.append(f"  {lim.metric} = {value}{unit} {op} limit {bound}{unit}"
                     f"  (from @pytest.mark.{lim.marker}){label}")
        if v.context:
            lines.append(f"    {v.context}")
        else:
            lines.append(f"    measured on {r.n_requests} requests ({r.n_sequences // max(r.repeats, 1)} sequences) "
                         f"x {r.repeats} repeat{'s' if r.repeats != 1 else ''}, engine {r.engine}, "
                         f"workload {r.workload_hash}")
        if v.worst:
            rows = "; ".join(
                f"#{s.index}{'.' + str(s.sample) if s.sample else ''} (prompt {s.prompt_len}, output {s.output_len})"
                f" {number(getattr(s, lim.sequence_metric))} ms"
                for s in v.worst
            )
            lines.append(f"    worst requests: {rows}")
    return "\n".join(lines)

