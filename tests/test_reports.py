"""Reports: results.json, summary.md, the GitHub step summary, pytest-benchmark's JSON, and
`python -m pytest_llmperf compare` on two results files."""

import json
import subprocess
import sys

import pytest

TEST = """
import pytest
from pytest_llmperf import Workload

def test_chat(hf_engine, llmperf):
    llmperf.run(hf_engine, Workload.offline(6, prompt_len=(16, 48), output_len=(4, 12), seed=1), repeats=3, label="chat")
"""


def test_report_files_step_summary_and_pytest_benchmark(pytester, monkeypatch):
    step = pytester.path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    # the inner session is no xdist worker, even when this one is: pytest-benchmark would switch itself off
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(test_r=TEST)
    result = pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-report=rep", "--benchmark-json=bench.json")
    result.assert_outcomes(passed=1)

    doc = json.loads((pytester.path / "rep" / "results.json").read_text())
    assert doc["schema"] == 1 and doc["session"]["model"] == "shape:tiny-llama" and doc["session"]["hardware"] == "cpu"
    (test,) = doc["tests"]
    assert test["test"] == "test_r.py::test_chat" and test["outcome"] == "passed"
    (res,) = test["results"]
    assert res["label"] == "chat" and len(res["per_repeat"]) == 3 and res["deterministic"] is True
    assert res["summary"]["repeats"] == 3 and len(res["workload"]["requests"]) == 6
    assert test["environment"]["engine"] == "hf" and "max_batch_size" in test["environment"]["engine_config"]
    # time to verdict, split by phase: one engine start, one warm-up pass, three measured passes
    t = doc["session"]["time_to_verdict_s"]
    assert t["engine_starts"] == 1 and min(t["engine start"], t["warm-up"], t["measurement"]) > 0
    ((engine, model, seconds),) = t["each_start"]  # which configuration took how long to start
    assert engine == "hf" and model and 0 < seconds <= t["engine start"]
    assert t["wall"] >= t["engine start"] + t["warm-up"] + t["measurement"] + t["engine stop"] + t["plots"]
    assert t["plots"] > 0 and t["bandwidth probe"] == 0  # pictures asked for; no GPU to probe
    line = next(x for x in result.stdout.lines if x.startswith("time to verdict: "))
    assert " s, plots " in line and "bandwidth probe" not in line

    summary = (pytester.path / "rep" / "summary.md").read_text()
    assert "| `test_r.py::test_chat` | chat |" in summary
    assert step.read_text() == "earlier step\n" + summary  # appended, not replaced

    bench = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    assert len(bench) == 1 and bench[0]["name"] == "test_chat" and bench[0]["stats"]["rounds"] == 3
    assert bench[0]["extra_info"]["llmperf_output_tokens_per_s"] > 0


def test_the_time_to_verdict_line_names_every_phase_that_took_time():
    from pytest_llmperf.timing import PhaseTimes

    times = PhaseTimes(started=0.0)
    times.seconds.update({"engine start": 20.0, "measurement": 5.0})
    line = times.line(2)
    assert "engine start 20 s (2 starts)" in line and "measurement 5 s" in line and "re-measurement 0 s" in line
    assert "plots" not in line and "bandwidth probe" not in line  # optional phases appear only once they ran
    times.seconds["bandwidth probe"] = 6.0
    assert "engine stop 0 s, bandwidth probe 6 s, other" in times.line(2)


def test_under_xdist_the_line_adds_up_the_workers_phases():
    from pytest_llmperf.timing import PHASES, workers_line

    def worker(wall, start, starts):
        return {"wall": wall, **dict.fromkeys(PHASES, 0.0), "engine start": start, "other": wall - start,
                "engine_starts": starts}

    line = workers_line(100.0, [worker(90.0, 30.0, 2), worker(95.0, 20.0, 1)])
    assert line.startswith("time to verdict: 100 s, 2 pytest-xdist workers side by side: 185 worker-seconds = ")
    assert "engine start 50 s (3 starts)" in line and line.endswith("other (pytest, reports) 135 s")


def test_nested_phases_count_each_second_once():
    """Judging a test may measure it again, and that may start an engine: each second counts in the
    innermost phase, so the phases never add up to more than the wall time."""
    from pytest_llmperf.timing import PhaseTimes

    clock = iter([0.0, 10.0, 12.0, 15.0, 16.0, 20.0])
    times = PhaseTimes(started=0.0, clock=lambda: next(clock))
    # 0-10 judging, 10-12 re-measurement, 12-15 engine start, 15-16 re-measurement
    with times.timed("judging"), times.timed("re-measurement"), times.timed("engine start"):
        pass
    assert times.seconds["judging"] == 10.0 + 4.0  # and 16-20 judging again
    assert times.seconds["re-measurement"] == 2.0 + 1.0 and times.seconds["engine start"] == 3.0


def test_compare_cli_applies_the_baseline_rules(pytester):
    pytester.makepyfile(test_r=TEST)
    pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-report=old").assert_outcomes(passed=1)
    old = pytester.path / "old" / "results.json"

    def compare(new_doc, *options):
        new = pytester.path / "new.json"
        new.write_text(json.dumps(new_doc))
        return subprocess.run([sys.executable, "-m", "pytest_llmperf", "compare", str(old), str(new), *options],
                              capture_output=True, text=True)

    same = compare(json.loads(old.read_text()))
    assert same.returncode == 0 and "test_r.py::test_chat: pass" in same.stdout

    changed = json.loads(old.read_text())
    res = changed["tests"][0]["results"][0]
    res["metrics"]["kv_blocks_peak"] += 24
    changed["tests"][0]["environment"]["engine_version"] = "9.9.9"
    worse = compare(changed)
    assert worse.returncode == 1 and "paging changed: kv_blocks_peak" in worse.stdout
    assert "changed since the baseline: engine_version: " in worse.stdout and " -> 9.9.9" in worse.stdout
    # a report from another CPU: timing reported, paging still judged (docs/baselines.md)
    moved = json.loads(old.read_text())
    moved["tests"][0]["environment"]["cpu"] = "Some Other CPU (AMX)"
    for values in (moved["tests"][0]["results"][0]["metrics"], *moved["tests"][0]["results"][0]["per_repeat"]):
        values["output_tokens_per_s"] = values["output_tokens_per_s"] / 1000
    elsewhere = compare(moved)
    assert elsewhere.returncode == 0 and "timing and capacity reported, not gated" in elsewhere.stdout
    moved["tests"][0]["results"][0]["metrics"]["kv_blocks_peak"] += 24
    assert "paging changed: kv_blocks_peak" in compare(moved).stdout
    gone = compare({**changed, "tests": []})  # a test the new run no longer has is named, not passed over
    assert gone.returncode == 2 and "test_r.py::test_chat: in the old report only, not compared" in gone.stdout
    assert "nothing was compared" in gone.stderr  # and with nothing compared at all, no pass either
    # a test in both whose workload changed (stale) compares nothing either: never status 0
    stale = json.loads(old.read_text())
    stale["tests"][0]["results"][0]["workload_hash"] = "another workload"
    restaled = compare(stale)
    assert restaled.returncode == 2 and "stale" in restaled.stdout and "nothing was compared" in restaled.stderr
    # a tolerance given for a paging metric compares it with that tolerance instead of exactly
    assert compare(changed, "--tolerance", "0.1,kv_blocks_peak=10").returncode == 0
    unknown = compare(changed, "--tolerance", "0.1,blocks=10")
    assert unknown.returncode == 2 and "unknown metric 'blocks'" in unknown.stderr

    bad = subprocess.run([sys.executable, "-m", "pytest_llmperf", "compare", str(old), str(pytester.path / "nope.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a readable results file" in bad.stderr
    # a stored baseline where a results.json belongs is bad input (2), not a regression (1) or a traceback
    stored = compare({"schema": 1, "test": "test_r.py::test_chat", "environment": {}, "entries": []})
    assert stored.returncode == 2 and "a stored baseline, not a results.json" in stored.stderr, stored.stderr
    schema_only = compare({"schema": 1})
    assert schema_only.returncode == 2 and "not a pytest-llmperf results.json" in schema_only.stderr


def _report(path, tok, hardware="h200", model="shape:llama-3.1-8b", tolerance=(0.10, {}), p99=50.0, paging=None,
            timeline=None):
    """A results.json of one test and one result, as --llmperf-report writes it."""
    from pytest_llmperf.baseline import Entry
    from pytest_llmperf.report import TestRecord, document, result_record

    metrics = {"output_tokens_per_s": tok, "p50_ttft_ms": 50.0, "p99_ttft_ms": p99, "kv_blocks_peak": 40}
    entry = Entry("0", "w1", timeline is not None, metrics, [metrics], engine="vllm", samples={"ttft": 1000},
                  timeline=timeline)
    env = {"engine": "vllm", "engine_version": "0.26.0", "hardware": hardware}
    session = {"hardware": hardware, "model": model, "baseline_mode": "compare", "tolerance": list(tolerance),
               **({"paging": paging} if paging else {})}
    record = TestRecord("t.py::test_a", "passed", results=[result_record(entry, {}, {})], environment=env)
    path.write_text(json.dumps(document([record], session)))
    return str(path)


def test_compare_cli_judges_as_the_runs_gate_did_and_only_one_class_and_model(tmp_path, capsys):
    """`compare` judged an H100 report against an H200 one (a false alarm, or a smaller model's run passed as an
    improvement), with a tolerance of 0.1 whatever the runs were gated with, and every moved timeline failed even
    where the runs' own `--llmperf-paging summary` only reported it."""
    from types import SimpleNamespace

    from pytest_llmperf.__main__ import main
    from pytest_llmperf.paging_timeline import Step, Timeline

    def compare(old, new, *options):  # the command's own main, in this process (as `python -m pytest_llmperf`)
        code = main(["compare", old, new, *options])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    old = _report(tmp_path / "old.json", 100.0)
    # one model as baselines name it: a hub id and its snapshot in Hugging Face's cache
    snapshot = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0e9e39f"
    snapshot.mkdir(parents=True)
    hub = _report(tmp_path / "hub.json", 100.0, model="meta-llama/Llama-3.1-8B")
    assert compare(hub, _report(tmp_path / "snap.json", 100.0, model=str(snapshot))).returncode == 0
    for where in (dict(hardware="h100"), dict(model="shape:tiny-llama")):
        other = compare(old, _report(tmp_path / "other.json", 300.0, **where))
        assert other.returncode == 2 and "different hardware classes or models" in other.stderr, other
        assert "h200" in other.stderr and "shape:llama-3.1-8b" in other.stderr
    # the runs' own tolerance: a session that gated p99 TTFT at 15% fails its doubling; one at 65% passes -20%
    gated_p99 = (0.10, {"p99_ttft_ms": 0.15})
    doubled = compare(_report(tmp_path / "a.json", 100.0, tolerance=gated_p99),
                      _report(tmp_path / "b.json", 100.0, tolerance=gated_p99, p99=100.0))
    assert doubled.returncode == 1 and "p99_ttft_ms" in doubled.stdout, doubled
    loose = (1.5, {"output_tokens_per_s": 0.65})
    slower = compare(_report(tmp_path / "c.json", 100.0, tolerance=loose), _report(tmp_path / "d.json", 80.0, tolerance=loose))
    assert slower.returncode == 0, slower
    assert compare(str(tmp_path / "c.json"), str(tmp_path / "d.json"), "--tolerance", "0.1").returncode == 1
    # the runs' own paging mode: a moved timeline is reported under summary, fails under strict
    steps = (Timeline((Step(2, 0, 10, ("0", "1")), Step(0, 0, 0))).to_dict(),
             Timeline((Step(1, 1, 6, ("0",)), Step(0, 0, 0))).to_dict())
    for paging, status in (("summary", 0), ("strict", 1)):
        moved = compare(_report(tmp_path / "e.json", 100.0, timeline=steps[0], paging=paging),
                        _report(tmp_path / "f.json", 100.0, timeline=steps[1], paging=paging))
        assert moved.returncode == status, (paging, moved)
    assert compare(str(tmp_path / "e.json"), str(tmp_path / "f.json"), "--paging", "strict").returncode == 1


def test_under_xdist_the_controller_reports_every_worker(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_x="""
import pytest
from pytest_llmperf import Workload

@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_chat(hf_engine, llmperf, seed):
    llmperf.run(hf_engine, Workload.offline(3, prompt_len=(16, 32), output_len=(4, 8), seed=seed), warmup=False)
""")
    result = pytester.runpytest_subprocess("-n", "2", "--llmperf-engine=hf", "--llmperf-report=rep", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    doc = json.loads((pytester.path / "rep" / "results.json").read_text())
    assert sorted(t["test"] for t in doc["tests"]) == [f"test_x.py::test_chat[{s}]" for s in (1, 2, 3, 4)]
    assert result.stdout.str().count("test_x.py::test_chat[") >= 4  # the terminal table lists them all
    # the engines ran in the workers: the controller's line adds up theirs, not its own zero starts
    workers = doc["session"]["time_to_verdict_s"]["workers"]
    starts = sum(w["engine_starts"] for w in workers)
    assert len(workers) == 2 and starts >= 1 and all(w["wall"] > 0 for w in workers)
    assert f"engines started: {starts};" in result.stdout.str()
    result.stdout.fnmatch_lines([f"time to verdict: * s, 2 pytest-xdist workers side by side: * worker-seconds = "
                                 f"engine start * s ({starts} starts), warm-up * s, measurement *"])


def test_results_json_and_baselines_are_strict_json(tmp_path):
    """No NaN or Infinity (a change from 0 to 0 is NaN in Python): JSON.parse, jq and Go reject them."""
    from pytest_llmperf import baseline
    from pytest_llmperf.report import write

    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in strict JSON"))

    write(tmp_path / "rep", [], {"change": float("nan"), "tolerance": [float("inf"), {"a": -float("inf")}]})
    assert strict((tmp_path / "rep" / "results.json").read_text())["session"] == {
        "change": None, "tolerance": [None, {"a": None}]}
    baseline.write(tmp_path / "b.json", {"entries": [{"metrics": {"change": float("nan"), "ok": 1.5}}]})
    assert strict((tmp_path / "b.json").read_text())["entries"][0]["metrics"] == {"change": None, "ok": 1.5}


def test_one_number_format_for_messages_margins_and_tables():
    from pytest_llmperf.formatting import cell, number, pair

    assert [number(x) for x in (47.0, 1024.9, 12345.6, 936.94, 0.0493412)] == ["47", "1025", "12346", "936.9", "0.04934"]
    assert pair(0.0351512, 0.0351548) == "0.0351512 -> 0.0351548"  # never two different values printed alike
    assert pair(547, 280) == "547 -> 280"
    assert [cell(x) for x in (None, 0.12345, 2147.44, 33)] == ["-", "0.123", "2147.4", "33"]


def test_a_value_that_moved_never_reads_as_unchanged():
    """An exact paging metric that moved in its fifth digit: tables and summary lines show the digits that
    differ and a change that is not 0.0%; as in the regression table a gate prints."""
    from pytest_llmperf import baseline
    from pytest_llmperf.formatting import apart, cell, change

    assert apart(0.05702, 0.05698, cell) == ("0.05702", "0.05698") and apart(0.0571, 0.0571, cell) == ("0.057",) * 2
    assert apart(None, 0.5, cell) == ("-", "0.500")
    assert [change(x) for x in (0.1234, -0.0007, -0.0003, 0.0, -0.05)] == ["+12.3%", "-0.1%", "-0.03%", "+0.0%", "-5.0%"]
    row = baseline.Row("0", "kv_fragmentation_mean", 0.0570102, 0.0570098, 0.0, "regression", exact=True,
                       reason="paging changed")
    table = baseline.format_table(baseline.Verdict("regression", rows=[row]))
    assert "0.0570102  0.0570098  -0.0007%" in table, table


@pytest.mark.parametrize(("measured", "bound", "upper", "line"), [
    (26, 0, True, "kv_preemptions 26 > 0 (over the limit)"),  # the README's first test: never "26 <= 0"
    (0, 0, True, "kv_preemptions 0 <= 0"),
    (26.3, 5000, True, "kv_preemptions 26.3 <= 5000 (99% to spare)"),
    (30, 20, True, "kv_preemptions 30 > 20 (over by 50%)"),
    (5, 10, False, "kv_preemptions 5 < 10 (short by 50%)"),
    (0.9022, 0.9, True, "kv_preemptions 0.9022 > 0.9 (over by 0.2%)"),  # not "over by 0%"
    (2999.6, 3000, False, "kv_preemptions 2999.6 < 3000 (short by less than 0.1%)"),  # never "3000 < 3000"
    (250.00001, 250, True, "kv_preemptions 250.00001 > 250 (over by less than 0.1%)"),
    (-1, 0, False, "kv_preemptions -1 < 0 (short of the limit)"),
])
def test_a_margin_line_reads_as_the_comparison_came_out(measured, bound, upper, line):
    from pytest_llmperf.assertions import format_margin

    spare = ((bound - measured if upper else measured - bound) / bound) if bound else None
    assert format_margin({"metric": "kv_preemptions", "unit": "", "measured": measured, "bound": bound,
                          "upper": upper, "margin": spare}) == line


def test_a_session_stopped_by_sigterm_still_reports_what_it_judged(pytester):
    """A CI job's time limit sends SIGTERM: the tests that finished before it keep their failure texts, the
    llmperf summary and the report, and the exit status still says the job was killed."""
    pytester.makepyfile(test_s="""
import os, signal, time
import pytest
from pytest_llmperf import Workload

W = Workload.offline(4, prompt_len=16, output_len=4, seed=1)

@pytest.mark.min_throughput(output_tokens_per_s=1e9)
def test_a_too_slow(hf_engine, llmperf):
    llmperf.run(hf_engine, W, label="slow")

def test_b_fine(hf_engine, llmperf):
    llmperf.run(hf_engine, W, label="fine")

def test_c_stopped(hf_engine, llmperf):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
""")
    result = pytester.runpytest_subprocess("--llmperf-engine=hf", "--llmperf-report=rep", "-p", "no:cacheprovider",
                                           timeout=300)
    out = result.stdout.str()
    assert result.ret == 143, out
    assert "terminated by SIGTERM" in out + result.stderr.str()
    assert "FAILED test_s.py::test_a_too_slow" in out and "output_tokens_per_s" in out  # the failure text
    assert "time to verdict: " in out
    doc = json.loads((pytester.path / "rep" / "results.json").read_text())
    assert [t["test"] for t in doc["tests"]] == ["test_s.py::test_a_too_slow", "test_s.py::test_b_fine"]
    assert [t["outcome"] for t in doc["tests"]] == ["failed", "passed"]
    assert (pytester.path / "rep" / "summary.md").exists()


OWN_TRY = """
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    except Exception:
        pass
"""

SWALLOWED = {
    # the signal lands in code that catches Exception (pytest.exit raises one): the test's own try block ...
    "in the test body": ("", OWN_TRY),
    # ... which then asks for another engine (the pool's NVML check of a group, a re-measurement's fallback)
    "before another engine's start": ("", OWN_TRY + "    hf_engine_factory(max_batch_size=2)\n"),
    # ... or the plugin's judging, which turns an unforeseen error into that test's failure
    "while judging": ("""
import os, signal
from pytest_llmperf import judging

_judge = judging.judge

def judge(item, perf):
    if item.name == "test_a_signalled":
        os.kill(os.getpid(), signal.SIGTERM)
    return _judge(item, perf)

judging.judge = judge
""", ""),
}


@pytest.mark.parametrize("where, xdist", [(w, False) for w in SWALLOWED] + [("in the test body", True)])
def test_a_sigterm_that_code_swallowed_still_ends_the_session_before_the_next_test(pytester, where, xdist):
    """On the H100 (2026-12-07) a `timeout` SIGTERM landed while a test was judged: the plugin counted it as
    that test's error and went on, starting the next tests' engines after the job was cancelled."""
    conftest, body = SWALLOWED[where]
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_s=f"""
import os, signal, time
from pytest_llmperf import Workload

W = Workload.offline(4, prompt_len=16, output_len=4, seed=1)

def test_a_signalled(hf_engine, hf_engine_factory, llmperf):
    llmperf.run(hf_engine, W, label="a")
{body}

def test_b_never_started(hf_engine, llmperf):
    llmperf.run(hf_engine, W, label="b")
""")
    result = pytester.runpytest_subprocess("--llmperf-engine=hf", "--llmperf-report=rep", "-p", "no:cacheprovider",
                                           "-v", *(["-n", "1"] if xdist else []), timeout=300)
    out = result.stdout.str()
    # a worker's SIGTERM stops its loop, and the controller ends as interrupted (an exit there was an INTERNALERROR)
    assert result.ret == (2 if xdist else 143), out
    assert "terminated by SIGTERM" in out + result.stderr.str() and "INTERNALERROR" not in out
    ran_b = [line for line in out.splitlines() if "test_b_never_started" in line
             and any(word in line for word in ("PASSED", "FAILED", "ERROR"))]
    assert not ran_b and (xdist or "test_b_never_started" not in out), out
    if where == "before another engine's start":
        assert "hf engine not started: llmperf: terminated by SIGTERM" in out, out
    if where == "while judging":
        assert "not judged: the session was terminated (SIGTERM) while judging it" in out


def test_the_baseline_count_names_every_test_the_gate_met_those_that_failed_first_too():
    """A test that failed its limits (or whose result was invalid) never reaches its baseline: the summary
    counts it as not compared, so that its tests add up to the session's. A test that passed without a
    record of the gate (--llmperf-baseline=off) is not among them."""
    from pytest_llmperf.report import TestRecord, baseline_counts

    recs = [TestRecord("a", "passed", "no-baseline"), TestRecord("b", "failed"), TestRecord("c", "invalid"),
            TestRecord("d", "passed")]
    assert baseline_counts(recs).startswith("baselines: 3 tests: 1 had no baseline, 2 not compared (failed or "
                                            "invalid first); 0 metrics regressed or changed, 0 improved")
    assert baseline_counts(recs[:1]).startswith("baselines: 1 test: 1 had no baseline;")
    assert baseline_counts(recs[1:]) == ""  # no test met the gate: nothing to count
    # an exact paging metric that moved for the better fails as "changed": one row, counted once
    rows = [{"metric": "kv_preemptions", "verdict": "changed", "reason": "8 -> 6"},
            {"metric": "output_tokens_per_s", "verdict": "improvement", "reason": "up 12%"}]
    moved = [TestRecord("e", "failed", "regression", rows)]
    assert "; 1 metric regressed or changed, 1 improved" in baseline_counts(moved), baseline_counts(moved)


def test_engines_that_do_not_stop_cleanly_fail_the_session_and_lose_no_verdict(pytester):
    """The pool's close failing at the session's end (the card not freed within its wait, a stop that timed out):
    the summary and the report still come, the error is named, and the session fails. FAKE engine."""
    pytester.makeconftest("""
import pytest
from pytest_llmperf.gpu import GpuError
from pytest_llmperf.session import SESSION

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    pool = session.config.stash[SESSION].pool
    real = pool.close

    def close():
        real()
        raise GpuError("the card still holds 70.2 GiB 60 s after the engines stopped")

    pool.close = close
""")
    pytester.makepyfile(test_c="""
from fake_engine import WORKLOAD, FakeWarmingEngine

def test_fine(llmperf):
    llmperf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False)
""")
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--llmperf-baseline=off", "--llmperf-report=rep")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "the engines did not stop cleanly at the session's end (GpuError: the card still holds 70.2 GiB" in out, out
    assert "test_c.py::test_fine" in out and "time to verdict: " in out
    assert json.loads((pytester.path / "rep" / "results.json").read_text())["tests"][0]["outcome"] == "passed"


def test_a_session_that_measured_nothing_replaces_an_older_report(pytester):
    """An older run's results.json left in --llmperf-report's folder must not pass for this run's (CI uploads
    the folder): a session whose only test errors before its body writes a report with no test in it."""
    rep = pytester.path / "rep"
    rep.mkdir()
    (rep / "results.json").write_text(json.dumps({"schema": 1, "session": {}, "tests": [{"test": "old"}]}))
    (rep / "summary.md").write_text("an older run\n")
    pytester.makepyfile(test_e="""
import pytest

@pytest.mark.llmperf_engine(no_such_option=1)
def test_bad(hf_engine, llmperf):
    pass
""")
    result = pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-baseline=off", "--llmperf-report=rep",
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    doc = json.loads((rep / "results.json").read_text())
    assert doc["tests"] == [] and doc["session"]["engine"] == "hf"
    assert "No test measured in this session" in (rep / "summary.md").read_text()
    assert "llmperf report: " in result.stdout.str()
