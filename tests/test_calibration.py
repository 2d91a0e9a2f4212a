"""Calibrated allowances: the bound, the gate that never judges tighter than it, and
`python -m pytest_llmperf calibrate` end to end on real transformers runs in separate report folders."""

import json
import math
import subprocess
import sys

import pytest

from pytest_llmperf import baseline, calibration
from pytest_llmperf.baseline import Entry


def test_the_bound_is_a_one_sided_prediction_bound_split_over_the_suites_comparisons():
    # mean 2%, sd 1%, 3 runs: 0.02 + t(0.95, 2) * 0.01 * sqrt(1 + 1/3), t(0.95, 2) = 2.919986
    assert calibration.bound([0.01, 0.02, 0.03], comparisons=1) == pytest.approx(0.02 + 2.919986 * 0.01 * math.sqrt(4 / 3))
    one, forty = calibration.bound([0.01, 0.02, 0.03], 1), calibration.bound([0.01, 0.02, 0.03], 40)
    assert forty > one  # more comparisons per run: each gets less of the false-alarm budget
    assert calibration.bound([-0.05, -0.04, -0.06], 1) == 0.0  # runs that only landed better need nothing
    with pytest.raises(ValueError, match="at least 3 runs, got 2"):
        calibration.bound([0.01, 0.02], 1)
    # few runs over many comparisons: the table says how wide that makes each allowance, and to add runs
    few = calibration.allowances({("t", "0", f"m{i}"): [0.0, 0.03, 0.06] for i in range(11)})
    text = calibration.table(few)
    assert "+ 12.0 standard deviations of them (3 runs, 11 comparisons over the suite)" in text
    assert "warning: 3 runs are few for 11 comparisons" in text
    enough = calibration.allowances({("t", "0", f"m{i}"): [0.0, 0.03, 0.06] * 5 for i in range(11)})
    assert "warning" not in calibration.table(enough)
    assert "+ 27.0 standard deviations" in calibration.table(few, alpha=0.01)  # the alpha the allowances used
    # worse is down for throughput, up for latency
    assert calibration.worse_by("output_tokens_per_s", 100.0, 90.0) == pytest.approx(0.10)
    assert calibration.worse_by("p50_ttft_ms", 100.0, 90.0) == pytest.approx(-0.10)


def _entry(tok_s, calibration_=None):
    return Entry("0", "w1", False, {"output_tokens_per_s": tok_s}, [{"output_tokens_per_s": tok_s}],
                 calibration=calibration_ or {})


def test_a_calibrated_metric_is_never_judged_tighter_than_its_calibration_and_the_failure_says_so():
    doc = baseline.document("t", "h200", "m", {}, [_entry(100.0, {"output_tokens_per_s": 0.12})])
    assert baseline.compare(doc, [_entry(90.0)]).status == "pass"  # -10%: inside the calibrated 12%
    failed = baseline.compare(doc, [_entry(85.0)])
    assert failed.status == "regression"
    assert failed.regressions[0].reason == "down 15.0%, allowed 12.0% (calibrated)"
    plain = baseline.document("t", "h200", "m", {}, [_entry(100.0)])
    assert baseline.compare(plain, [_entry(90.0)], {"output_tokens_per_s": 0.05}).status == "regression"
    # a calibration below the tolerance changes nothing: it widens, never tightens
    small = baseline.document("t", "h200", "m", {}, [_entry(100.0, {"output_tokens_per_s": 0.01})])
    assert baseline.compare(small, [_entry(93.0)]).status == "pass"
    assert baseline.compare(small, [_entry(93.0)]).rows[0].allowed == pytest.approx(0.10)
    # stored and read back; an entry recorded again (an update) has none
    assert Entry.from_dict(doc["entries"][0]).calibration == {"output_tokens_per_s": 0.12}
    assert "calibration" not in _entry(100.0).to_dict()


def _suite(root, allowances, hardware="h200", model="m"):
    """A folder of calibrated baselines, one result each, with `allowances` for the default gate's timing."""
    for k, allowance in enumerate(allowances):
        timing = dict.fromkeys(("output_tokens_per_s", "requests_per_s", "p50_ttft_ms", "p50_tpot_ms"), allowance)
        doc = baseline.document(f"t{k}", hardware, model, {}, [_entry(100.0, timing)])
        baseline.write(baseline.path_for(root, f"t{k}", hardware, model), doc)


def test_a_result_without_a_calibration_takes_its_suites_median_allowance(tmp_path):
    """A test added (or recorded again) since the last calibrate: machines differ for it as for the
    others, so it is judged with the median of the suite's allowances, and the failure says whose."""
    new = baseline.document("new", "h200", "m", {}, [_entry(100.0)])
    baseline.write(baseline.path_for(tmp_path, "new", "h200", "m"), new)
    _suite(tmp_path, [0.10, 0.20])
    assert calibration.suite_allowances(tmp_path, "h200", "m") == {}  # two results say too little
    lent = calibration.borrowed(new, tmp_path, "h200", "m")
    assert baseline.compare(new, [_entry(85.0)], borrowed=lent).status == "regression"  # the 10% default

    _suite(tmp_path, [0.10, 0.20, 0.30])
    (tmp_path / "h200" / "m" / "broken.json").write_text("{")  # its own test fails on it; this one reads on
    bad = baseline.document("bad", "h200", "m", {}, [_entry(100.0, {"output_tokens_per_s": 0.5})])
    bad["entries"][0]["calibration"]["output_tokens_per_s"] = None  # a non-number broke every borrower's comparison
    (tmp_path / "h200" / "m" / "bad.json").write_text(json.dumps(bad))
    lent = calibration.borrowed(new, tmp_path, "h200", "m")
    assert lent["output_tokens_per_s"] == pytest.approx(0.20) and lent["p50_ttft_ms"] == pytest.approx(0.20)
    assert baseline.compare(new, [_entry(85.0)], borrowed=lent).status == "pass"
    failed = baseline.compare(new, [_entry(75.0)], borrowed=lent)
    assert failed.regressions[0].reason == "down 25.0%, allowed 20.0% (the suite's calibration: this result has none)"
    # a result with a calibration of its own keeps it, tighter or not, and nothing is read for it
    own = baseline.document("own", "h200", "m", {}, [_entry(100.0, {"output_tokens_per_s": 0.12})])
    assert calibration.borrowed(own, tmp_path, "h200", "m") == {}
    assert baseline.compare(own, [_entry(85.0)], borrowed=lent).regressions[0].reason == "down 15.0%, allowed 12.0% (calibrated)"
    # other classes and models lend nothing to each other
    assert calibration.suite_allowances(tmp_path, "h100", "m") == {}


def test_the_gate_lends_the_suites_calibration_to_a_test_recorded_since(tmp_path):
    """The baseline gate end to end on a FAKE engine (plugin mechanics, fake_engine.py): a test recorded
    after its suite was calibrated is judged with the suite's allowance, in every pass it measures."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf

    def judged(mode, durations):
        perf = LLMPerf()
        perf.run(FakeWarmingEngine(durations), WORKLOAD, warmup=False)
        return gate("t", perf, GateConfig(mode, tmp_path, 0.10, "cpu", "m", retries=0), {}, {})

    judged("update", [1.0])
    assert judged("compare", [1.25]).status == "regression"  # down 20%: nothing to lend yet
    _suite(tmp_path, [0.25, 0.30, 0.35], hardware="cpu")
    assert judged("compare", [1.25]).status == "pass"
    slower = judged("compare", [1.6])  # down 37.5%
    row = next(r for r in slower.regressions if r.metric == "output_tokens_per_s")
    assert row.reason == "down 37.5%, allowed 30.0% (the suite's calibration: this result has none)"


TEST = """
import pytest
from pytest_llmperf import Workload

def test_chat(hf_engine, llmperf):
    llmperf.run(hf_engine, Workload.offline(6, prompt_len=(16, 48), output_len=(4, 12), seed=1), label="chat")
"""


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pytest_llmperf", *args], capture_output=True, text=True)


def test_calibrate_stores_each_metrics_allowance_from_unchanged_runs_and_an_update_drops_it(pytester):
    """A baseline recorded in one pytest process, three unchanged compare runs in three more, each with
    its report: calibrate reads them, writes the allowance of each gated timing metric into the baseline,
    and the next comparison uses it. Recording the test again drops the calibration."""
    pytester.makepyfile(test_c=TEST)
    pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-baseline=update").assert_outcomes(passed=1)
    (path,) = (pytester.path / "baselines").rglob("*.json")
    reports = []
    for k in range(3):
        pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-baseline=compare", f"--llmperf-report=run{k}")
        reports.append(str(pytester.path / f"run{k}" / "results.json"))
    base = str(pytester.path / "baselines")

    dry = _cli("calibrate", *reports, "--baseline-dir", base, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "test_chat" in dry.stdout and "output_tokens_per_s" in dry.stdout and "calibration" not in path.read_text()

    done = _cli("calibrate", *reports, "--baseline-dir", base)
    assert done.returncode == 0, done.stderr
    stored = json.loads(path.read_text())
    (entry,) = stored["entries"]
    # the default gate's timing metrics, each from the three runs' own deviations
    assert set(entry["calibration"]) == {"output_tokens_per_s", "requests_per_s", "p50_ttft_ms", "p50_tpot_ms"}
    assert stored["calibrated"] == {"runs": 3, "alpha": 0.05, "comparisons": 4}
    assert "calibrated 4 metrics of 1 baselines from 3 runs" in done.stdout
    assert {len(d) for d in entry["calibration_runs"].values()} == {3}  # what gave each allowance

    # one more unchanged run, another day or machine, joins the three: the bound is computed over all four
    pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-baseline=compare", "--llmperf-report=run3")
    added = _cli("calibrate", str(pytester.path / "run3" / "results.json"), "--baseline-dir", base, "--add")
    assert added.returncode == 0, added.stderr
    stored = json.loads(path.read_text())
    (entry,) = stored["entries"]
    assert stored["calibrated"] == {"runs": 4, "alpha": 0.05, "comparisons": 4}
    for metric, runs in entry["calibration_runs"].items():
        assert len(runs) == 4
        # both are stored to 4 decimals, and t(0.9875, 3) * sqrt(5/4) = 4.7 magnifies the rounding of the runs
        assert entry["calibration"][metric] == pytest.approx(calibration.bound(runs, 4), abs=1e-3)

    # the same run added again would count its deviations twice: refused, nothing written
    again = _cli("calibrate", str(pytester.path / "run3" / "results.json"), "--baseline-dir", base, "--add")
    assert again.returncode == 2 and "already stored in the calibration" in again.stderr
    assert json.loads(path.read_text()) == stored

    pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-baseline=update").assert_outcomes(passed=1)
    assert "calibration" not in path.read_text()


def test_calibrate_refuses_what_cannot_calibrate(tmp_path):
    def run(hardware):
        path = tmp_path / f"{hardware}-{len(list(tmp_path.iterdir()))}.json"
        doc = {"schema": 1, "session": {"hardware": hardware, "model": "m", "tolerance": [0.1, {}], "run": path.name},
               "tests": []}
        path.write_text(json.dumps(doc))
        return str(path)

    two = _cli("calibrate", run("cpu"), run("cpu"))
    assert two.returncode == 2 and "needs at least 3 runs, got 2" in two.stderr
    mixed = _cli("calibrate", run("cpu"), run("cpu"), run("h200"))
    assert mixed.returncode == 2 and "different hardware classes or models" in mixed.stderr
    nothing = _cli("calibrate", run("cpu"), run("cpu"), run("cpu"), "--baseline-dir", str(tmp_path / "none"))
    assert nothing.returncode == 2 and "no metric was measured by 3 of these runs" in nothing.stderr
    # one run added to baselines that hold no earlier runs: still fewer than 3 deviations per metric
    one_added = _cli("calibrate", run("cpu"), "--add", "--baseline-dir", str(tmp_path / "none"))
    assert one_added.returncode == 2 and "no metric was measured by 3" in one_added.stderr
    unreadable = _cli("calibrate", run("cpu"), run("cpu"), str(tmp_path / "missing.json"))
    assert unreadable.returncode == 2 and "not a readable results file" in unreadable.stderr
    # each run once: one file, or a copy of it, given again would count one machine's spread twice
    once = run("cpu")
    twice = _cli("calibrate", once, once, run("cpu"))
    assert twice.returncode == 2 and "are the same run: give each run once" in twice.stderr
    alpha = _cli("calibrate", run("cpu"), run("cpu"), run("cpu"), "--alpha", "5")
    assert alpha.returncode == 2 and "not a share strictly between 0 and 1" in alpha.stderr
    # a stored baseline where a results.json belongs: said so, not a traceback
    stored = tmp_path / "baseline.json"
    baseline.write(stored, baseline.document("t.py::test_x", "cpu", "m", {}, []))
    wrong = _cli("calibrate", str(stored), run("cpu"), run("cpu"))
    assert wrong.returncode == 2 and "a stored baseline, not a results.json" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    # a results.json of the right schema with a key missing (cut by hand, or another tool's): status 2, not a
    # traceback, and for compare not status 1, which says "regression"
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"schema": 1, "session": {"model": "m"}, "tests": []}))
    bad = _cli("calibrate", str(cut), run("cpu"), run("cpu"))
    assert bad.returncode == 2 and "without 'hardware'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    empty = _cli("compare", run("cpu"), run("cpu"))  # two reports with no test in common: nothing compared is no pass
    assert empty.returncode == 2 and "nothing was compared" in empty.stderr, empty.stderr
    cut.write_text(json.dumps({"schema": 1, "session": {"hardware": "cpu", "model": "m"},
                               "tests": [{"test": "t", "results": [{"label": "0"}]}]}))
    broken = _cli("compare", str(cut), str(cut))
    assert broken.returncode == 2 and "without 'workload_hash'" in broken.stderr, broken.stderr


def test_calibrate_refuses_a_run_that_changed_what_it_measured(tmp_path):
    """A run of other engine options or another engine version than its baseline is not an unchanged run:
    its spread would widen the allowance of every metric it touched. Another machine of the class is."""
    test_id, root = "t.py::test_x", tmp_path / "baselines"
    recorded = {"engine": "vllm", "engine_version": "0.32.0", "gpu_name": "card A",
                "engine_config": {"max_num_seqs": 128, "num_gpu_blocks": 1000}}
    baseline.write(baseline.path_for(root, test_id, "cpu", "org/m"),
                   baseline.document(test_id, "cpu", "org/m", recorded, []))

    def run(k, **changed):
        env = {**recorded, **changed, "engine_config": {**recorded["engine_config"], **changed.get("engine_config", {})}}
        doc = {"schema": 1, "session": {"hardware": "cpu", "model": "org/m", "tolerance": [0.1, {}], "run": k},
               "tests": [{"test": test_id, "environment": env, "results": []}]}
        path = tmp_path / f"run{k}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    # another machine: its card's name and the KV blocks its memory gave differ; nothing to refuse (and nothing
    # to calibrate from, as these runs hold no results)
    machines = _cli("calibrate", run(1, gpu_name="card B", engine_config={"num_gpu_blocks": 990}), run(2), run(3),
                    "--baseline-dir", str(root))
    assert machines.returncode == 2 and "no metric was measured" in machines.stderr
    for changed, named in ((dict(engine_config={"max_num_seqs": 4}), "engine_config.max_num_seqs: 128 -> 4"),
                           (dict(engine_version="0.33.0"), "engine_version: 0.32.0 -> 0.33.0")):
        refused = _cli("calibrate", run(4, **changed), run(5), run(6), "--baseline-dir", str(root))
        assert refused.returncode == 2, refused.stderr
        assert f"is not an unchanged run: {test_id}: {named}" in refused.stderr, refused.stderr


def test_invalid_partial_or_untimed_results_teach_a_calibration_nothing(tmp_path):
    """A result whose client fell behind its schedule (less load offered) or whose engine died during it
    is no unchanged run: its deviation would widen the allowance every later regression hides in. FAKE
    engine (plugin mechanics, fake_engine.py)."""
    from fake_engine import WORKLOAD, FakeWarmingEngine

    from pytest_llmperf.baseline import result_entry
    from pytest_llmperf.gating import GateConfig, gate
    from pytest_llmperf.runner import LLMPerf

    def measured(duration):
        perf = LLMPerf()
        perf.run(FakeWarmingEngine([duration]), WORKLOAD, warmup=False)
        return perf

    gate("t", measured(1.0), GateConfig("update", tmp_path, 0.10, "cpu", "m", retries=0), {}, {})

    def run(duration, outcome="passed", **summary):
        entry = result_entry(measured(duration).runs[0], 0).to_dict()
        return {"tests": [{"test": "t", "outcome": outcome, "gated": None, "results": [{**entry, "summary": summary}]}]}

    unchanged = [run(1.1), run(1.2)]
    kept = calibration.deviations(tmp_path, "cpu", "m", unchanged, {})
    assert kept and all(len(d) == 2 for d in kept.values())
    cut = [run(3.0, outcome="invalid", invalid="the client fell behind its arrival schedule"), run(3.0, partial=True),
           run(3.0, invalid="the client fell behind its arrival schedule")]
    assert calibration.deviations(tmp_path, "cpu", "m", unchanged + cut, {}) == kept
    # a run on another CPU had its timing reported, not gated: it shows that CPU's speed, not this machine's spread
    elsewhere = run(3.0)
    elsewhere["tests"][0]["untimed"] = True
    assert calibration.deviations(tmp_path, "cpu", "m", unchanged + [elsewhere], {}) == kept
    endless = run(1.1)
    endless["tests"][0]["results"][0]["metrics"]["output_tokens_per_s"] = float("inf")  # json.loads reads Infinity
    with pytest.raises(ValueError, match="output_tokens_per_s is inf, not a number"):
        calibration.deviations(tmp_path, "cpu", "m", unchanged + [endless], {})
    # a run compared with a baseline recorded again since: its deviation is from another baseline
    before = run(1.1)
    label = before["tests"][0]["results"][0]["label"]
    before["tests"][0]["baseline_rows"] = [{"label": label, "metric": "output_tokens_per_s", "baseline": 1e9}]
    with pytest.raises(ValueError, match="recorded again since"):
        calibration.deviations(tmp_path, "cpu", "m", unchanged + [before], {})


def _run_doc(path, tok, mode="compare", test_id="t::t0", env=None):
    """A results.json of one compare run of one test (one result), as --llmperf-report writes it."""
    from pytest_llmperf.report import TestRecord, document, result_record

    metrics = {"output_tokens_per_s": tok, "requests_per_s": tok / 10, "p50_ttft_ms": 5000 / tok, "p50_tpot_ms": 10.0}
    entry = baseline.Entry("0", "w1", False, metrics, [metrics], engine="vllm")
    record = TestRecord(test_id, "passed", results=[result_record(entry, {}, {})], environment=env or {})
    session = {"hardware": "h200", "model": "org/m", "baseline_mode": mode, "tolerance": [0.1, {}]}
    path.write_text(json.dumps(document([record], session)))
    return str(path)


def test_calibrate_refuses_runs_not_compared_and_splits_alpha_over_the_whole_suite(tmp_path, capsys):
    """The run that recorded the baselines (deviation 0), or one made with the gate off, was taken as an unchanged
    compare run; and a test recorded again and calibrated alone split the false-alarm budget over its own 4 metrics,
    not the suite's 24, so its allowances were far tighter than the rest's."""
    from pytest_llmperf.__main__ import main

    root = tmp_path / "baselines"
    env = {"engine": "vllm", "engine_version": "0.26.0", "engine_config": {}}
    deviations = {m: [0.01 * (i % 5) for i in range(14)] for m in ("output_tokens_per_s", "requests_per_s",
                                                                     "p50_ttft_ms", "p50_tpot_ms")}
    for k in range(1, 6):  # five tests calibrated from 14 runs, 4 metrics each
        metrics = {"output_tokens_per_s": 100.0, "requests_per_s": 10.0, "p50_ttft_ms": 50.0, "p50_tpot_ms": 10.0}
        entry = baseline.Entry("0", "w1", False, metrics, [metrics], engine="vllm",
                               calibration={m: 0.08 for m in deviations}, calibration_runs=deviations)
        baseline.write(baseline.path_for(root, f"t::t{k}", "h200", "org/m"),
                       baseline.document(f"t::t{k}", "h200", "org/m", env, [entry]))
    metrics = {"output_tokens_per_s": 100.0, "requests_per_s": 10.0, "p50_ttft_ms": 50.0, "p50_tpot_ms": 10.0}
    baseline.write(baseline.path_for(root, "t::t0", "h200", "org/m"),  # recorded again: no calibration of its own
                   baseline.document("t::t0", "h200", "org/m", env, [baseline.Entry("0", "w1", False, metrics, [metrics],
                                                                                engine="vllm")]))
    runs = [_run_doc(tmp_path / f"r{i}.json", tok, env=env) for i, tok in enumerate((97.0, 94.0, 91.0))]
    for mode in ("update", "off"):
        other = _run_doc(tmp_path / f"{mode}.json", 100.0, mode=mode, env=env)
        assert main(["calibrate", other, *runs[:2], "--baseline-dir", str(root)]) == 2
        assert f"ran with --llmperf-baseline={mode}: it was not compared with the baselines" in capsys.readouterr().err

    assert main(["calibrate", *runs, "--baseline-dir", str(root)]) == 0, capsys.readouterr().err
    stored = baseline.load(baseline.path_for(root, "t::t0", "h200", "org/m"))
    assert stored["calibrated"]["comparisons"] == 24  # its 4 metrics and the 20 the other tests keep
    (entry,) = stored["entries"]
    tok = entry["calibration_runs"]["output_tokens_per_s"]
    assert entry["calibration"]["output_tokens_per_s"] == pytest.approx(calibration.bound(tok, 24), abs=1e-3)
    assert calibration.bound(tok, 24) > calibration.bound(tok, 4) + 0.1
