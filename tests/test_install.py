"""Installs as users install: `pip install pytest-llmperf` into a bare virtual environment gives a
plugin that loads and stays quiet, a feature whose extra is missing names the extra, and the extra
brings what the feature imports. Uses the package index (PyPI, or the one pip is configured with)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROJECT = """
def test_plain():
    pass


def test_on_an_engine(llm_engine, llmperf):
    pass
"""


def _run(*cmd, cwd=None):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A virtual environment with `pip install .` of this checkout and no extras."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    python = venv / "bin" / "python"
    done = _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def test_a_bare_install_loads_and_names_the_extra_each_engine_needs(bare, tmp_path):
    (tmp_path / "test_project.py").write_text(PROJECT)
    done = _run(bare, "-m", "pytest", "-rA", "-p", "no:cacheprovider", cwd=tmp_path)
    out = done.stdout
    assert "plugins: llmperf-" in out, out[-3000:]
    assert "PASSED test_project.py::test_plain" in out  # the plugin is there and stays out of the way
    # no engine is installed: the test that needs one errors with the extra to install, the session goes on
    assert "ERROR test_project.py::test_on_an_engine" in out and "1 passed, 1 error" in out, out[-3000:]
    assert "pip install 'pytest-llmperf[hf]'" in out, out[-3000:]
    assert "INTERNALERROR" not in out


def test_strategies_name_their_extra_and_it_brings_them(bare):
    missing = _run(bare, "-c", "import pytest_llmperf.strategies")
    assert missing.returncode != 0
    assert "pip install 'pytest-llmperf[hypothesis]'" in missing.stderr, missing.stderr[-2000:]
    done = _run(bare, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{ROOT}[hypothesis]")
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = _run(bare, "-c", "from pytest_llmperf import strategies; print(strategies.workloads(max_requests=4))")
    assert loaded.returncode == 0 and "workloads" in loaded.stdout, loaded.stderr[-2000:]
