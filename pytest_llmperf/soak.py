"""`--llmperf-soak N`: the selected tests N times back to back in one session, round by round, with
the host memory (this process and its engine processes) and the GPU memory (NVML) taken after each
round. Memory that grows between the last two rounds beyond `--llmperf-soak-limit-mib` fails the
session: a leak that one run of the suite would hide; so does memory that grew from the second round to the
last by more than the limit and stood highest after the last (a steady leak smaller than the limit a round).

Each test is parametrised with its round (`[round2]` in its id), so round N of every test runs before
round N + 1 of any; engines stay shared within and across rounds as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .gpu import memory_used

ROUND = "llmperf_soak_round"
PLUGIN_NAME = "llmperf-soak"  # registered with --llmperf-soak above 1
DEFAULT_LIMIT_MIB = 256.0
MIB = 1024**2


@dataclass(frozen=True)
class RoundMemory:
    round: int
    host_mib: float
    gpu_mib: float | None


def round_of(item: pytest.Item) -> int:
    callspec = getattr(item, "callspec", None)
    return int(callspec.params.get(ROUND, 1)) if callspec is not None else 1


def baseline_id(item: pytest.Item) -> str:
    """The id a test's baseline is found by: its node id without its soak round (`test[round2]` is `test`,
    `test[a-round2]` is `test[a]`), so that every round compares with the one baseline a plain run records."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or ROUND not in callspec.params:
        return item.nodeid
    parts = [p for p in callspec.id.split("-") if p != f"round{callspec.params[ROUND]}"]
    base = item.nodeid[:item.nodeid.rindex("[")]
    return f"{base}[{'-'.join(parts)}]" if parts else base


def host_memory_mib() -> float:
    """Resident memory of this process and every process it started (engine cores, servers)."""
    try:
        import psutil
    except ImportError:
        raise pytest.UsageError("--llmperf-soak measures host memory with psutil: "
                                "pip install 'pytest-llmperf[soak]'") from None
    procs = [psutil.Process(), *psutil.Process().children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            continue
    return total / MIB


class Soak:
    """Registered by the plugin when `--llmperf-soak` is above 1."""

    def __init__(self, rounds: int, limit_mib: float, gpu_index: Callable[[], int | None]) -> None:
        # the GPU's index is asked for when a round ends: the plugin claims its GPUs after collection
        self.rounds, self.limit_mib, self.gpu_index = rounds, limit_mib, gpu_index
        self.memory: list[RoundMemory] = []

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        metafunc.fixturenames.append(ROUND)
        metafunc.parametrize(ROUND, range(1, self.rounds + 1), ids=lambda n: f"round{n}")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if nextitem is None or round_of(nextitem) != round_of(item):
            self.memory.append(RoundMemory(round_of(item), host_memory_mib(), self._gpu_mib()))

    def _gpu_mib(self) -> float | None:
        index = self.gpu_index()
        return None if index is None else memory_used(index) / MIB

    def growth(self) -> dict[str, float]:
        """Growth between the last two rounds, MiB."""
        if len(self.memory) < 2:
            return {}
        a, b = self.memory[-2], self.memory[-1]
        out = {"host": b.host_mib - a.host_mib}
        if a.gpu_mib is not None and b.gpu_mib is not None:
            out["gpu"] = b.gpu_mib - a.gpu_mib
        return out

    def steady_growth(self) -> dict[str, float]:
        """Growth from the second round to the last where memory still stood at its highest after the last
        round, MiB (the first round's growth is the engines' start and their caches filling; three rounds at
        least). A round that gave some back does not hide a leak; memory that grew once and then fell does not
        count as one."""
        rounds = self.memory[1:]
        if len(rounds) < 3:
            return {}
        out = {}
        for kind, of in (("host", lambda m: m.host_mib), ("gpu", lambda m: m.gpu_mib)):
            values = [of(m) for m in rounds]
            if None not in values and values[-1] == max(values):
                out[kind] = values[-1] - values[0]
        return out

    def verdict(self) -> str | None:
        """A message when memory grew beyond the limit between the last two rounds, or from the second round
        to the last (highest after it) by more than the limit, else None."""
        limit = f"(limit {self.limit_mib:.0f} MiB, --llmperf-soak-limit-mib)"
        if over := self._over(self.growth()):
            return (f"llmperf soak: memory grew between rounds {self.memory[-2].round} and {self.memory[-1].round}: "
                    f"{over} {limit}")
        if over := self._over(self.steady_growth()):
            return (f"llmperf soak: memory grew from round {self.memory[1].round} to {self.memory[-1].round}, "
                    f"highest after the last: {over} in all {limit}")
        return None

    def _over(self, growth: dict[str, float]) -> str:
        """`host +300 MiB, gpu +400 MiB` for the growth beyond the limit; "" where none is."""
        return ", ".join(f"{k} +{v:.0f} MiB" for k, v in growth.items() if v > self.limit_mib)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.verdict() is not None and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.section("llmperf soak")
        for m in self.memory:
            gpu = f", GPU {m.gpu_mib:.0f} MiB" if m.gpu_mib is not None else ""
            tr.write_line(f"after round {m.round}: host {m.host_mib:.0f} MiB{gpu}")
        problem = self.verdict()
        if problem:
            tr.write_line(problem, red=True)
        elif len(self.memory) >= 2:
            growth = ", ".join(f"{k} {v:+.0f} MiB" for k, v in self.growth().items())
            tr.write_line(f"no growth beyond {self.limit_mib:.0f} MiB between the last two rounds ({growth})")
