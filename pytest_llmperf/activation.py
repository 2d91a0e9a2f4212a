"""What the plugin does to the process, done once and only in a session that uses it (a test with an
llmperf fixture, or --llmperf-soak): claim this worker's GPUs (CUDA_VISIBLE_DEVICES under
pytest-xdist), wait for their memory after each engine stops, and stop every engine on SIGTERM. A
project that never uses the plugin keeps its environment, its signal handlers and its -n."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from . import options, soak
from .assertions import MarkerError
from .engines.base import gpus_of
from .gpu import GpuError, beside_checker, release_waiter, visible_count
from .gpu import claim as claim_gpus
from .selection import uses_plugin
from .session import SESSION, engine_options

_ACTIVE = pytest.StashKey[bool]()
_CLAIM_ERROR = pytest.StashKey[str]()
_SIGTERM_HANDLER = pytest.StashKey[Callable[[int, Any], None]]()
_TERMINATED = pytest.StashKey[bool]()
_ENVIRONMENT = pytest.StashKey[dict[str, str | None]]()  # what the claim may change, as it was before
CLAIM_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")  # gpu.claim sets both under pytest-xdist
TERMINATED = "llmperf: terminated by SIGTERM; engines stopped before exit"


def in_use(config: pytest.Config, items: Sequence[pytest.Item]) -> bool:
    """Whether the session uses the plugin: a test that does, or --llmperf-soak (every test then runs in rounds)."""
    return config.pluginmanager.has_plugin(soak.PLUGIN_NAME) or any(uses_plugin(item) for item in items)


def activate(config: pytest.Config, items: Sequence[pytest.Item] = ()) -> None:
    if config.stash.get(_ACTIVE, False):
        return
    config.stash[_ACTIVE] = True
    config.stash[_ENVIRONMENT] = {k: os.environ.get(k) for k in CLAIM_ENV}
    state = config.stash[SESSION]
    try:
        state.gpus = claim_gpus(_gpus_per_worker(config, items))
        state.gpu = state.gpus[0] if state.gpus else None
    except GpuError as e:  # each test that uses the plugin fails with it; the worker's other tests run
        config.stash[_CLAIM_ERROR] = str(e)
        return
    state.pool.after_close = release_waiter(state.gpus)
    state.pool.check_beside = beside_checker(state.gpus)
    state.pool.stop_in_background = not state.gpus  # no device memory for the next engine to wait for
    _stop_engines_on_sigterm(config)


def undo(config: pytest.Config) -> None:
    """Activation taken back, before any test ran: the tests that used the plugin were all deselected (`-k`,
    `-m`), and the ones left keep the environment and signal handling they would have had without it."""
    if not is_active(config):
        return
    for key, value in config.stash[_ENVIRONMENT].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    deactivate(config)
    state = config.stash[SESSION]
    state.gpus, state.gpu = (), None
    state.pool.after_close = state.pool.check_beside = None
    state.pool.stop_in_background = False
    config.stash[_ACTIVE] = False
    if _CLAIM_ERROR in config.stash:
        del config.stash[_CLAIM_ERROR]


def is_active(config: pytest.Config) -> bool:
    return config.stash.get(_ACTIVE, False)


def claim_error(config: pytest.Config) -> str | None:
    """Why this worker could not claim its GPUs (every test that uses the plugin fails with it)."""
    return config.stash.get(_CLAIM_ERROR, None)


def check_gpus(item: pytest.Item) -> None:
    """A test whose engine spreads over more GPUs than this worker holds fails at its setup."""
    state = item.config.stash[SESSION]
    need = _gpus_asked(item.config, item)
    if state.gpus and need > len(state.gpus):
        raise MarkerError(f"its engine spreads over {need} GPUs (tensor x pipeline parallel) and this worker has "
                          f"{len(state.gpus)}: run with fewer pytest-xdist workers (-n), "
                          f"--llmperf-gpus-per-worker={need}, or on a machine with more GPUs")


def summarize_if_terminated(config: pytest.Config, exitstatus: int) -> None:
    """A session that SIGTERM ended through the plugin's handler (`timeout`, a CI job's time limit) still
    reports what it judged: pytest prints no summary for exit status 143, which would lose every failure
    text and the llmperf summary and report of the tests that finished before the signal."""
    if not was_terminated(config):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or reporter.no_summary or hasattr(config, "workerinput"):
        return
    config.hook.pytest_terminal_summary(terminalreporter=reporter, exitstatus=exitstatus, config=config)


def was_terminated(config: pytest.Config) -> bool:
    return config.stash.get(_TERMINATED, False)


def exit_if_terminated(session: pytest.Session) -> None:
    """End a session that SIGTERM ended and code then kept going. The handler's `pytest.exit` raises an
    `Exception`, so code that catches `Exception` where the signal lands (a request counted as failed, a
    picture that could not be drawn, a test's own `try`) swallows it, and the session went on starting the
    next tests' engines after its job was cancelled. Called at each test's boundaries, before its fixtures.
    A pytest-xdist worker stops as its loop asks (`shouldstop`): an exit there between a test's report and
    the message that it ended broke the controller (INTERNALERROR)."""
    if not was_terminated(session.config):
        return
    if hasattr(session.config, "workerinput"):
        session.shouldstop = TERMINATED
    else:
        _exit_terminated()


def _exit_terminated() -> None:
    pytest.exit(TERMINATED, returncode=128 + signal.SIGTERM)


def deactivate(config: pytest.Config) -> None:
    ours = config.stash.get(_SIGTERM_HANDLER, None)
    if ours is not None and signal.getsignal(signal.SIGTERM) is ours:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def show_engine_output(config: pytest.Config) -> None:
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


def _gpus_per_worker(config: pytest.Config, items: Sequence[pytest.Item]) -> int:
    """What each worker claims: the option, else the most GPUs any engine of the session asks for. Every
    xdist worker collects the whole selection, so all workers size their sets alike."""
    given = options.gpus_per_worker(config)
    if given is not None:
        return given
    asked = max([_gpus_asked(config, {}), *(_gpus_asked(config, item) for item in items if uses_plugin(item))])
    # a test whose engine is larger than this machine fails at its own setup (`check_gpus`), not the session
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, min(asked, visible_count() // workers))


def _gpus_asked(config: pytest.Config, item: pytest.Item | dict[str, Any]) -> int:
    try:
        asked = engine_options(item) if isinstance(item, pytest.Item) else item
    except MarkerError:  # reported at that test's setup
        return 1
    return gpus_of({**config.stash[SESSION].engine_defaults, **asked})


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
        config.stash[_TERMINATED] = True
        config.stash[SESSION].pool.refuse_starts(TERMINATED)  # wherever the exit below is swallowed
        _exit_terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    config.stash[_SIGTERM_HANDLER] = on_sigterm
