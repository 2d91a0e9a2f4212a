"""Which tests are the plugin's, and how they are selected and ordered: the hardware class a test runs
on (`-m a100` on an A100 runner selects every test that names no other class), the skip of a test
marked for other hardware, the one line that explains an empty `-m` selection, and the order that
starts each engine configuration once."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from . import markers, properties
from .assertions import TIMING_MARKERS, MarkerError
from .baseline import BaselineError, gates_timing, path_for
from .engines import registry
from .gpu import KNOWN_CLASSES
from .session import SESSION, engine_options, gate_option, model_option
from .soak import baseline_id

CARRIED = pytest.StashKey[dict[str, int]]()  # hardware class -> how many collected tests carry it


def uses_plugin(item: pytest.Item) -> bool:
    """A test with one of the plugin's fixtures or markers."""
    fixtures = set(getattr(item, "fixturenames", ()))
    engines = item.config.stash[SESSION].engines
    return bool(fixtures & (properties.PLUGIN_FIXTURES | registry.fixture_names(engines))) or any(
        markers.is_plugin_marker(m.name) for m in item.iter_markers())


def mark_hardware(items: list[pytest.Item], hardware: str) -> dict[str, int]:
    """A test that uses the plugin and names no hardware class runs on any: it gets this machine's
    class as a marker, so that `-m a100` on an A100 runner selects it. Tests that do not use the
    plugin are left as they are. Returns how many tests carry each class."""
    carried: dict[str, int] = {}
    for item in items:
        wanted = [m.name for m in item.iter_markers() if m.name in KNOWN_CLASSES]
        if not wanted and uses_plugin(item):
            item.add_marker(hardware)
            wanted = [hardware]
        for cls in dict.fromkeys(wanted):
            carried[cls] = carried.get(cls, 0) + 1
    return carried


def skip_other_hardware(item: pytest.Item) -> None:
    wanted = [m.name for m in item.iter_markers() if m.name in KNOWN_CLASSES]
    state = item.config.stash[SESSION]
    if wanted and state.hardware not in wanted:
        found = f"{state.hardware} ({state.gpu.name})" if state.gpu else state.hardware
        pytest.skip(f"needs {' or '.join(wanted)} hardware; this machine is {found} (override with --llmperf-hardware)")


def empty_selection_line(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    """One line when a hardware `-m` selected nothing: which classes the tests carry, which this machine is."""
    expr = config.getoption("markexpr", "") or ""
    named = [cls for cls in KNOWN_CLASSES if cls in expr.replace("(", " ").replace(")", " ").split()]
    carried = config.stash.get(CARRIED, {})
    if items or not named or not carried:
        return None
    state = config.stash[SESSION]
    found = ", ".join(f"{cls} ({n})" for cls, n in sorted(carried.items()))
    return (f"llmperf: -m {expr!r} selected no test: this machine is {state.hardware} (tests that name no hardware "
            f"carry it), and the tests carry {found}; select with -m {state.hardware}, or judge this machine as "
            f"another class with --llmperf-hardware {named[0]}")


_UNRECORDED = {"compare": "the others have nothing to be compared with (their limits still apply)",
               "require": "the others will fail where they run (not skipped), each with the command that records it"}


def stored_baselines_line(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    """How many of the selected tests that measure have a baseline to be judged against, before any engine
    starts (the header counts the folder, not the selection). Property tests are judged example by example
    and never against a baseline: not counted."""
    gate = config.stash[SESSION].gate
    measuring = [item for item in items if uses_plugin(item) and not properties.is_property_test(item)]
    if gate.mode not in _UNRECORDED or not measuring:
        return None
    stored = sum(path_for(gate.root, baseline_id(item), gate.hardware, gate.model).exists() for item in measuring)
    line = f"llmperf: {stored} of the {len(measuring)} selected tests that measure have a stored baseline"
    return line + (f"; {_UNRECORDED[gate.mode]}" if stored < len(measuring) else "")


# Transformers runs in the test process: once it has run on a GPU, its CUDA context and cached memory stay
# there until the session ends and count in the device memory of every engine measured after it (an H200:
# 0.70 GiB more for a tiny vLLM engine, 2.43 against 1.73 GiB). On a GPU, tests that use it run after the
# others, so that those measure the same memory whichever tests are selected; their engine configuration's
# group runs last of all, so that its vLLM engine, started for the group's other tests, is still live when
# they need it (a comparison of vLLM with transformers) rather than started again. Without a GPU, nothing
# is held and the order keeps every engine configuration together.
IN_PROCESS_FIXTURES = frozenset({"hf_engine", "hf_engine_factory"})


def engine_group(item: pytest.Item) -> str:
    """The engine configuration (options and model) a test's engines share."""
    try:
        return repr((sorted(engine_options(item).items()), model_option(item) or ""))
    except MarkerError:
        return ""  # reported at setup, with the test's name


def in_process(item: pytest.Item) -> bool:
    return bool(IN_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())))


def engine_order(items: list[pytest.Item], in_process_last: bool, beside_last: bool = False, engine_name: str = "",
                 engines: frozenset[str] | set[str] = frozenset(), model_spec: str | None = None,
                 ) -> dict[str, tuple[bool, bool, str, bool]]:
    """Sort keys by node id: tests that share an engine configuration run together, so each engine starts
    once; where `in_process_last` (a session with a GPU), tests of an in-process engine after the others of
    their group, and the groups holding such tests after every other group; where `beside_last` (engines
    side by side), the groups whose engines may start together (`side_by_side_groups`, by the same rules)
    after the others of their kind, so that they follow one another."""
    groups = {item.nodeid: engine_group(item) for item in items}
    late = {item.nodeid for item in items if in_process_last and in_process(item)}
    holding = {groups[nodeid] for nodeid in late}
    asked = {item.nodeid: _asked(item, engine_name, engines, model_spec) for item in items} if beside_last else {}
    timed = _timed(asked.values())
    beside = {groups[nodeid] for nodeid, found in asked.items() if _joins(found, timed)}
    return {nodeid: (group in holding, group in beside, group, nodeid in late) for nodeid, group in groups.items()}


# (engine name, the test's own model or None, its engine options): a configuration the pool may start
Planned = tuple[str, "str | None", dict[str, Any]]


def side_by_side_groups(items: list[pytest.Item], engine_name: str, engines: set[str], hardware: str | None = None,
                        model_spec: str | None = None) -> list[list[Planned]]:
    """Engine configurations that may start together and live side by side, in the order tests ask for
    them: each maximal run of consecutive tests whose engine fixture (`<engine>_engine`, `llm_engine`) has
    a fixed KV budget (`num_gpu_blocks_override`, so its paging does not depend on the memory its
    neighbours hold) and whose baseline and limits judge no timing (a neighbour's start would move timing;
    none measures while another starts, but they stay beside it). A test that asks for another engine, or
    makes its own (a factory), ends the run. The pool hands out one engine per configuration, so a
    configuration that any test uses with timing judged is never planned: that test finds its engine alone.
    Tests that will be skipped (`skip`, `skipif(True)`, another `hardware` class) are passed over: no
    engine starts for them. `model_spec`: the session's model, which a test without a model of its own uses."""
    asked = [_asked(item, engine_name, engines, model_spec) for item in items if not _skipped(item, hardware)]
    timed = _timed(asked)
    groups: list[list[Planned]] = [[]]
    for found in asked:
        if found is None:
            continue  # no engine of the pool: the run goes on
        if not _joins(found, timed):
            groups.append([])
        elif found.configs[0] not in groups[-1]:
            groups[-1].append(found.configs[0])
    return [g for g in groups if len(g) > 1]


@dataclass(frozen=True)
class _Asked:
    """What one test asks of the engine pool."""

    configs: tuple[Planned, ...]  # one per engine fixture it uses (none where its markers are wrong)
    joins: bool  # its engine may start in a group: one fixture, no factory, a fixed KV budget, no timing judged
    timed: bool  # its baseline or its limits judge timing


def _asked(item: pytest.Item, engine_name: str, engines: Collection[str], model_spec: str | None) -> _Asked | None:
    """None for a test that uses no engine of the pool."""
    names = set(getattr(item, "fixturenames", ()))
    fixtures = sorted(n for n in names if n == "llm_engine" or n.removesuffix("_engine") in engines)
    factory = any(n.removesuffix("_engine_factory") in engines for n in names)
    if not fixtures and not factory:
        return None
    try:
        options, model, timed = engine_options(item), model_option(item), gates_timing(gate_option(item))
    except (MarkerError, BaselineError):  # reported at setup, with the test's name
        return _Asked((), False, False)
    timed = timed or any(m.name in TIMING_MARKERS for m in item.iter_markers())
    configs = tuple((engine_name if f == "llm_engine" else f.removesuffix("_engine"), model or model_spec, options)
                    for f in fixtures)
    joins = len(configs) == 1 and not (factory or timed) and "num_gpu_blocks_override" in options
    return _Asked(configs, joins, timed)


def _timed(asked: Iterable[_Asked | None]) -> set[str]:
    """The configurations some test uses with timing judged: never planned."""
    return {_config_key(c) for found in asked if found is not None and found.timed for c in found.configs}


def _joins(found: _Asked | None, timed: set[str]) -> bool:
    return found is not None and found.joins and _config_key(found.configs[0]) not in timed


def _config_key(config: Planned) -> str:
    engine, model, options = config
    return repr((engine, model, sorted(options.items())))


def _skipped(item: pytest.Item, hardware: str | None) -> bool:
    if item.get_closest_marker("skip") is not None:
        return True
    if any(a is True for m in item.iter_markers("skipif") for a in (*m.args, m.kwargs.get("condition"))):
        return True
    wanted = [m.name for m in item.iter_markers() if m.name in KNOWN_CLASSES]
    return hardware is not None and bool(wanted) and hardware not in wanted
