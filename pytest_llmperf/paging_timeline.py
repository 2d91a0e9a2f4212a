"""The paging timeline: what the scheduler did at every engine step, small enough for a baseline.

A deterministic result (an offline batch on a fixed KV budget) repeats its step timeline exactly on
the same vLLM version with the same limits, so six summary numbers are not all a baseline can keep:
a scheduler change that leaves them alone still moves a step. Stored per result:

- `steps`: one line, every step's `running/waiting/blocks in use`, run-length encoded (`16/0/240*3`),
- `events`: one line per step that admitted or preempted requests, by workload index
  (`s37 r16 w0 b240 +12..15 -7`): the part a reviewer reads in a pull-request diff,
- `hash`: of both, so that an unchanged timeline compares in one string.

`first_divergence` names the first step at which two timelines differ and what each side did there.
Knows nothing of engines, pytest or files.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    running: int
    waiting: int
    blocks: int
    admitted: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        return f"{self.running}/{self.waiting}/{self.blocks}"

    def describe(self) -> str:
        text = f"{self.running} running, {self.waiting} waiting, {self.blocks} blocks in use"
        if self.admitted:
            text += f", admitted {_ranges(self.admitted)}"
        if self.preempted:
            text += f", preempted {_ranges(self.preempted)}"
        return text


@dataclass(frozen=True)
class Timeline:
    steps: tuple[Step, ...]

    @classmethod
    def of(cls, samples: Iterable[Any]) -> Timeline:
        """From the recorder's samples (`trace.KVSample`: running, waiting, blocks_used, admitted, preempted)."""
        return cls(tuple(Step(s.running, s.waiting, s.blocks_used, tuple(s.admitted), tuple(s.preempted))
                         for s in samples))

    def to_dict(self) -> dict[str, Any]:
        steps, events = _encode_steps(self.steps), _encode_events(self.steps)
        return {"hash": _hash(steps, events), "steps": steps, "events": events}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timeline:
        states = _decode_steps(d["steps"])
        events = dict(_decode_event(line) for line in d.get("events", []))
        return cls(tuple(Step(r, w, b, *events.get(i, ((), ()))) for i, (r, w, b) in enumerate(states)))

    @property
    def preemptions(self) -> int:
        return sum(len(s.preempted) for s in self.steps)


def digest(d: Mapping[str, Any]) -> str:
    return str(d.get("hash", ""))


def first_divergence(old: Timeline, new: Timeline) -> str | None:
    """Where `new` first departs from `old`, what each did there and how the runs differ overall; None
    when they are the same step for step."""
    i = divergence_step(old, new)
    if i is None:
        return None
    a, b = (t.steps[i] if i < len(t.steps) else None for t in (old, new))
    return f"{_at(i, a, b)}; {_overall(old, new)}"


def divergence_step(old: Timeline, new: Timeline) -> int | None:
    """The first step at which two timelines differ, None when they do not."""
    return next((i for i, (a, b) in enumerate(itertools.zip_longest(old.steps, new.steps)) if a != b), None)


def _at(i: int, a: Step | None, b: Step | None) -> str:
    before = a.describe() if a else "had ended"
    after = b.describe() if b else "had ended"
    return f"paging timeline diverged at step {i}: baseline {before}; current {after}"


def _overall(old: Timeline, new: Timeline) -> str:
    first = [next((i for i, s in enumerate(t.steps) if s.preempted), None) for t in (old, new)]
    parts = [f"{len(old.steps)} -> {len(new.steps)} steps", f"{old.preemptions} -> {new.preemptions} preemptions"]
    if first[0] != first[1]:
        parts.append(f"first preemption at step {_step(first[0])} -> {_step(first[1])}")
    gone = sum((_preemption_events(old) - _preemption_events(new)).values())
    came = sum((_preemption_events(new) - _preemption_events(old)).values())
    if moved := min(gone, came):  # the count alone hides preemptions that happened at other steps or to other
        # requests; those of the baseline with no new one to stand for did not move, they are gone (the count says)
        parts.append(f"{moved} of the baseline's preemptions at another step or of another request")
    return ", ".join(parts)


def _preemption_events(t: Timeline) -> Counter[tuple[int, str]]:
    """How often each request was preempted at each step."""
    return Counter((i, name) for i, s in enumerate(t.steps) for name in s.preempted)


def _step(i: int | None) -> str:
    return "-" if i is None else str(i)


def _encode_steps(steps: Sequence[Step]) -> str:
    runs = [(state, len(list(group))) for state, group in itertools.groupby(s.state for s in steps)]
    return " ".join(state if n == 1 else f"{state}*{n}" for state, n in runs)


def _decode_steps(text: str) -> list[tuple[int, int, int]]:
    out = []
    for token in text.split():
        state, _, n = token.partition("*")
        r, w, b = (int(x) for x in state.split("/"))
        out += [(r, w, b)] * (int(n) if n else 1)
    return out


def _encode_events(steps: Sequence[Step]) -> list[str]:
    lines = []
    for i, s in enumerate(steps):
        if s.admitted or s.preempted:
            line = f"s{i} r{s.running} w{s.waiting} b{s.blocks}"
            line += f" +{_ranges(s.admitted, ',')}" if s.admitted else ""
            line += f" -{_ranges(s.preempted, ',')}" if s.preempted else ""
            lines.append(line)
    return lines


def _decode_event(line: str) -> tuple[int, tuple[tuple[str, ...], tuple[str, ...]]]:
    parts = line.split()
    admitted = next((_expand(p[1:]) for p in parts[4:] if p.startswith("+")), ())
    preempted = next((_expand(p[1:]) for p in parts[4:] if p.startswith("-")), ())
    return int(parts[0][1:]), (admitted, preempted)


def _ranges(names: Sequence[str], sep: str = ", ") -> str:
    """Request indices as ranges where they are consecutive numbers ("12-15"); others as they are.
    The order is kept (it is the scheduler's), so only ascending runs are joined."""
    out: list[str] = []
    run: list[int] = []

    def close() -> None:
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}")
            run.clear()

    for name in names:
        if name.isdigit() and run and int(name) == run[-1] + 1:
            run.append(int(name))
            continue
        close()
        if name.isdigit():
            run.append(int(name))
        else:
            out.append(name)
    close()
    return sep.join(out)


def _expand(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for part in text.split(","):
        lo, dots, hi = part.partition("..")
        out += [str(i) for i in range(int(lo), int(hi) + 1)] if dots else [part]
    return tuple(out)


def _hash(steps: str, events: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps([steps, list(events)]).encode()).hexdigest()[:16]
