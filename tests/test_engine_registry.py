"""Engines are registered, not listed: a package that registers an engine under the entry-point group
`pytest_llmperf.engines` gets `--llmperf-engine`, its fixtures and the engine pool, with no change to
the plugin. The engine here is a FAKE (named as such): plugin mechanics, never evidence about an adapter."""

import subprocess
import sys
import textwrap

import pytest

FAKE_ENGINE_PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "llmperf-fake-engine"
        version = "0.1"

        [project.entry-points."pytest_llmperf.engines"]
        fake = "llmperf_fake_engine:FakeEngine"
        """,
    "llmperf_fake_engine/__init__.py": """
        '''A FAKE engine in a package of its own: every request gets its tokens 1 ms apart.'''
        from pytest_llmperf.engines.base import Engine
        from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace


        class FakeEngine(Engine):
            name, version, max_model_len, vocab_size = "fake", "0.1", 4096, 1000

            def __init__(self, model, config):
                self.model, self._config = model, config

            @property
            def config(self):
                return {"fake_option": 1, **self._config}

            def run(self, workload, salt=0):
                seqs = tuple(SequenceTrace(i, 0, r.prompt_len, r.output_len, 0.0,
                                           tuple(Chunk(0.001 * (k + 1), 1) for k in range(r.output_len)))
                             for i, r in enumerate(workload.requests))
                return RunTrace("fake", seqs, 0.0, 0.001 * max(r.output_len for r in workload.requests))

            def shutdown(self):
                pass
        """,
}

PERF_TEST = """
import pytest
from pytest_llmperf import Workload


@pytest.mark.max_p99_ms(ttft=50)
def test_on_the_registered_engine(fake_engine, llmperf):
    r = llmperf.run(fake_engine, Workload.offline(4, prompt_len=16, output_len=8, seed=1))
    assert r.ttft.count == 4 and fake_engine.config["fake_option"] == 1


def test_through_llm_engine_and_the_factory(llm_engine, fake_engine_factory, llmperf):
    assert llm_engine.name == "fake" and fake_engine_factory(block=2).config["block"] == 2
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package installed by pip into a folder of its own (the scratch environment's site-packages)."""
    root = tmp_path_factory.mktemp("pkg")
    for path, text in FAKE_ENGINE_PACKAGE.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(root)], check=True)
    return site


def test_an_installed_engine_package_runs_a_perf_test_with_no_change_to_the_plugin(pytester, installed, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(installed))
    pytester.makepyfile(test_fake=PERF_TEST)
    result = pytester.runpytest_subprocess("--llmperf-engine=fake", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["llmperf: engine fake, *",
                                 "  limits of test_fake.py::test_on_the_registered_engine: p99_ttft_ms 1 ms <= 50 ms*"])


def test_an_engine_nobody_registered_is_a_usage_error_that_says_how_to_add_one(pytester):
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest_inprocess("--llmperf-engine=sglang")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("llmperf_engine='sglang': choose one of hf, openai, vllm, or install a package that registers it under "
            "the entry-point group 'pytest_llmperf.engines'") in result.stderr.str()


def test_the_built_in_engines_are_registered_through_the_entry_point_group_too():
    from importlib.metadata import entry_points

    from pytest_llmperf.engines.registry import BUILTIN

    assert {ep.name: ep.value for ep in entry_points(group="pytest_llmperf.engines")} == dict(BUILTIN)
