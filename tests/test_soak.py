"""`--llmperf-soak N`: rounds in order, memory taken after each, growth fails the session. Runs a real
transformers engine in pytester sessions; the leak is planted (a test that keeps 64 MiB per round)."""

TEST = """
from pytest_llmperf import Workload

W = Workload.offline(4, prompt_len=(16, 32), output_len=(2, 4), seed=1)
KEPT = []


def test_a(hf_engine, llmperf):
    llmperf.run(hf_engine, W, warmup=False)


def test_b(hf_engine, llmperf, request):
    llmperf.run(hf_engine, W, warmup=False)
    if request.config.getoption("--llmperf-soak-limit-mib") < 32:
        KEPT.append(bytearray(64 * 1024 * 1024))  # a leak of 64 MiB per round
"""


def test_rounds_run_in_order_share_the_engine_and_report_memory(pytester):
    pytester.makepyfile(test_s=TEST)
    result = pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-soak=3", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    out = result.stdout.str()
    ran = [line.split(" ")[0] for line in out.splitlines() if line.endswith("PASSED") or " PASSED " in line]
    assert ran == [f"test_s.py::test_{t}[round{r}]" for r in (1, 2, 3) for t in "ab"]
    assert "engines started: 1" in out
    assert "after round 1: host" in out and "after round 3: host" in out
    assert "no growth beyond 256 MiB between the last two rounds (host +" in out


def test_memory_growth_between_rounds_fails_the_session(pytester):
    pytester.makepyfile(test_s=TEST)
    result = pytester.runpytest_inprocess("--llmperf-engine=hf", "--llmperf-soak=2", "--llmperf-soak-limit-mib=16",
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)  # every test passed; the session fails on the growth
    assert result.ret == 1
    assert "llmperf soak: memory grew between rounds 1 and 2: host +6" in result.stdout.str()


def test_a_steady_leak_below_the_limit_a_round_fails_once_it_adds_up():
    """Only the last two rounds were compared: 200 MiB a round for 50 rounds (10 GiB) passed. The rounds'
    memory is given here (plugin mechanics); the planted leak above runs the real thing."""
    from pytest_llmperf.soak import RoundMemory, Soak

    def verdict(host):
        soak = Soak(len(host), 256.0, lambda: None)
        soak.memory = [RoundMemory(i + 1, mib, None) for i, mib in enumerate(host)]
        return soak.verdict()

    assert verdict([1000, 1900, 2100, 2300, 2500]) == ("llmperf soak: memory grew from round 2 to 5, highest after "
                                                       "the last: host +600 MiB in all (limit 256 MiB, "
                                                       "--llmperf-soak-limit-mib)")
    assert verdict([1000, 1900, 2100, 2050, 2250]).endswith("host +350 MiB in all (limit 256 MiB, "
                                                            "--llmperf-soak-limit-mib)")  # a dip hides nothing
    assert verdict([1000, 1900, 1950, 2000, 2050]) is None  # +150 MiB in all: within the limit
    assert verdict([1000, 1900, 2100]) is None  # two rounds after the first: the last two's rule alone
    assert verdict([1000, 1900, 2300, 2200, 2250]) is None  # grew once, then gave some back: not still growing
    assert verdict([1000, 1900, 1901, 1900, 1902]) is None  # the first round's start is not growth


def test_a_soak_of_zero_rounds_is_a_usage_error(pytester):
    pytester.makepyfile(test_s="def test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("--llmperf-soak=0", "-p", "no:cacheprovider")
    assert result.ret == 4 and "--llmperf-soak=0: give the number of rounds" in result.stderr.str()


def test_a_soak_under_xdist_is_a_usage_error(pytester):
    """Each worker would judge its own memory, and no worker's verdict reaches the session's exit status: a
    planted leak passed under -n 1."""
    pytester.makepyfile(test_s="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--llmperf-soak=2", "-n", "1", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == 4, result.stdout.str() + result.stderr.str()
    assert "measures the memory of one pytest process round by round: run it without pytest-xdist's -n" in (
        result.stdout.str() + result.stderr.str())


def test_every_soak_round_compares_with_the_one_baseline_a_plain_run_records(pytester):
    """A round's id (`test_n[a-b-round2]`) finds the baseline of `test_n[a-b]`: a soak under require found none
    and suggested recording `test_n[round1]`, which a plain run never measures. FAKE engine (plugin mechanics)."""
    pytester.makepyfile(test_n="""
import pytest
from fake_engine import WORKLOAD, FakeWarmingEngine

@pytest.mark.parametrize("k", [1], ids=["a-b"])
def test_n(llmperf, k):
    llmperf.run(FakeWarmingEngine([1.0]), WORKLOAD, warmup=False)
""")
    args = ("-p", "no:randomly", "-p", "no:cacheprovider", "--llmperf-retries=0")
    pytester.runpytest_inprocess(*args, "--llmperf-baseline=update").assert_outcomes(passed=1)
    soaked = pytester.runpytest_inprocess(*args, "--llmperf-soak=2", "--llmperf-baseline=require")
    soaked.assert_outcomes(passed=2)
    assert "baselines: 2 tests: 2 passed" in soaked.stdout.str(), soaked.stdout.str()
    assert [p.name for p in (pytester.path / "baselines").rglob("*.json")] == ["test_n.py_test_n_a-b.json"]
