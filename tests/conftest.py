import contextlib

import pytest

pytest_plugins = ["pytester"]


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
