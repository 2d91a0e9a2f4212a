"""What the GitHub workflows select and judge, read from the workflow files themselves: the perf gate
runs the whole gate suite on its runner class, strictly, against baselines that ship for it."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_llmperf.baseline import path_for

ROOT = Path(__file__).resolve().parents[1]
# Baselines the gate suite still lacks on a class, each with why. The strict gate fails these tests on
# that runner, saying how to record them; an entry must go once its file exists (the test checks both).
NOT_YET_RECORDED: dict[str, set[str]] = {}  # none: every gate-suite test has its baseline on every class


def workflow(name):
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def job(name, key):
    return workflow(name)["jobs"][key]


def collected(*args):
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return [line for line in out.stdout.splitlines() if "::" in line], out


def option(args, name):
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{name}="))


# the gate's runner classes, and every GPU class whose baselines ship (ready for the matrix once its runner exists)
GATE_CLASSES = sorted(set(job("perf-gate.yml", "perf")["strategy"]["matrix"]["hardware"])
                      | {d.name for d in (ROOT / "baselines").iterdir() if d.is_dir() and d.name != "cpu"})


@pytest.mark.parametrize("hardware", GATE_CLASSES)
def test_the_perf_gate_selects_its_whole_suite_on_its_runner_class_and_every_test_has_a_baseline(hardware):
    perf = job("perf-gate.yml", "perf")
    tests, args = perf["env"]["PERF_TESTS"].split(), shlex.split(perf["env"]["PERF_ARGS"])
    assert "${{ matrix.hardware }}" in perf["runs-on"] and "-m ${{ matrix.hardware }}" in perf["steps"][1]["run"]
    assert "--llmperf-baseline=require" in args
    whole, _ = collected(*tests, f"--llmperf-hardware={hardware}")
    picked, out = collected(*tests, "-m", hardware, f"--llmperf-hardware={hardware}", *args)
    assert picked == whole and len(picked) >= 10, out.stdout
    model = option(args, "--llmperf-model")
    missing = {t for t in picked if not path_for(ROOT / "baselines", t, hardware, model).exists()}
    assert missing == NOT_YET_RECORDED.get(hardware, set()), \
        f"{hardware} baselines missing {missing}, known gaps {NOT_YET_RECORDED.get(hardware)}: record with update-baselines.yml"


def test_update_baselines_records_what_the_perf_gate_judges():
    gate, update = job("perf-gate.yml", "perf"), job("update-baselines.yml", "update")
    assert update["env"]["PERF_TESTS"] == gate["env"]["PERF_TESTS"]
    gate_args, update_args = shlex.split(gate["env"]["PERF_ARGS"]), shlex.split(update["env"]["PERF_ARGS"])
    assert option(update_args, "--llmperf-model") == option(gate_args, "--llmperf-model")
    assert "--llmperf-baseline=update" in update_args
    choices = workflow("update-baselines.yml")[True]["workflow_dispatch"]["inputs"]["hardware"]["options"]
    assert set(gate["strategy"]["matrix"]["hardware"]) <= set(choices)
    assert "-m ${{ inputs.hardware }}" in update["steps"][1]["run"]
    # the calibration runs compare as the gate judges (its model and tolerances), then calibrate from them
    calibrate = next(s for s in update["steps"] if s.get("name") == "Calibrate the allowances")
    calib_args = shlex.split(update["env"]["GATE_ARGS"])
    assert [a for a in calib_args if "baseline=" not in a] == [a for a in gate_args if "baseline=" not in a
                                                               and "paging=" not in a]
    assert "--llmperf-baseline=compare" in calib_args and "$GATE_ARGS" in calibrate["run"]
    assert "pytest_llmperf calibrate calibration/run*/results.json" in calibrate["run"]


def test_the_weekly_calibration_compares_as_the_gate_judges_and_adds_to_the_stored_runs():
    gate, grow = job("perf-gate.yml", "perf"), job("grow-calibration.yml", "grow")
    assert grow["env"]["PERF_TESTS"] == gate["env"]["PERF_TESTS"]
    assert grow["strategy"]["matrix"]["hardware"] == gate["strategy"]["matrix"]["hardware"]
    gate_args, grow_args = shlex.split(gate["env"]["PERF_ARGS"]), shlex.split(grow["env"]["GATE_ARGS"])
    assert [a for a in grow_args if "baseline=" not in a] == [a for a in gate_args if "baseline=" not in a
                                                              and "paging=" not in a]
    assert "--llmperf-baseline=compare" in grow_args
    compare, add = grow["steps"][1], grow["steps"][2]
    assert "-m ${{ matrix.hardware }} $GATE_ARGS --llmperf-report=calibration/run" in compare["run"]
    assert add["run"].endswith("calibrate calibration/run/results.json --baseline-dir baselines --add")


def test_make_test_runs_the_shipped_suite_strictly_against_the_shipped_cpu_baselines():
    make = (ROOT / "Makefile").read_text()
    assert "PERF_GATE ?= --llmperf-baseline=require" in make and "$(MAKE) perf-gate" in make
    picked, _ = collected("perf_tests", "-m", "cpu", "--llmperf-hardware=cpu")
    whole, _ = collected("perf_tests", "--llmperf-hardware=cpu")
    assert picked == whole
