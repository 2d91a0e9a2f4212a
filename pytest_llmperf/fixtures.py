"""The plugin's fixtures: the session, the GPU, `llmperf`, engines by name or from the command line,
engine factories, and a `vllm serve` for the session. Engines come from the session's pool, which
shares one engine per configuration and holds at most one at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import pytest

from . import engine_limits, properties
from .baseline import gates_timing
from .engines.base import Engine, EngineOptionError
from .gpu import GpuInfo
from .runner import LLMPerf
from .session import LIMITS, PERF, SESSION, Session, engine_options, gate_option, model_option


@pytest.fixture(scope="session")
def llmperf_session(pytestconfig: pytest.Config) -> Session:
    return pytestconfig.stash[SESSION]


@pytest.fixture(scope="session", name="gpu")
def gpu_fixture(llmperf_session: Session) -> GpuInfo | None:
    """The GPU this worker uses (name, hardware_class, memory, driver, CUDA, compute capability), or None."""
    return llmperf_session.gpu


@pytest.fixture
def llmperf(request: pytest.FixtureRequest, llmperf_session: Session) -> LLMPerf:
    """Runs workloads (`llmperf.run(engine, workload, repeats=1, warmup=True)`) and binds the
    results to this test, where the limit markers judge them."""
    gpu_index = llmperf_session.gpu.index if llmperf_session.gpu else None
    perf = LLMPerf(test_id=request.node.nodeid, on_broken=llmperf_session.pool.discard, revive=llmperf_session.pool.live,
                   restart=llmperf_session.pool.restart, beside=llmperf_session.pool.beside,
                   gpu_index=gpu_index, gpu_indices=tuple(g.index for g in llmperf_session.gpus),
                   times=llmperf_session.pool.times, roofline_of=llmperf_session.roofline,
                   warmup_mode=llmperf_session.warmup, steady_engines=llmperf_session.steady_engines)
    perf.timing_gated = gates_timing(gate_option(request.node))
    perf.capacity_under = {lim.metric.removeprefix("capacity_"): dict(lim.under)
                           for lim in request.node.stash.get(LIMITS, []) if lim.on_sweeps and lim.under}
    if properties.is_property_test(request.node):
        perf.check = properties.checker(request.node.stash.get(LIMITS, []), llmperf_session.retries)
    request.node.stash[PERF] = perf
    return perf


def _engine_fixture(name: str | None) -> Callable[..., Iterator[Engine]]:
    def fixture(request: pytest.FixtureRequest, llmperf_session: Session) -> Iterator[Engine]:
        engine_name = name or llmperf_session.engine_name
        options = engine_options(request.node)
        try:
            engine = llmperf_session.engine(engine_name, options, model_option(request.node))
        except EngineOptionError as e:
            error = f"llmperf: {e} (options given: {_sources(llmperf_session, engine_name, options)})"
        else:
            # Hypothesis strategies drawn in this test size requests to this engine
            with engine_limits.published(engine.max_model_len, engine.config.get("block_size")):
                yield engine
            return
        pytest.fail(error, pytrace=False)  # outside the handler: pytest would print the error again as its context

    return fixture


def _sources(session: Session, engine_name: str, marker: Mapping[str, Any]) -> str:
    """Where a test's engine options came from, so that a mistyped one can be found."""
    given = [f"@pytest.mark.llmperf_engine {marker}"] if marker else []
    if engine_name == session.engine_name and session.engine_defaults:
        given.append(f"--llmperf-engine-config/llmperf_engine_config {session.engine_defaults}")
    return "; ".join(given) or "none: the plugin's defaults"


llm_engine = pytest.fixture(_engine_fixture(None), name="llm_engine")


def _factory_fixture(name: str) -> Callable[..., Callable[..., Engine]]:
    def fixture(request: pytest.FixtureRequest, llmperf_session: Session) -> Callable[..., Engine]:
        model = model_option(request.node)

        def make(**config: Any) -> Engine:
            return llmperf_session.engine(name, config, model)

        return make

    return fixture


def engine_fixtures(engines: Mapping[str, str]) -> ModuleType:
    """A plugin module holding `<name>_engine` and `<name>_engine_factory` for each registered engine:
    a package that registers an engine gets its fixtures with no change here."""
    module = ModuleType("pytest_llmperf.engine_fixtures")
    for name in engines:
        setattr(module, f"{name}_engine", pytest.fixture(_engine_fixture(name), name=f"{name}_engine"))
        setattr(module, f"{name}_engine_factory",
                pytest.fixture(_factory_fixture(name), name=f"{name}_engine_factory"))
    return module


@pytest.fixture(scope="session")
def vllm_server(llmperf_session: Session, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`vllm serve` on a free loopback port for the session (`.base_url`, `.log_path`), the session's
    model (a shape: dummy weights, its word tokenizer); stopped at the end, also on failure and Ctrl-C."""
    server = start_vllm_server(llmperf_session, tmp_path_factory)
    llmperf_session.server = server  # the plugin restarts it when it dies between tests
    try:
        yield server
    finally:
        llmperf_session.server = None
        server.stop()


def start_vllm_server(llmperf_session: Session, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`vllm serve` of the session's model and server options, on a free port, up and answering."""
    from .engines.vllm import _is_cpu_build
    from .engines.vllm_server import VLLMServer

    vllm = pytest.importorskip("vllm", reason="vllm_server needs vLLM installed")
    return VLLMServer(llmperf_session.model(), llmperf_session.server_options,
                      tmp_path_factory.mktemp("vllm-serve"), cpu=_is_cpu_build(vllm))


def check_server(item: pytest.Item) -> None:
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


def server_log_on_failure(item: pytest.Item, report: pytest.TestReport) -> None:
    """A failed test that used `vllm serve` shows the end of its log; a server that died during the test
    is marked as reported, so the next test gets a fresh one without failing for it."""
    server = getattr(item, "funcargs", {}).get("vllm_server")
    if server is None or not report.failed:
        return
    report.sections.append(("vllm serve log (last lines)", server.log_tail()))
    if server.down_reason() is not None:
        item.config.stash[SESSION].server_deaths_reported.add(server.pid)
