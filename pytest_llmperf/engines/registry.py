"""Which engines exist: every one registered under the entry-point group `pytest_llmperf.engines`
(name = "module:Class", a subclass of `engines.base.Engine`). The built-in three register there too
(pyproject.toml); they are also known without installed metadata, for a checkout run with
`-p pytest_llmperf.plugin`. Read once per session; an engine's module is imported only when a test
asks for it, so the plugin loads fast.

A package adds an engine with no change to the plugin:

    [project.entry-points."pytest_llmperf.engines"]
    sglang = "my_package.sglang_engine:SGLangEngine"

and gets `--llmperf-engine=sglang`, the `sglang_engine` and `sglang_engine_factory` fixtures, and the
session's engine pool.
"""

from __future__ import annotations

from collections.abc import Mapping

GROUP = "pytest_llmperf.engines"
BUILTIN: Mapping[str, str] = {
    "hf": "pytest_llmperf.engines.hf:HFEngine",
    "vllm": "pytest_llmperf.engines.vllm:VLLMEngine",
    "openai": "pytest_llmperf.engines.openai:OpenAIEngine",
}


def discover() -> dict[str, str]:
    """name -> "module:Class" of every registered engine (the built-in ones first)."""
    from importlib.metadata import entry_points

    return {**BUILTIN, **{ep.name: ep.value for ep in entry_points(group=GROUP)}}


def fixture_names(engines: Mapping[str, str]) -> frozenset[str]:
    """The fixtures through which a test uses an engine: `<name>_engine` and `<name>_engine_factory`."""
    return frozenset(f"{name}_engine{suffix}" for name in engines for suffix in ("", "_factory"))
