"""pytest hooks, options and the terminal summary. Knows nothing of how engines work.

A limit marker is validated before the test runs (bad input errors without spending a workload),
the test body records results through the `llmperf` fixture (fixtures.py), and the limits are judged in
`pytest_runtest_makereport`: a violation fails that test's report, as pytest-memray's limit markers do.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from . import assertions, gating, markers, properties, pytest_benchmark_bridge, remeasure, soak
from .assertions import Limit, MarkerError
from .baseline import PAGING_MODES, parse_tolerance, path_for, slug
from .baseline import load as load_baseline
from .engines import registry
from .engines.base import EnginePool, default_engine, gpus_of
from .fixtures import (  # noqa: F401 - pytest finds a plugin's fixtures in its module
    engine_fixtures,
    gpu_fixture,
    llm_engine,
    llmperf,
    llmperf_session,
    vllm_server,
)
from .gpu import (
    KNOWN_CLASSES,
    GpuError,
    machine_class,
    release_waiter,
    visible_count,
)
from .gpu import claim as claim_gpus
from .models import DEFAULT_MODEL, stored_name
from .paging_timeline import Timeline, divergence_step
from .report import HEADLINE, TestRecord, result_record, terminal_lines
from .report import write as write_report
from .runner import WARMUP_MODES, LLMPerf
from .session import LIMITS, PERF, SESSION, Session, engine_options


# -- options ---------------------------------------------------------------------------------------
def _option(config: pytest.Config, name: str) -> Any:
    """CLI value first, ini value second."""
    value = config.getoption(f"--llmperf-{name}")
    return value if value is not None else config.getini(f"llmperf_{name.replace('-', '_')}")


def parse_engine_config(text: str, option: str = "engine-config") -> dict[str, Any]:
    """`--llmperf-engine-config` (and `--llmperf-server-config`) take a JSON object:
    '{"block_size": 32, "max_num_seqs": 64}'."""
    if not text:
        return {}
    name = f"--llmperf-{option}/llmperf_{option.replace('-', '_')}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise pytest.UsageError(f"{name} is not JSON ({e}): write e.g. '{{\"max_num_seqs\": 64}}'") from None
    if not isinstance(value, dict):
        raise pytest.UsageError(f"{name} must be a JSON object of engine options, e.g. '{{\"max_num_seqs\": 64}}'")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference performance assertions")
    # no `choices`: engines are registered (engines/registry.py), checked when the session starts
    group.addoption("--llmperf-engine", default=None,
                    help="engine behind llm_engine: hf, vllm, openai or one a package registers "
                         "(default: vllm when installed, else hf)")
    group.addoption("--llmperf-base-url", default=None,
                    help="openai engine: the server, e.g. http://127.0.0.1:8000/v1")
    group.addoption("--llmperf-served-model", default=None,
                    help="openai engine: the model name at the server (default: the first it serves)")
    group.addoption("--llmperf-api-key-env", default=None,
                    help="openai engine: environment variable holding the API key (default OPENAI_API_KEY)")
    group.addoption("--llmperf-server-config", default=None,
                    help="vllm_server fixture: options for `vllm serve` as a JSON object")
    parser.addini("llmperf_base_url", "openai engine: server URL", default="")
    parser.addini("llmperf_served_model", "openai engine: model name at the server", default="")
    parser.addini("llmperf_api_key_env", "openai engine: API key variable", default="")
    parser.addini("llmperf_server_config", "vllm_server: vllm serve options (JSON object)", default="")
    group.addoption("--llmperf-model", default=None,
                    help=f"model folder, hub id or shape:NAME with random weights (default {DEFAULT_MODEL})")
    group.addoption("--llmperf-engine-config", default=None,
                    help="options of the --llmperf-engine engine as a JSON object, under any @pytest.mark.llmperf_engine(...)")
    group.addoption("--llmperf-hardware", default=None,
                    help="judge this machine as hardware class CLASS (default: detected; cpu without GPU): tests that "
                         "name no class are marked with it (-m CLASS selects them), tests marked for another class "
                         "are skipped, and baselines and per-hardware limits of CLASS apply")
    group.addoption("--llmperf-baseline", default=None, choices=gating.MODES,
                    help="compare with stored baselines (default; a test without one passes, reported), require "
                         "(as compare, and a missing, stale or other engine's baseline fails the test: the "
                         "pull-request gate), update them from this run, or off")
    group.addoption("--llmperf-baseline-dir", default=None, help="baseline folder (default: <rootdir>/baselines)")
    group.addoption("--llmperf-paging", default=None, choices=PAGING_MODES,
                    help="a deterministic result whose paging timeline differs from its baseline step by step: "
                         "fails (strict, default) or is reported while only the paging summaries gate (summary)")
    parser.addini("llmperf_paging", "paging timeline against the baseline: strict or summary", default="strict")
    group.addoption("--llmperf-tolerance", default=None,
                    help="relative tolerance of timing metrics against a baseline, and per metric if given: "
                         "0.10 (default), or 0.10,output_tokens_per_s=0.05 (a test's llmperf_tolerance marker wins)")
    group.addoption("--llmperf-retries", default=None, type=int,
                    help="measure a result that violates a limit or regresses on timing metrics against its "
                         "baseline, or a failing property-test example, this many more times before it counts; "
                         "baselines are recorded as the best of 1 + N passes (default 2)")
    parser.addini("llmperf_retries", "re-measurements of a violated limit, a timing regression or a failing "
                  "property example", default="2")
    group.addoption("--llmperf-warmup", default=None, choices=WARMUP_MODES,
                    help="what llmperf.run's warm-up does: a few requests (quick), then whole passes until two agree "
                         "on throughput (steady), or auto: steady on a GPU, quick elsewhere (default)")
    parser.addini("llmperf_warmup", "warm-up: auto, quick or steady", default="auto")
    group.addoption("--llmperf-gpus-per-worker", default=None, metavar="N",
                    help="GPUs each pytest-xdist worker (or this session) takes: default, the most any collected "
                         "test's engine spreads over (tensor_parallel_size x pipeline_parallel_size)")
    parser.addini("llmperf_gpus_per_worker", "GPUs per worker (default: what the tests' engines ask for)", default="")
    group.addoption("--llmperf-soak", default=1, type=int, metavar="N",
                    help="run the selected tests N times back to back, round by round, and fail if host or GPU "
                         "memory keeps growing between the last two rounds")
    group.addoption("--llmperf-soak-limit-mib", default=soak.DEFAULT_LIMIT_MIB, type=float, metavar="MIB",
                    help=f"allowed memory growth between the last two soak rounds (default {soak.DEFAULT_LIMIT_MIB:g})")
    group.addoption("--llmperf-report", default=None, metavar="DIR",
                    help="write results.json and summary.md there (and append the summary to $GITHUB_STEP_SUMMARY)")
    parser.addini("llmperf_report", "report folder", default="")
    parser.addini("llmperf_baseline", "baseline mode: compare, require, update or off", default="compare")
    parser.addini("llmperf_baseline_dir", "baseline folder", default="baselines")
    parser.addini("llmperf_tolerance", "relative tolerance of timing metrics, and per metric: 0.10,output_tokens_per_s=0.05",
                  default="0.10")
    parser.addini("llmperf_engine", "default engine (hf, vllm or openai)", default="")
    parser.addini("llmperf_model", "default model", default=DEFAULT_MODEL)
    parser.addini("llmperf_engine_config", "default engine options (JSON object)", default="")
    parser.addini("llmperf_hardware", "hardware class override", default="")


def pytest_configure(config: pytest.Config) -> None:
    hardware = _option(config, "hardware") or machine_class()
    for line in markers.catalogue(hardware):
        config.addinivalue_line("markers", line)
    model_spec = _option(config, "model") or DEFAULT_MODEL
    mode = _option(config, "baseline") or "compare"
    if mode not in gating.MODES:
        raise pytest.UsageError(f"llmperf_baseline={mode!r}: choose one of {', '.join(gating.MODES)}")
    root = Path(_option(config, "baseline-dir") or "baselines")
    paging = _option(config, "paging") or "strict"
    if paging not in PAGING_MODES:
        raise pytest.UsageError(f"llmperf_paging={paging!r}: choose one of {', '.join(PAGING_MODES)}")
    try:
        tolerance, tolerances = parse_tolerance(_option(config, "tolerance"))
    except ValueError as e:
        raise pytest.UsageError(f"--llmperf-tolerance/llmperf_tolerance: {e}") from None
    given = _option(config, "retries")
    try:
        retries = int(given)
    except (TypeError, ValueError):
        retries = -1
    if retries < 0:
        raise pytest.UsageError(f"--llmperf-retries/llmperf_retries={given!r}: give the number of extra measurements, "
                                "0 or more (e.g. 2)")
    _gpus_option(config)  # a bad value is a usage error now, not when the first test claims its GPUs
    engines = registry.discover()
    engine_name = _option(config, "engine") or default_engine()
    if engine_name not in engines:
        raise pytest.UsageError(f"llmperf_engine={engine_name!r}: choose one of {', '.join(sorted(engines))}, or install "
                                f"a package that registers it under the entry-point group {registry.GROUP!r}")
    # `<name>_engine` and `<name>_engine_factory` for every registered engine, the built-in ones too
    config.pluginmanager.register(engine_fixtures(engines), "llmperf-engine-fixtures")
    config.stash[SESSION] = Session(
        engine_name=engine_name,
        model_spec=model_spec,
        engine_defaults=parse_engine_config(_option(config, "engine-config")),
        hardware=hardware,
        gpu=None,  # claimed by _activate, once the session uses the plugin
        gate=gating.GateConfig(mode, root if root.is_absolute() else config.rootpath / root,
                               tolerance, hardware, stored_name(model_spec), retries, tolerances,
                               _update_args(config, model_spec),
                               paging),
        report_dir=_report_dir(_option(config, "report")),
        pool=EnginePool(engines=engines),
        engines=engines,
        retries=retries,
        warmup=_warmup_option(config),
        openai_defaults={k: v for k, v in (("base_url", _option(config, "base-url")),
                                            ("model", _option(config, "served-model")),
                                            ("api_key_env", _option(config, "api-key-env"))) if v},
        server_options=parse_engine_config(_option(config, "server-config"), "server-config"),
    )
    config.pluginmanager.register(RecordCollector(config.stash[SESSION]), "llmperf-records")
    rounds = config.getoption("--llmperf-soak")
    if rounds < 1:
        raise pytest.UsageError(f"--llmperf-soak={rounds}: give the number of rounds, 2 or more (1 is a plain run)")
    limit_mib = config.getoption("--llmperf-soak-limit-mib")
    if not math.isfinite(limit_mib) or limit_mib <= 0:
        raise pytest.UsageError(f"--llmperf-soak-limit-mib={limit_mib}: give the memory growth allowed between "
                                "rounds in MiB, a number above 0 (e.g. 256)")
    if rounds > 1:
        soak.host_memory_mib()  # psutil missing: a usage error now, not at every test's setup
        _activate(config)
        gpu_index = config.stash[SESSION].gpu.index if config.stash[SESSION].gpu else None
        config.pluginmanager.register(soak.Soak(rounds, limit_mib, gpu_index),
                                      "llmperf-soak")


def _report_dir(given: str | None) -> Path | None:
    """The report folder, checked at start: a session must not measure for an hour and then find that
    its report cannot be written."""
    if not given:
        return None
    folder = Path(given)
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise pytest.UsageError(f"--llmperf-report/llmperf_report={given!r}: {existing} is a file, not a folder; "
                                "give a folder to write results.json and summary.md into")
    if not os.access(existing, os.W_OK):
        raise pytest.UsageError(f"--llmperf-report/llmperf_report={given!r}: {existing} is not writable; give a "
                                "folder this user can write")
    return folder


_ACTIVE = pytest.StashKey[bool]()


def _activate(config: pytest.Config, items: Sequence[pytest.Item] = ()) -> None:
    """What the plugin does to the process, done once and only in a session that uses it (a test with
    an llmperf fixture, or --llmperf-soak): claim this worker's GPU (CUDA_VISIBLE_DEVICES under
    pytest-xdist), wait for its memory after each engine stops, and stop engines on SIGTERM. A project
    that never uses the plugin keeps its environment, its signal handlers and its -n."""
    if config.stash.get(_ACTIVE, False):
        return
    config.stash[_ACTIVE] = True
    state = config.stash[SESSION]
    try:
        state.gpus = claim_gpus(_gpus_per_worker(config, items))
        state.gpu = state.gpus[0] if state.gpus else None
    except GpuError as e:  # each test that uses the plugin fails with it; the worker's other tests run
        config.stash[_CLAIM_ERROR] = str(e)
        return
    state.pool.after_close = release_waiter(state.gpus)
    _stop_engines_on_sigterm(config)


_CLAIM_ERROR = pytest.StashKey[str]()


def _update_args(config: pytest.Config, model_spec: str) -> str:
    """The options a command that records this session's baselines must repeat (not the defaults)."""
    given = {"model": model_spec if model_spec != DEFAULT_MODEL else None,
             "engine": _option(config, "engine") or None, "hardware": _option(config, "hardware") or None}
    return " ".join(f"--llmperf-{name}={shlex.quote(value)}" for name, value in given.items() if value)


_SIGTERM_HANDLER = pytest.StashKey[Callable[[int, Any], None]]()


def _stop_engines_on_sigterm(config: pytest.Config) -> None:
    """SIGTERM (`timeout`, `kill`, a CI runner cancelling the job) ends pytest as Ctrl-C does, through
    its teardown, so every engine is stopped: by default Python dies at once and vLLM's engine-core
    processes, and the GPU memory they hold, outlive the session. A second SIGTERM kills at once. Left
    alone where someone else already handles SIGTERM, and outside the main thread (no signals there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        pytest.exit("llmperf: terminated by SIGTERM; engines stopped before exit", returncode=128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    config.stash[_SIGTERM_HANDLER] = on_sigterm


def pytest_unconfigure(config: pytest.Config) -> None:
    ours = config.stash.get(_SIGTERM_HANDLER, None)
    if ours is not None and signal.getsignal(signal.SIGTERM) is ours:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _warmup_option(config: pytest.Config) -> str:
    mode = _option(config, "warmup")
    if mode not in WARMUP_MODES:
        raise pytest.UsageError(f"llmperf_warmup={mode!r}: choose one of {', '.join(WARMUP_MODES)}")
    return mode


def _gpus_option(config: pytest.Config) -> int | None:
    given = _option(config, "gpus-per-worker")
    if given in (None, ""):
        return None
    if not str(given).isdigit() or int(given) < 1:
        raise pytest.UsageError(f"--llmperf-gpus-per-worker/llmperf_gpus_per_worker={given!r}: give a number of "
                                "GPUs, 1 or more (e.g. 2 for tensor_parallel_size=2)")
    return int(given)


def _gpus_per_worker(config: pytest.Config, items: Sequence[pytest.Item]) -> int:
    """What each worker claims: the option, else the most GPUs any engine of the session asks for. Every
    xdist worker collects the whole selection, so all workers size their sets alike."""
    given = _gpus_option(config)
    if given is not None:
        return given
    asked = max([_gpus_asked(config, {}), *(_gpus_asked(config, item) for item in items if _uses_plugin(item))])
    # a test whose engine is larger than this machine fails at its own setup (`_check_gpus`), not the session
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, min(asked, visible_count() // workers))


def _gpus_asked(config: pytest.Config, item: pytest.Item | dict[str, Any]) -> int:
    try:
        options = engine_options(item) if isinstance(item, pytest.Item) else item
    except MarkerError:  # reported at that test's setup
        return 1
    return gpus_of({**config.stash[SESSION].engine_defaults, **options})


def _check_gpus(item: pytest.Item) -> None:
    state = item.config.stash[SESSION]
    need = _gpus_asked(item.config, item)
    if state.gpus and need > len(state.gpus):
        raise MarkerError(f"its engine spreads over {need} GPUs (tensor x pipeline parallel) and this worker has "
                          f"{len(state.gpus)}: run with fewer pytest-xdist workers (-n), "
                          f"--llmperf-gpus-per-worker={need}, or on a machine with more GPUs")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the hardware marker must be there to be selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(_uses_plugin(item) for item in items):
        _activate(config, items)
    config.stash[_CARRIED] = _mark_hardware(items, config.stash[SESSION].hardware)
    # Tests that share an engine configuration run together, so each engine starts once (per soak round).
    items.sort(key=lambda item: (soak.round_of(item), _engine_group(item)))
    properties.apply_profile([i for i in items if _uses_plugin(i)], config)


_CARRIED = pytest.StashKey[dict[str, int]]()


def _mark_hardware(items: list[pytest.Item], hardware: str) -> dict[str, int]:
    """A test that uses the plugin and names no hardware class runs on any: it gets this machine's
    class as a marker, so that `-m a100` on an A100 runner selects it. Tests that do not use the
    plugin are left as they are. Returns how many tests carry each class."""
    carried: dict[str, int] = {}
    for item in items:
        wanted = [m.name for m in item.iter_markers() if m.name in KNOWN_CLASSES]
        if not wanted and _uses_plugin(item):
            item.add_marker(hardware)
            wanted = [hardware]
        for cls in dict.fromkeys(wanted):
            carried[cls] = carried.get(cls, 0) + 1
    return carried


def _uses_plugin(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))
    engines = item.config.stash[SESSION].engines
    return bool(fixtures & (properties.PLUGIN_FIXTURES | registry.fixture_names(engines))) or any(
        markers.is_plugin_marker(m.name) for m in item.iter_markers())


def pytest_report_header(config: pytest.Config) -> str | None:
    """What this session will measure and judge against, before any engine starts: an empty or foreign
    baseline store is visible at once, not after an hour of GPU time. Silent in a project that shows no
    sign of using the plugin (no baseline folder, no llmperf option or ini value)."""
    state = config.stash[SESSION]
    gate = state.gate
    if not (gate.root.is_dir() or _asked(config)):
        return None
    folder = gate.root / slug(gate.hardware) / slug(gate.model)
    stored = len(list(folder.glob("*.json"))) if folder.is_dir() else 0
    where = folder.relative_to(config.rootpath) if folder.is_relative_to(config.rootpath) else folder
    others = sorted(p.name for p in gate.root.iterdir() if p.is_dir()) if gate.root.is_dir() else []
    elsewhere = f" (classes stored: {', '.join(others)})" if not stored and others else ""
    return (f"llmperf: engine {state.engine_name}, model {state.model_spec}, hardware {state.hardware}, "
            f"baseline {gate.mode}: {stored} stored in {where}/{elsewhere}")


def _asked(config: pytest.Config) -> bool:
    """An --llmperf option on the command line, or llmperf settings in the project's configuration file."""
    if any(str(a).startswith("--llmperf") for a in config.invocation_params.args):
        return True
    try:
        return config.inipath is not None and "llmperf" in config.inipath.read_text()
    except OSError:
        return False


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    """One line when a hardware `-m` selected nothing: which classes the tests carry, which this machine is."""
    expr = config.getoption("markexpr", "") or ""
    named = [cls for cls in KNOWN_CLASSES if cls in expr.replace("(", " ").replace(")", " ").split()]
    carried = config.stash.get(_CARRIED, {})
    if items or not named or not carried:
        return None
    state = config.stash[SESSION]
    found = ", ".join(f"{cls} ({n})" for cls, n in sorted(carried.items()))
    return (f"llmperf: -m {expr!r} selected no test: this machine is {state.hardware} (tests that name no hardware "
            f"carry it), and the tests carry {found}; select with -m {state.hardware}, or judge this machine as "
            f"another class with --llmperf-hardware {named[0]}")


def _engine_group(item: pytest.Item) -> str:
    try:
        return repr(sorted(engine_options(item).items()))
    except MarkerError:
        return ""  # reported at setup, with the test's name


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(SESSION, None)
    if state is not None:
        state.pool.close()
        if session.config.stash.get(_ACTIVE, False):  # a session that never used the plugin keeps its output
            _show_engine_output(session.config)


def _show_engine_output(config: pytest.Config) -> None:
    """What the engines logged while they stopped sits in pytest's global capture, which pytest prints
    at exit, after its summary, where vLLM's routine shutdown lines read as errors. Show it now, before
    the summary, without the routine `[shutdown]` lines."""
    capman = config.pluginmanager.getplugin("capturemanager")
    terminal = config.pluginmanager.getplugin("terminalreporter")
    if capman is None or terminal is None or not capman.is_globally_capturing():
        return
    try:
        out, err = capman.read_global_capture()
    except AssertionError:  # pytest.exit (Ctrl-C, SIGTERM) has already stopped the capture
        return
    for line in (out + err).splitlines():
        if line.strip() and "[shutdown]" not in line:
            terminal.write_line(line)


# -- judging ---------------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)  # before fixtures: no engine starts for a test with a bad marker
def pytest_runtest_setup(item: pytest.Item) -> None:
    _skip_other_hardware(item)
    claim_error = item.config.stash.get(_CLAIM_ERROR, None)
    if claim_error and _uses_plugin(item):
        pytest.fail(f"llmperf: {claim_error}", pytrace=False)
    _check_server(item)
    try:
        item.stash[LIMITS] = _limits(item)
        engine_options(item)  # a malformed engine marker errors here, before anything starts
        _check_gpus(item)
        _check_baseline_file(item)
    except (MarkerError, gating.BaselineError) as e:
        problem = str(e)
    else:
        return
    pytest.fail(f"llmperf: {item.nodeid}: {problem}", pytrace=False)


def _check_baseline_file(item: pytest.Item) -> None:
    """A corrupt baseline file, or a tolerance marker naming no metric, errors the test before any
    engine starts, not after it measured for minutes."""
    gate = item.config.stash[SESSION].gate
    if gate.mode in ("off", "update") or not _uses_plugin(item):
        return
    gating.tolerances([m.kwargs for m in item.iter_markers(markers.TOLERANCE)])
    load_baseline(path_for(gate.root, item.nodeid, gate.hardware, gate.model))


def _check_server(item: pytest.Item) -> None:
    """A `vllm serve` of the vllm_server fixture that died since the last test (killed, crashed) fails
    the next test that needs it at once, with its exit code and log, and is restarted for the test
    after; a death that already failed the test it happened in restarts it silently."""
    state = item.config.stash[SESSION]
    server = state.server
    if server is None or "vllm_server" not in getattr(item, "fixturenames", ()):
        return
    reason = server.down_reason()
    if reason is None:
        return
    if server.pid in state.server_deaths_reported:
        server.restart()
        return
    state.server_deaths_reported.add(server.pid)
    pytest.fail(f"llmperf: vllm serve (pid {server.pid}) {reason} since the previous test; it is restarted for the "
                f"next test. Its log ({server.log_path}) ends:\n{server.log_tail(15)}", pytrace=False)


def _skip_other_hardware(item: pytest.Item) -> None:
    wanted = [m.name for m in item.iter_markers() if m.name in KNOWN_CLASSES]
    state = item.config.stash[SESSION]
    if wanted and state.hardware not in wanted:
        found = f"{state.hardware} ({state.gpu.name})" if state.gpu else state.hardware
        pytest.skip(f"needs {' or '.join(wanted)} hardware; this machine is {found} (override with --llmperf-hardware)")


def _limits(item: pytest.Item) -> list[Limit]:
    hardware = item.config.stash[SESSION].hardware
    return [
        limit
        for mark in item.iter_markers()
        if mark.name in assertions.MARKERS
        for limit in assertions.parse(mark.name, mark.args, mark.kwargs, hardware)
    ]


def _judge(item: pytest.Item) -> tuple[str, bool] | None:
    """(failure text, is a performance violation) for this test's results; None when all limits hold."""
    limits = item.stash.get(LIMITS, [])
    perf = item.stash.get(PERF, None)
    sweeps = perf.sweeps if perf is not None else []
    in_sweeps = perf.sweep_labels if perf is not None else set()
    # sweep points are judged as a curve (min_capacity), not one by one: overload is their purpose
    results = [r for r in perf.results if r.label not in in_sweeps] if perf is not None else []
    curve_limits = [lim for lim in limits if lim.on_sweeps or (sweeps and lim.metric == "output_tokens_per_s_per_gib")]
    point_limits = [lim for lim in limits if lim not in curve_limits]
    if limits and not results and not sweeps:
        names = sorted({lim.marker.split("(")[0] for lim in limits})
        return (f"llmperf: {item.nodeid} has limit markers ({', '.join(names)}) but recorded no result: "
                "call llmperf.run(engine, workload) in the test body", False)
    if not results and not sweeps:
        return None
    if point_limits and not results:
        names = sorted({lim.marker.split("(")[0] for lim in point_limits})
        return (f"llmperf: {item.nodeid}: {', '.join(names)} judge llmperf.run results, and this test recorded only "
                "sweeps; judge a curve with @pytest.mark.min_capacity(..., under={...})", False)
    if results:
        point_limits = assertions.with_default_error_limit(point_limits)
    try:
        violations = assertions.check(point_limits if results else [], results)
        violations, notes = remeasure.limits_measured_again(perf, point_limits, violations, item.config.stash[SESSION].retries)
        violations += assertions.check_sweeps(curve_limits, sweeps)
    except MarkerError as e:
        return f"llmperf: {item.nodeid}: {e}", False
    notes += assertions.sample_notes(point_limits, results)
    if not violations:
        if notes:
            _note(item, "llmperf limits", "\n".join(notes))
        return None
    text = "\n".join([assertions.format_violations(violations), *(f"  {n}" for n in notes)])
    errors = [e for r in results for e in r.errors][:5]
    if errors:
        text += "\n  failed requests: " + "; ".join(errors)
    return text, True


_NOTES = pytest.StashKey[list[tuple[str, str]]]()


def _note(item: pytest.Item, title: str, text: str) -> None:
    """A section of this test's call report. The report exists by the time the plugin judges it, so
    `item.add_report_section` would reach only the teardown report."""
    item.stash.setdefault(_NOTES, []).append((title, text))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if call.when != "call":
        return report
    try:
        _judge_report(item, report)
    except Exception as e:  # an input no check foresaw, or a fault of the plugin: this test fails, the session goes on
        report.outcome = "failed"
        report.longrepr = (f"llmperf: {item.nodeid}: could not judge this test ({type(e).__name__}: {e}); the other "
                           "tests of the session are judged as usual")
    return report


def _judge_report(item: pytest.Item, report: pytest.TestReport) -> None:
    """Limits, then the baseline, of a test whose body passed; its record and plots for the reports."""
    perf = item.stash.get(PERF, None)
    if perf is not None:
        _record(item, perf)
    server = getattr(item, "funcargs", {}).get("vllm_server")
    verdict = None
    if report.passed and not properties.is_property_test(item):  # property tests judge every example inline
        invalid = _invalid(item, perf)
        judged = (invalid, False) if invalid else _judge(item)
        if judged is None and perf is not None and perf.results:
            judged, verdict = _gate(item, perf)
        if judged is not None:
            report.outcome = "failed"
            report.longrepr, report.llmperf_failed = judged
            report.llmperf_invalid = bool(invalid)
    if server is not None and report.failed:
        report.sections.append(("vllm serve log (last lines)", server.log_tail()))
        if server.down_reason() is not None:  # it died during this test, which says so: the next test gets a fresh one
            item.config.stash[SESSION].server_deaths_reported.add(server.pid)
    if perf is not None and perf.results:
        state = item.config.stash[SESSION]
        record = _test_record(item.nodeid, perf, report, verdict, state)
        record.limits = assertions.margins(item.stash.get(LIMITS, []),
                                           [r for r in perf.results if r.label not in perf.sweep_labels])
        if state.report_dir is not None:
            record.plots = _plots(item, perf, state.report_dir, verdict)
        # travels with the report, so that under pytest-xdist the controller sees every worker's results
        report.llmperf_record = asdict(record)
        pytest_benchmark_bridge.add(item, perf)
    report.sections.extend(item.stash.get(_NOTES, []))


def _invalid(item: pytest.Item, perf: LLMPerf | None) -> str:
    """Why this test's results are not a valid measurement (validity.py); "" when they are. An invalid
    result is neither judged against limits nor compared with or written to a baseline."""
    bad = [(r.label or str(i), r.invalid) for i, r in enumerate(perf.results if perf else []) if r.invalid]
    if not bad:
        return ""
    return (f"llmperf: {item.nodeid}: not a valid measurement (neither judged nor gated, no baseline written):\n"
            + "\n".join(f"  result {label!r}: {why}" for label, why in bad))


def _gate(item: pytest.Item, perf: LLMPerf) -> tuple[tuple[str, bool] | None, gating.Verdict | None]:
    """Baseline comparison (or update) of a test whose limits held."""
    state = item.config.stash[SESSION]
    try:
        tol = gating.tolerances([m.kwargs for m in reversed(list(item.iter_markers(markers.TOLERANCE)))])
        env = gating.environment(perf, state.hardware, state.gpu)
        verdict = gating.gate(item.nodeid, perf, state.gate, env, tol)
    except gating.BaselineError as e:
        return (f"llmperf: {item.nodeid}: {e}", False), None
    if verdict is not None and verdict.status == "regression":
        return (gating.failure_text(verdict, env), True), verdict
    unmet = gating.unmet_requirement(verdict, state.gate, item.nodeid)
    if unmet is not None:
        return (unmet, False), verdict
    if verdict is not None and verdict.message:
        _note(item, "llmperf baseline", verdict.message)
    return None, verdict


def _record(item: pytest.Item, perf: LLMPerf) -> None:
    """Headline metrics into JUnit XML properties (junitxml reads them from the teardown report,
    which copies the item's list)."""
    for i, result in enumerate(perf.results):
        prefix = f"llmperf.{result.label or i}."
        for key, _ in HEADLINE:
            value = result.flat().get(key)
            if value is not None:
                item.user_properties.append((prefix + key, round(value, 4)))


def _plots(item: pytest.Item, perf: LLMPerf, report_dir: Path, verdict: gating.Verdict | None) -> list[str]:
    from . import plots  # matplotlib only when pictures are asked for

    try:
        written = plots.for_test(slug(item.nodeid), perf.results, perf.sweeps, report_dir / "plots")
        for label, (old, new) in (verdict.timelines if verdict is not None else {}).items():
            a, b = Timeline.from_dict(old), Timeline.from_dict(new)
            written.append(plots.timelines_overlaid(label, a, b, report_dir / "plots" / f"{slug(item.nodeid)}-{label}"
                                                    "-paging-timeline.png", divergence_step(a, b)))
    except Exception as e:  # noqa: BLE001 - a picture that cannot be drawn must not fail a measured test
        _note(item, "llmperf plots", f"plots not drawn: {type(e).__name__}: {e}")
        return []
    return [str(p.relative_to(report_dir)) for p in written]


def _test_record(nodeid: str, perf: LLMPerf, report: pytest.TestReport, verdict: gating.Verdict | None,
                 state: Session) -> TestRecord:
    results = [
        result_record(gating.result_entry(result, workload, engine, i), result.to_dict(), workload.to_dict())
        for i, (result, workload, engine) in enumerate(zip(perf.results, perf.workloads, perf.engines))
    ]
    rows = [{**asdict(r), "change": r.change} for r in verdict.rows] if verdict is not None else []
    outcome = "invalid" if getattr(report, "llmperf_invalid", False) else report.outcome
    return TestRecord(nodeid, outcome, verdict.status if verdict is not None else "-", rows,
                      dict(verdict.uncompared) if verdict is not None else {}, results,
                      gating.environment(perf, state.hardware, state.gpu), [s.summary() for s in perf.sweeps])


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, Any] | None:
    if report.when == "call" and getattr(report, "llmperf_invalid", False):
        return "failed", "I", ("PERF-INVALID", {"yellow": True})
    if report.when == "call" and getattr(report, "llmperf_failed", False):
        return "failed", "P", ("PERF-FAILED", {"red": True})
    return None


class RecordCollector:
    """Collects test records from reports where they are logged: in the test process, or under
    pytest-xdist in the controller, which receives every worker's reports."""

    def __init__(self, state: Session) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, "llmperf_record", None)
        if record is not None and report.when == "call":
            self.state.records.append(TestRecord(**record))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(SESSION, None)
    if state is None or not state.records:
        return
    tr = terminalreporter
    tr.section("llmperf")
    for line in terminal_lines(state.records):
        tr.write_line(line)
    tr.write_line(f"engines started: {state.pool.starts}; hardware class: {state.hardware}; model: {state.model_spec}")
    tr.write_line(state.pool.times.line(state.pool.starts))
    if state.report_dir is not None and not hasattr(config, "workerinput"):  # xdist: the controller writes
        try:
            paths = write_report(state.report_dir, state.records, state.describe())
        except OSError as e:  # the folder went away or filled up since the start: say so, keep pytest's summary
            tr.write_line(f"llmperf report: not written to {state.report_dir} ({e})", red=True)
        else:
            tr.write_line("llmperf report: " + ", ".join(str(p) for p in paths))

