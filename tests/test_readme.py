"""The README's first test runs as written, and prints what the README says it prints."""

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _block(after: str, lang: str = "") -> str:
    """The first fenced code block after the line `after`."""
    tail = README[README.index(after):]
    match = re.search(rf"```{lang}\n(.*?)```", tail, re.S)
    assert match, f"no code block after {after!r}"
    return match.group(1)


def test_the_first_test_runs_as_written_and_fails_as_the_readme_says(pytester):
    pytester.makepyfile(test_my_service=_block("## A first test", "python"))

    def run():
        return pytester.runpytest_subprocess("--llmperf-baseline=off", "-p", "no:cacheprovider", "-p", "no:randomly",
                                             timeout=900)

    result = run()
    out = result.stdout.str()
    invalid = re.search(r"^.*(PERF-INVALID.*::test_chat|::test_chat.*PERF-INVALID)", out, re.M)
    if invalid and "the engine saturated under this open-loop load" in out:
        # an engine starved beside the other xdist worker's `vllm serve` saturated under the same 8/s in a fresh
        # clone's `make test` (tests/test_vllm_engine.py, 2026-12-06), and the plugin rightly says so: once more
        print("test_chat saturated (a starved engine, rightly said invalid); running the file once more")
        result = run()
        out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert "FAILED test_my_service.py::test_paging" in out, out[-3000:]
    for line in _block("The second test above ends with:").strip().splitlines():
        assert line.strip() in out, f"the README promises {line.strip()!r}; the run printed:\n{out[-3000:]}"
