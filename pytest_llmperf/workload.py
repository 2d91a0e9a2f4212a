"""The workload model: what requests to send, how long they are and when they arrive.

A workload is a plain value (frozen dataclasses, no engine, no pytest). The same constructor with the
same seed always gives the same requests and the same token ids, and `Workload.hash` is a content hash
that baselines use to tell whether they were measured on the same thing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

import numpy as np

if TYPE_CHECKING:
    from .trace_replay import TraceInfo

WORKLOAD_SCHEMA = 1
# Token ids below this are left alone: real vocabularies keep special tokens (bos/eos/pad) there.
_FIRST_PLAIN_TOKEN = 100


class Distribution(Protocol):
    """A length distribution: draws `n` positive integers from a seeded generator."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> dict[str, Any]:
        return {"fixed": self.value}


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [lo, hi], both ends included."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"length range ({self.lo}, {self.hi}) is empty: give (lo, hi) with lo <= hi")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lo, self.hi + 1, size=n, dtype=np.int64)

    def describe(self) -> dict[str, Any]:
        return {"uniform": [self.lo, self.hi]}


@dataclass(frozen=True)
class LogNormal:
    """Lengths with a long right tail, as chat traffic has.

    `mean` is the mean length in tokens (not the mean of the underlying normal); `sigma` is the
    shape parameter of the underlying normal. Draws are rounded and clipped to [lo, hi].
    """

    mean: float
    sigma: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        # NaN and infinity pass a comparison and drew a length of `lo` for every request
        if not (math.isfinite(self.mean) and math.isfinite(self.sigma)) or self.mean <= 0 or self.sigma < 0:
            raise ValueError(f"LogNormal needs a finite mean > 0 and sigma >= 0, got mean={self.mean}, sigma={self.sigma}")
        if self.lo < 1 or (self.hi is not None and self.hi < self.lo):
            raise ValueError(f"LogNormal clips to [lo, hi]: it needs 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = np.log(self.mean) - self.sigma**2 / 2
        draws = np.rint(rng.lognormal(mu, self.sigma, size=n)).astype(np.int64)
        return np.clip(draws, self.lo, self.hi if self.hi is not None else np.iinfo(np.int64).max)

    def describe(self) -> dict[str, Any]:
        return {"lognormal": {"mean": self.mean, "sigma": self.sigma, "lo": self.lo, "hi": self.hi}}


@dataclass(frozen=True)
class Empirical:
    """An empirical histogram: `values[i]` drawn with probability proportional to `weights[i]`."""

    values: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.weights):
            raise ValueError("Empirical needs as many weights as values, and at least one value")
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("Empirical weights must be >= 0 with a positive sum")

    @classmethod
    def from_samples(cls, samples: Sequence[int]) -> Empirical:
        values, counts = np.unique(np.asarray(samples, dtype=np.int64), return_counts=True)
        return cls(tuple(int(v) for v in values), tuple(float(c) for c in counts))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = np.asarray(self.weights, dtype=float)
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, p=p / p.sum())

    def describe(self) -> dict[str, Any]:
        return {"empirical": {"values": list(self.values), "weights": list(self.weights)}}


LengthSpec = Union[int, tuple[int, int], Distribution]


def _finite_at_least_0(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and value >= 0


def _finite_positive(value: Any) -> bool:
    return _finite_at_least_0(value) and value > 0


def check_seed(seed: Any) -> None:
    """A workload's seed: a whole number >= 0 (numpy's generators take no other; a numpy integer is stored as an
    int, which its hash's JSON can write)."""
    if not whole_number(seed) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a whole number >= 0")


def whole_number(value: Any) -> bool:
    """A whole number, given as an int, a numpy integer or a float such as 16.0 (not a bool)."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(value) and float(value).is_integer())


def as_distribution(spec: LengthSpec, what: str) -> Distribution:
    if isinstance(spec, bool):
        raise TypeError(f"{what} must be an int, a (lo, hi) tuple or a distribution, not a bool")
    if isinstance(spec, (int, np.integer)):
        return Fixed(int(spec))
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        if not all(whole_number(v) for v in spec):  # (1.9, 3.9) was cut to (1, 3) without a word
            raise TypeError(f"{what}={spec!r}: a (lo, hi) range of token counts takes two whole numbers")
        return Uniform(int(spec[0]), int(spec[1]))
    if hasattr(spec, "sample") and hasattr(spec, "describe"):
        return spec
    raise TypeError(
        f"{what}={spec!r} is not a length: give an int, a (lo, hi) tuple, "
        "or a distribution such as LogNormal(mean=200, sigma=0.8)"
    )


@dataclass(frozen=True)
class Request:
    """One request. `n` asks for parallel samples of one prompt; requests of one `prefix_group`
    share their first `prefix_len` prompt tokens (a system prompt).

    `blocks` (a replayed trace's `hash_ids`) builds the prompt from blocks of `block_len` tokens
    instead, the last one partial: a block id always expands to the same tokens, so two requests
    whose block lists share a leading run share exactly those tokens. One group per request cannot
    say that [1, 2, 3] shares two blocks with [1, 2, 9] and one with [1, 4]; block ids can.

    `session` and `turn` make a conversation: turn k > 0 of a session is sent `think_s` seconds after
    the answer to turn k - 1 arrived (its `arrival_s` is unused), and its prompt is turn k - 1's prompt,
    then that turn's answer, then a new message: `prompt_len` counts all three. The answer in the history
    is a stand-in of `output_len` tokens drawn from the workload, not the tokens the model generated
    (every turn is asked for exactly `output_len` tokens, so the lengths match): the history's prompt
    blocks are shared with the earlier turn as in production, the answer's blocks are not.
    """

    prompt_len: int
    output_len: int
    arrival_s: float = 0.0
    prefix_group: int | None = None
    n: int = 1
    prefix_len: int = 0
    blocks: tuple[int, ...] = ()
    block_len: int = 0
    session: int | None = None
    turn: int = 0
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, tuple):  # from_dict hands over JSON lists
            object.__setattr__(self, "blocks", tuple(self.blocks))
        problems = _block_problems(self)
        if not isinstance(self.prompt_len, (int, np.integer)) or self.prompt_len < 1:
            problems.append(f"prompt_len={self.prompt_len!r} must be an int >= 1")
        if not isinstance(self.output_len, (int, np.integer)) or self.output_len < 1:
            problems.append(f"output_len={self.output_len!r} must be an int >= 1")
        if not _finite_at_least_0(self.arrival_s):  # inf would wait forever before sending it
            problems.append(f"arrival_s={self.arrival_s!r} must be a finite number of seconds >= 0")
        if not isinstance(self.n, (int, np.integer)) or self.n < 1:
            problems.append(f"n={self.n!r} must be an int >= 1")
        if not 0 <= self.prefix_len <= self.prompt_len:
            problems.append(f"prefix_len={self.prefix_len!r} must be within [0, prompt_len={self.prompt_len}]")
        if self.prefix_len and self.prefix_group is None:
            problems.append("prefix_len > 0 needs a prefix_group")
        problems += _turn_problems(self)
        if problems:
            raise ValueError("bad Request: " + "; ".join(problems))

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _turn_problems(r: Request) -> list[str]:
    if r.session is None:
        return [] if r.turn == 0 and r.think_s == 0 else ["turn and think_s need a session"]
    problems = []
    if not isinstance(r.turn, (int, np.integer)) or r.turn < 0:
        problems.append(f"turn={r.turn!r} must be an int >= 0")
    if not _finite_at_least_0(r.think_s):
        problems.append(f"think_s={r.think_s!r} must be a finite number of seconds >= 0")
    if r.n != 1:
        problems.append("a session's turns take n=1 (the next turn's history holds one answer)")
    if r.turn and (r.arrival_s or r.prefix_len or r.blocks):
        problems.append("a later turn (turn > 0) is sent after the previous answer and starts with its history: "
                        "leave arrival_s, prefix_len and blocks to turn 0")
    return problems


def _block_problems(r: Request) -> list[str]:
    if not r.blocks and not r.block_len:
        return []
    if not isinstance(r.block_len, (int, np.integer)) or r.block_len < 1:
        return [f"block_len={r.block_len!r} must be an int >= 1 when blocks are given"]
    problems = []
    if any(not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 0 for b in r.blocks):
        problems.append("blocks must be ints >= 0")
    if isinstance(r.prompt_len, (int, np.integer)) and len(r.blocks) != -(-r.prompt_len // r.block_len):
        problems.append(f"prompt_len={r.prompt_len} needs {-(-r.prompt_len // r.block_len)} blocks of "
                        f"{r.block_len} tokens, got {len(r.blocks)}")
    if r.prefix_len:
        problems.append("give blocks or prefix_len, not both")
    return problems


@dataclass(frozen=True)
class Workload:
    """An ordered set of requests plus how they are offered to the engine.

    `concurrency` set means a closed loop: at most that many requests in flight, the next one sent
    when one finishes (arrival times are then ignored). Otherwise each request is sent at its
    `arrival_s`; all zero means an offline batch handed over at once.
    """

    requests: tuple[Request, ...]
    seed: int = 0
    concurrency: int | None = None
    kind: str = field(default="custom", compare=False)
    # where a replayed trace came from and how many of its requests were clipped or skipped to fit
    trace: TraceInfo | None = field(default=None, compare=False)
    # each request's previous turn in its session (derived in __post_init__; previous_turn reads it)
    _previous: tuple[int | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.requests, tuple):
            object.__setattr__(self, "requests", tuple(self.requests))
        if not self.requests:
            raise ValueError("a workload needs at least one request (got zero)")
        check_seed(self.seed)
        object.__setattr__(self, "seed", int(self.seed))
        if self.concurrency is not None:
            if not whole_number(self.concurrency) or self.concurrency < 1:
                raise ValueError(f"concurrency={self.concurrency!r} must be a whole number of requests in flight >= 1")
            object.__setattr__(self, "concurrency", int(self.concurrency))  # 4.0 or np.int64(4) hashes as 4
        # each request's previous turn, found once: the schedule and token ids ask for it per request
        object.__setattr__(self, "_previous", _previous_turns(self))

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def offline(cls, n: int, prompt_len: LengthSpec, output_len: LengthSpec, seed: int = 0) -> Workload:
        """`n` requests all available at time zero (the `LLM.generate` case)."""
        prompts, outputs = _draw_lengths(n, prompt_len, output_len, seed)
        return cls(tuple(Request(p, o) for p, o in zip(prompts, outputs)), seed=seed, kind="offline")

    @classmethod
    def poisson(
        cls,
        qps: float,
        n: int,
        prompt_len: LengthSpec,
        output_len: LengthSpec,
        seed: int = 0,
        burstiness: float = 1.0,
    ) -> Workload:
        """Open-loop arrivals at `qps` with gamma inter-arrival times (as `vllm bench serve`):
        shape = burstiness, mean = 1/qps. burstiness 1.0 is Poisson; < 1 burstier; > 1 more even."""
        if not (_finite_positive(qps) and _finite_positive(burstiness)):
            raise ValueError(f"poisson needs finite qps > 0 and burstiness > 0, got qps={qps}, burstiness={burstiness}")
        prompts, outputs = _draw_lengths(n, prompt_len, output_len, seed)
        arrivals = _gamma_arrivals(qps, n, seed, burstiness)
        reqs = tuple(Request(p, o, arrival_s=float(a)) for p, o, a in zip(prompts, outputs, arrivals))
        return cls(reqs, seed=seed, kind="poisson")

    @classmethod
    def closed_loop(
        cls, concurrency: int, n: int, prompt_len: LengthSpec, output_len: LengthSpec, seed: int = 0
    ) -> Workload:
        """`concurrency` virtual users, each sending its next request when the last one finished."""
        prompts, outputs = _draw_lengths(n, prompt_len, output_len, seed)
        reqs = tuple(Request(p, o) for p, o in zip(prompts, outputs))
        return cls(reqs, seed=seed, concurrency=concurrency, kind="closed_loop")

    @classmethod
    def shared_prefix(
        cls,
        n: int,
        prefix_len: int,
        suffix_len: LengthSpec,
        output_len: LengthSpec,
        groups: int = 1,
        seed: int = 0,
    ) -> Workload:
        """`n` offline requests in `groups` groups; each group shares a `prefix_len`-token prefix
        (a system prompt) followed by a unique suffix."""
        if groups < 1 or prefix_len < 1:
            raise ValueError(f"shared_prefix needs groups >= 1 and prefix_len >= 1, got {groups}, {prefix_len}")
        suffixes, outputs = _draw_lengths(n, suffix_len, output_len, seed)
        reqs = tuple(
            Request(prefix_len + s, o, prefix_group=i % groups, prefix_len=prefix_len)
            for i, (s, o) in enumerate(zip(suffixes, outputs))
        )
        return cls(reqs, seed=seed, kind="shared_prefix")

    @classmethod
    def sessions(
        cls,
        n_sessions: int,
        turns: int,
        message_len: LengthSpec,
        output_len: LengthSpec,
        *,
        think_s: float = 0.0,
        qps: float | None = None,
        system_prompt_len: int = 0,
        seed: int = 0,
    ) -> Workload:
        """`n_sessions` conversations of `turns` turns each: a turn's prompt is the conversation so far
        (earlier prompts and answers) plus a new message of `message_len` tokens, sent `think_s` after the
        previous answer arrived. Sessions start together, or open-loop at `qps` sessions per second
        (Poisson, as `poisson`). `system_prompt_len` > 0 opens every session with one shared system prompt.
        `PerfResult.by_turn` reports TTFT and prefix-cache hits turn by turn."""
        if n_sessions < 1 or turns < 1:
            raise ValueError(f"sessions needs n_sessions >= 1 and turns >= 1, got {n_sessions}, {turns}")
        if qps is not None and not _finite_positive(qps):
            raise ValueError(f"sessions needs a finite qps > 0 (or None: every session starts at once), got {qps}")
        if system_prompt_len < 0:
            raise ValueError(f"system_prompt_len={system_prompt_len!r} must be >= 0")
        messages, outputs = _draw_lengths(n_sessions * turns, message_len, output_len, seed)
        starts = np.zeros(n_sessions) if qps is None else _gamma_arrivals(qps, n_sessions, seed)
        reqs: list[Request] = []
        for k in range(n_sessions):
            history = system_prompt_len
            for t in range(turns):
                message, output = int(messages[k * turns + t]), int(outputs[k * turns + t])
                first = t == 0
                reqs.append(Request(history + message, output, arrival_s=float(starts[k]) if first else 0.0,
                                    prefix_group=0 if first and system_prompt_len else None,
                                    prefix_len=system_prompt_len if first else 0,
                                    session=k, turn=t, think_s=0.0 if first else think_s))
                history += message + output
        return cls(tuple(reqs), seed=seed, kind="sessions")

    @classmethod
    def from_trace(
        cls,
        path: str | Path,
        format: str = "mooncake",
        *,
        limit: int | None = None,
        start: float | None = None,
        duration_s: float | None = None,
        time_scale: float = 1.0,
        length_scale: float = 1.0,
        max_total_len: int | None = None,
        too_long: str = "error",
        columns: dict[str, str] | None = None,
        block_size: int | None = None,
        timestamp_unit: str | None = None,
        seed: int = 0,
    ) -> Workload:
        """A recorded trace replayed: its arrival times, lengths and (from `hash_ids`) prefix sharing.
        `trace_replay.read_trace` documents every option."""
        from .trace_replay import Replay, read_trace

        replay = Replay(format=format, limit=limit, start=start, duration_s=duration_s, time_scale=time_scale,
                        length_scale=length_scale, max_total_len=max_total_len, too_long=too_long, columns=columns,
                        block_size=block_size, timestamp_unit=timestamp_unit)
        return read_trace(path, replay, seed)

    # -- facts --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.requests)

    @property
    def is_offline(self) -> bool:
        """True when the whole batch is handed over at once (paging is then deterministic)."""
        return self.concurrency is None and all(r.arrival_s == 0 and r.turn == 0 for r in self.requests)

    @property
    def turns(self) -> tuple[int, ...]:
        """Each request's turn in its session; empty when the workload has no sessions."""
        return tuple(r.turn for r in self.requests) if any(r.session is not None for r in self.requests) else ()

    def previous_turn(self, index: int) -> int | None:
        """The index of the request whose answer request `index` waits for (its session's previous turn)."""
        return self._previous[index]

    @property
    def max_total_len(self) -> int:
        return max(r.total_len for r in self.requests)

    @property
    def num_sequences(self) -> int:
        return sum(r.n for r in self.requests)

    def token_ids(self, index: int, vocab_size: int, salt: int = 0) -> list[int]:
        """Deterministic prompt token ids of request `index`.

        `salt` changes every id (prefixes included) so that warm-up and repeats never hit the prefix
        cache filled by an earlier pass over the same workload.
        """
        req = self.requests[index]
        lo, hi = min(_FIRST_PLAIN_TOKEN, vocab_size // 2), vocab_size
        before = self.previous_turn(index)
        if before is not None:  # the conversation so far: the previous prompt, a stand-in answer, a new message
            earlier = self.requests[before]
            answer = np.random.default_rng([self.seed, 17, salt, before]).integers(lo, hi, size=earlier.output_len)
            message = np.random.default_rng([self.seed, 7, salt, index]).integers(lo, hi,
                                                                                   size=req.prompt_len - earlier.total_len)
            return self.token_ids(before, vocab_size, salt) + answer.tolist() + message.tolist()
        if req.blocks:
            return _block_tokens(req, [self.seed, 13, salt], lo, hi)
        own = np.random.default_rng([self.seed, 7, salt, index]).integers(lo, hi, size=req.prompt_len - req.prefix_len)
        if not req.prefix_len:
            return own.tolist()
        prefix = np.random.default_rng([self.seed, 11, salt, req.prefix_group]).integers(lo, hi, size=req.prefix_len)
        return prefix.tolist() + own.tolist()

    def as_offline(self) -> Workload:
        """The same requests handed over at once (arrivals, closed loop and sessions dropped: each turn
        keeps its prompt's length, not its history)."""
        reqs = tuple(replace(r, arrival_s=0.0, session=None, turn=0, think_s=0.0) for r in self.requests)
        return Workload(reqs, seed=self.seed, kind=self.kind, trace=self.trace)

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {
            "schema": WORKLOAD_SCHEMA,
            "kind": self.kind,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "requests": [_request_dict(r) for r in self.requests],
        }
        if self.trace is not None:  # absent otherwise, so that workloads without one read as before
            out["trace"] = self.trace.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        if data.get("schema", WORKLOAD_SCHEMA) != WORKLOAD_SCHEMA:
            raise ValueError(f"workload schema {data.get('schema')!r} is not {WORKLOAD_SCHEMA}: regenerate it")
        reqs = tuple(Request(**r) for r in data["requests"])
        trace = None
        if data.get("trace") is not None:
            from .trace_replay import TraceInfo

            trace = TraceInfo(**data["trace"])
        return cls(reqs, seed=data.get("seed", 0), concurrency=data.get("concurrency"), kind=data.get("kind", "custom"),
                   trace=trace)

    @property
    def hash(self) -> str:
        """Content hash (requests, seed, concurrency): equal hashes mean the same traffic. The trace's
        file name and counts are left out: the requests already say what was replayed, and a renamed
        copy of a trace is the same traffic."""
        content = {k: v for k, v in self.to_dict().items() if k not in ("kind", "trace")}
        blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> str:
        p = [r.prompt_len for r in self.requests]
        o = [r.output_len for r in self.requests]
        loop = f", concurrency {self.concurrency}" if self.concurrency else ""
        span = max(r.arrival_s for r in self.requests)
        arrivals = f", arrivals over {span:.2f}s" if span else ""
        source = f", {self.trace.note()}" if self.trace is not None else ""
        return (f"{self.kind}: {len(self)} requests, prompt {min(p)}-{max(p)}, output {min(o)}-{max(o)}"
                f"{loop}{arrivals}{source}")

    def __repr__(self) -> str:
        return f"Workload.from_dict({self.to_dict()!r})"


def _request_dict(r: Request) -> dict[str, Any]:
    d = asdict(r)
    # defaults are left out so that stored workloads stay short and readable
    defaults = {"arrival_s": 0.0, "prefix_group": None, "n": 1, "prefix_len": 0, "blocks": (), "block_len": 0,
                "session": None, "turn": 0, "think_s": 0.0}
    out = {k: (int(v) if isinstance(v, np.integer) else v) for k, v in d.items() if defaults.get(k, object()) != v}
    if "blocks" in out:
        out["blocks"] = [int(b) for b in out["blocks"]]
    return out


def _gamma_arrivals(qps: float, n: int, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """Open-loop arrival times: gamma inter-arrival gaps of mean 1/qps (burstiness 1.0 is Poisson), the
    first at zero (it opens the run)."""
    gaps = np.random.default_rng([seed, 2]).gamma(shape=burstiness, scale=1.0 / (qps * burstiness), size=n)
    gaps[0] = 0.0
    return np.round(np.cumsum(gaps), 6)


def _previous_turns(w: Workload) -> tuple[int | None, ...]:
    """Each request's previous turn in its session (None for turn 0 and requests of no session),
    checking that each session's turns come in order 0, 1, 2... in the request list, each longer than
    the previous turn's prompt and answer, and that a closed loop takes none (a turn waits for its own
    answer)."""
    last: dict[int, int] = {}  # session -> index of its latest turn so far
    previous: list[int | None] = []
    for i, r in enumerate(w.requests):
        if r.session is None:
            previous.append(None)
            continue
        if w.concurrency is not None:
            raise ValueError("a closed loop (concurrency) does not take sessions: their turns already wait for "
                             "each answer; start sessions at once or at a qps instead")
        earlier = last.get(r.session)
        had = None if earlier is None else w.requests[earlier].turn
        if r.turn != (-1 if had is None else had) + 1:
            raise ValueError(f"request {i}: session {r.session} turn {r.turn} follows turn {had}: "
                             "give a session's turns in order 0, 1, 2, ...")
        if earlier is not None and r.prompt_len <= w.requests[earlier].total_len:
            raise ValueError(f"request {i}: session {r.session} turn {r.turn} has prompt_len={r.prompt_len}, but its "
                             f"history alone (turn {r.turn - 1}'s prompt and answer) is {w.requests[earlier].total_len} "
                             "tokens: add its new message")
        previous.append(earlier)
        last[r.session] = i
    return tuple(previous)


def _block_tokens(req: Request, key: list[int], lo: int, hi: int) -> list[int]:
    """The prompt built block by block: each block's tokens are drawn from its id alone (a partial last
    block takes the first of them), so equal leading ids give equal leading tokens in any request."""
    out: list[int] = []
    for block in req.blocks:
        need = min(req.block_len, req.prompt_len - len(out))
        out += np.random.default_rng([*key, int(block)]).integers(lo, hi, size=req.block_len)[:need].tolist()
    return out


def _draw_lengths(n: int, prompt_len: LengthSpec, output_len: LengthSpec, seed: int) -> tuple[list[int], list[int]]:
    check_seed(seed)
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"a workload needs n >= 1 requests, got n={n!r}")
    p_dist, o_dist = as_distribution(prompt_len, "prompt_len"), as_distribution(output_len, "output_len")
    prompts = p_dist.sample(np.random.default_rng([seed, 0]), n)
    outputs = o_dist.sample(np.random.default_rng([seed, 1]), n)
    return [int(x) for x in prompts], [int(x) for x in outputs]
