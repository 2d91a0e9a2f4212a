"""Hypothesis strategies for workloads (the public names live in `pytest_llmperf.strategies`).

Every strategy shrinks toward fewer requests, shorter prompts and outputs, and simpler arrivals
(offline first), so a failing workload shrinks to the smallest one that still fails. Lengths are
biased toward the edges that matter for paging: 1, multiples of the block size and one either side,
and the engine's max model length.

The engine's limits are asked of the engine: the engine fixtures publish `max_model_len` and the
block size for the duration of a test (`engine_limits`), and strategies drawn inside that test use
them; give `max_total_len=` to override.

`arrivals="poisson"` draws open-loop timed arrivals (gaps up to 4/qps, shrinking toward
simultaneous arrivals) rather than a seeded Poisson stream: gaps that shrink one by one give a
readable minimal example, a seed does not.
"""

from __future__ import annotations

import math
import numbers

from hypothesis import strategies as st

from .engine_limits import current as current_limits
from .workload import Request, Workload, whole_number

ARRIVALS = ("offline", "poisson", "closed_loop")


def edges(lo: int, hi: int, block_sizes: tuple[int, ...], max_len: int | None = None) -> list[int]:
    """Lengths where paging changes behaviour: 1, block multiples and one either side, the limit."""
    points = {1, lo, hi}
    for bs in block_sizes:
        k = bs
        while k - 1 <= hi and len(points) < 64:
            points.update((k - 1, k, k + 1))
            k *= 2
    if max_len is not None:
        points.update((max_len - 1, max_len))
    return sorted(p for p in points if lo <= p <= hi)


def lengths(lo: int = 1, hi: int = 1024, *, block_sizes: tuple[int, ...] | None = None) -> st.SearchStrategy[int]:
    """Integers in [lo, hi], shrinking toward `lo`, with extra weight on the paging edges of the engine
    in use (its block size and max model length, read when the example is drawn)."""
    if not 1 <= lo <= hi:
        raise ValueError(f"lengths({lo}, {hi}) needs 1 <= lo <= hi")
    if block_sizes is not None and any(bs < 1 for bs in block_sizes):  # a block of 0 tokens never doubles: no end
        raise ValueError(f"lengths(block_sizes={block_sizes!r}) needs block sizes of 1 token or more")
    # integers first: a failing example found on an edge still shrinks through the plain range
    return st.integers(lo, hi) | _edge(lo, hi, block_sizes)


@st.composite
def _edge(draw: st.DrawFn, lo: int, hi: int, block_sizes: tuple[int, ...] | None) -> int:
    limits = current_limits()
    return draw(st.sampled_from(edges(lo, hi, block_sizes or limits.block_sizes, limits.max_model_len)))


@st.composite
def requests(draw: st.DrawFn, prompt_len: st.SearchStrategy[int] | None = None,
             output_len: st.SearchStrategy[int] | None = None, max_total_len: int | None = None,
             n: st.SearchStrategy[int] | None = None) -> Request:
    """One request whose prompt + output fits the engine's max model length."""
    limits = current_limits(max_total_len)
    cap = limits.max_model_len
    if cap < 2:  # a prompt and an output of one token each
        raise ValueError(f"requests fit within {cap} tokens (max_total_len, or the engine's max model length less a "
                         "shared prefix): a request needs 2 or more; give a larger max_total_len or a shorter prefix")
    prompt = draw(prompt_len if prompt_len is not None else lengths(1, min(512, cap - 1)))
    prompt = min(prompt, cap - 1)
    output = draw(output_len if output_len is not None else lengths(1, min(256, cap - prompt)))
    output = max(1, min(output, cap - prompt))
    samples = draw(n) if n is not None else 1
    return Request(prompt_len=prompt, output_len=output, n=samples)


@st.composite
def workloads(draw: st.DrawFn, min_requests: int = 1, max_requests: int = 32,
              prompt_len: st.SearchStrategy[int] | None = None, output_len: st.SearchStrategy[int] | None = None,
              arrivals: str | tuple[str, ...] = "offline", shared_prefix: bool | st.SearchStrategy[int] = False,
              max_qps: float = 64.0, max_concurrency: int = 64, max_total_len: int | None = None,
              seed: int = 0) -> Workload:
    """Workloads of `min_requests`..`max_requests` requests.

    `arrivals` is one kind or a tuple of kinds ("offline", "poisson", "closed_loop"), tried and shrunk
    in that order. `shared_prefix=True` (or a strategy of prefix lengths) gives every request a common
    system prompt of that many tokens.
    """
    if not 1 <= min_requests <= max_requests:
        raise ValueError(f"workloads needs 1 <= min_requests <= max_requests, got {min_requests}, {max_requests}")
    kinds = (arrivals,) if isinstance(arrivals, str) else tuple(arrivals)
    unknown = set(kinds) - set(ARRIVALS)
    if unknown or not kinds:
        raise ValueError(f"arrivals {sorted(unknown)} unknown: choose from {ARRIVALS}" if unknown else
                         f"workloads needs arrivals: one kind, or a tuple of kinds, of {ARRIVALS}")
    # named here, not as Hypothesis's own min_value/max_value of arguments the caller never gave
    if "poisson" in kinds and not (isinstance(max_qps, numbers.Real) and not isinstance(max_qps, bool)
                                   and math.isfinite(max_qps) and max_qps > 0):
        raise ValueError(f"workloads needs a finite max_qps > 0 for poisson arrivals, got {max_qps!r}")
    if "closed_loop" in kinds and not (whole_number(max_concurrency) and max_concurrency >= 1):
        raise ValueError(f"workloads needs a whole max_concurrency >= 1 for closed_loop arrivals, got {max_concurrency!r}")
    limits = current_limits(max_total_len)
    prefix = 0
    if shared_prefix is not False:
        prefix_strategy = shared_prefix if not isinstance(shared_prefix, bool) else lengths(
            1, max(1, min(1024, limits.max_model_len // 2)))
        prefix = draw(prefix_strategy)
    reqs = draw(st.lists(requests(prompt_len, output_len, max_total_len=limits.max_model_len - prefix),
                         min_size=min_requests, max_size=max_requests))
    if prefix:
        reqs = [Request(r.prompt_len + prefix, r.output_len, prefix_group=0, prefix_len=prefix, n=r.n) for r in reqs]
    kind = draw(st.sampled_from(kinds))
    if kind == "closed_loop":
        concurrency = draw(st.integers(1, int(max_concurrency)))
        return Workload(tuple(reqs), seed=seed, concurrency=concurrency, kind=kind)
    if kind == "poisson":
        qps = draw(st.floats(min(0.5, max_qps), max_qps, allow_nan=False, allow_infinity=False))  # a slow engine's below 0.5
        gaps = draw(st.lists(st.floats(0.0, 4.0 / qps, allow_nan=False), min_size=len(reqs), max_size=len(reqs)))
        t, timed = 0.0, []
        for r, gap in zip(reqs, gaps):
            timed.append(Request(r.prompt_len, r.output_len, round(t, 6), r.prefix_group, r.n, r.prefix_len))
            t += gap
        return Workload(tuple(timed), seed=seed, kind=kind)
    return Workload(tuple(reqs), seed=seed, kind="offline")
