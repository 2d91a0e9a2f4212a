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


def test_a_soak_of_zero_rounds_is_a_usage_error(pytester):
    pytester.makepyfile(test_s="def test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("--llmperf-soak=0", "-p", "no:cacheprovider")
    assert result.ret == 4 and "--llmperf-soak=0: give the number of rounds" in result.stderr.str()
