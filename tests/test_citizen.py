"""A good pytest citizen: installed beside a project that never uses it, the plugin changes nothing in
that project's sessions (its environment, its signal handlers, its -n); a session that uses it still
gets its GPU claimed, with the clear error it always had."""

import signal

import pytest

# A fake NVML (named as such): the plugin sees one H200, so that the GPU claim of a one-GPU machine
# can be exercised on a machine without one. Nothing here starts an engine.
FAKE_ONE_GPU = """
import pytest_llmperf.gpu as gpu
from pytest_llmperf.gpu import GpuInfo

gpu.device_count = lambda: 1
gpu.memory_used = lambda index: 0
gpu.detect = lambda index=0: GpuInfo(index, "NVIDIA H200", "h200", 139.8, "580.0", "13.0", "9.0")
"""

UNRELATED = """
import os
import signal

import pytest


def test_environment_untouched(worker_id):
    with open(f"seen-{worker_id}", "w") as f:
        f.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} {signal.getsignal(signal.SIGTERM)!r}")


def test_other(worker_id):
    assert worker_id.startswith("gw")
"""


def test_a_project_that_never_uses_the_plugin_runs_with_n_2_on_a_one_gpu_machine(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    pytester.makeconftest(FAKE_ONE_GPU)
    pytester.makepyfile(test_unrelated=UNRELATED)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    seen = [p.read_text() for p in pytester.path.glob("seen-*")]
    assert seen == [f"0 {signal.SIG_DFL!r}"], seen  # CUDA_VISIBLE_DEVICES as it was, no SIGTERM handler
    assert "llmperf:" not in result.stdout.str()  # not even a header line


def test_a_session_that_uses_the_plugin_claims_a_gpu_per_worker(pytester, monkeypatch):
    """The claim is still made, and still refuses two workers on one card, when a test uses the plugin:
    that test errors with what to do, and the worker's other tests still run (`--dist each` sends every
    test to both workers, so the second worker surely meets it)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    pytester.makeconftest(FAKE_ONE_GPU)
    pytester.makepyfile(test_perf="def test_uses(llmperf):\n    pass\n",
                        test_unrelated=UNRELATED)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "each", "-p", "no:cacheprovider", "-p", "no:randomly",
                                           "-rE")
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(["llmperf: pytest-xdist worker gw1 needs 1 GPU of its own and has 0: 1 visible (0), "
                                 "1 per worker; run with -n 1 or fewer", "ERROR test_perf.py::test_uses - *"])


# A fake NVML (named as such): four H200s, for the claim of tensor-parallel engines. No engine starts.
FAKE_FOUR_GPUS = FAKE_ONE_GPU.replace("gpu.device_count = lambda: 1", "gpu.device_count = lambda: 4")

TENSOR_PARALLEL = """
import os

import pytest


@pytest.mark.llmperf_engine(tensor_parallel_size=2)
def test_tp2(llmperf_session, worker_id):
    with open(f"claimed-{worker_id}", "w") as f:
        f.write(f"{os.environ['CUDA_VISIBLE_DEVICES']} {[g.index for g in llmperf_session.gpus]}")


def test_tp1(llmperf):
    pass
"""


def test_workers_claim_as_many_gpus_as_the_largest_engine_of_the_selection_spreads_over(pytester, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(FAKE_FOUR_GPUS)
    pytester.makepyfile(test_tp=TENSOR_PARALLEL)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "each", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4)
    claimed = sorted(p.read_text() for p in pytester.path.glob("claimed-*"))
    assert claimed == ["0,1 [0, 1]", "2,3 [2, 3]"]  # disjoint pairs, one per worker
    # three workers on four cards: one card each, and the TP=2 test errors at setup with what to do
    result = pytester.runpytest_subprocess("-n", "3", "--dist", "each", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=3, errors=3)
    result.stdout.fnmatch_lines(["*test_tp2*its engine spreads over 2 GPUs (tensor x pipeline parallel) and this worker "
                                 "has 1: run with fewer pytest-xdist workers (-n), --llmperf-gpus-per-worker=2, or on a "
                                 "machine with more GPUs*"])
    # asked for two each, the third worker finds no pair of its own: its plugin tests error, the others run
    result = pytester.runpytest_subprocess("-n", "3", "--dist", "each", "--llmperf-gpus-per-worker=2", "-p",
                                           "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(["*worker gw2 needs 2 GPUs of its own and has 0: 4 visible (0, 1, 2, 3), 2 per worker; "
                                 "run with -n 2 or fewer*"])


def test_a_soak_claims_gpus_sized_by_the_tests_it_collected(pytester, monkeypatch):
    """`--llmperf-soak` made the plugin claim its GPUs before any test was collected, sized as if none asked
    for more than one: a tensor-parallel test then failed at its setup, one card short, in every round."""
    pytest.importorskip("psutil")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):  # the inner session is no xdist worker of ours
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(FAKE_FOUR_GPUS + "import pytest_llmperf.soak as soak\nsoak.memory_used = gpu.memory_used\n")
    pytester.makepyfile(test_tp=TENSOR_PARALLEL.replace("os.environ['CUDA_VISIBLE_DEVICES']", "'-'"))
    result = pytester.runpytest_subprocess("--llmperf-soak=2", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4)  # two tests, two rounds
    assert [p.read_text() for p in pytester.path.glob("claimed-*")] == ["- [0, 1]"]  # the first two cards


def test_a_session_whose_plugin_tests_were_all_deselected_keeps_its_gpus_and_signals(pytester, monkeypatch):
    """`-k`/`-m` deselect after the plugin saw the collection: it claimed each worker's GPUs all the same, and the
    project's own GPU tests that were selected ran on one card a worker instead of the four they were given."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(FAKE_FOUR_GPUS)
    pytester.makepyfile(test_tp=TENSOR_PARALLEL, test_own="""
import os
import signal

def test_own_gpu_test(worker_id):
    with open(f"own-{worker_id}", "w") as f:
        f.write(f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}")
""")
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "each", "-k", "own", "-p", "no:cacheprovider",
                                           "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert sorted(p.read_text() for p in pytester.path.glob("own-*")) == ["None True", "None True"]
    # selected beside a plugin test, the claim stands
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "each", "-k", "own or tp1", "-p", "no:cacheprovider",
                                           "-p", "no:randomly")
    result.assert_outcomes(passed=4)
    assert sorted(p.read_text() for p in pytester.path.glob("own-*")) == ["0 False", "1 False"]


def test_gpus_per_worker_can_be_given_and_is_checked_at_start(pytester):
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest_inprocess("--llmperf-gpus-per-worker=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--llmperf-gpus-per-worker/llmperf_gpus_per_worker='0': give a number of GPUs, 1 or more" in result.stderr.str()


@pytest.mark.parametrize("option, message", [
    ("llmperf_retries=two", "--llmperf-retries/llmperf_retries='two': give the number of extra measurements"),
    ("llmperf_engine=foo", "llmperf_engine='foo': choose one of hf, openai, vllm"),
    ("llmperf_tolerance=abc", "tolerance 'abc': give a fraction >= 0"),
    ("llmperf_server_config=[1]", "--llmperf-server-config/llmperf_server_config must be a JSON object"),
    ("llmperf_engine_config={", "--llmperf-engine-config/llmperf_engine_config is not JSON"),
    ('llmperf_engine_config={"tensor_parallel_size": "auto"}',
     "--llmperf-engine-config/llmperf_engine_config: tensor_parallel_size='auto' must be a whole number of GPUs"),
    ("llmperf_warmup=x", "llmperf_warmup='x': choose one of auto, quick, steady"),
    ("llmperf_side_by_side=always", "llmperf_side_by_side='always': choose one of auto, on, off"),
    ("llmperf_baseline=strict", "llmperf_baseline='strict': choose one of"),
    ("llmperf_paging=loose", "llmperf_paging='loose': choose one of"),
    ("llmperf_report=test_a.py", "test_a.py is a file, not a folder"),
    ("llmperf_model=shape:nonexistent", "--llmperf-model/llmperf_model: unknown model shape 'nonexistent': choose one of"),
    ("llmperf_model=./no-such-model", "--llmperf-model/llmperf_model: model './no-such-model' is neither a folder"),
])
def test_bad_ini_values_are_usage_errors_naming_the_value(pytester, option, message):
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest_inprocess("-o", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str(), result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


@pytest.mark.parametrize("limit", ["-5", "nan", "0"])
def test_a_soak_limit_that_is_not_a_positive_number_is_a_usage_error(pytester, limit):
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    result = pytester.runpytest_inprocess("--llmperf-soak", "2", f"--llmperf-soak-limit-mib={limit}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--llmperf-soak-limit-mib" in result.stderr.str() and "a number above 0" in result.stderr.str()


def test_a_local_model_folder_is_stored_by_its_name_never_its_path(tmp_path):
    from pytest_llmperf.models import stored_name

    folder = tmp_path / "private" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    assert stored_name(str(folder)) == "local:Llama-3.1-8B" and str(tmp_path) not in stored_name(str(folder))
    assert stored_name("shape:llama-3.1-8b") == "shape:llama-3.1-8b"
    assert stored_name("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    # a snapshot in Hugging Face's cache is named for its revision: it is stored as the hub id it came from
    snapshot = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B" / "snapshots" / "0e9e39f249a16976918f6564b8830bc894c89659"
    snapshot.mkdir(parents=True)
    assert stored_name(str(snapshot)) == "meta-llama/Llama-3.1-8B"


def test_the_header_says_what_will_be_judged_before_anything_starts(pytester):
    pytester.makepyfile(test_a="def test_a():\n    pass\n")
    (pytester.path / "baselines" / "h200" / "shape_tiny-llama").mkdir(parents=True)
    (pytester.path / "baselines" / "h200" / "shape_tiny-llama" / "t.json").write_text("{}")
    empty = pytester.runpytest_inprocess("--llmperf-hardware=a100", "--llmperf-engine=hf", "--llmperf-baseline=require")
    empty.stdout.fnmatch_lines(["llmperf: engine hf, model shape:tiny-llama, hardware a100, baseline require: 0 stored "
                                "in baselines/a100/shape_tiny-llama/ (classes stored: h200)"])
    found = pytester.runpytest_inprocess("--llmperf-hardware=h200", "--llmperf-engine=hf")
    found.stdout.fnmatch_lines(["llmperf: engine hf, model shape:tiny-llama, hardware h200, baseline compare: 1 stored "
                                "in baselines/h200/shape_tiny-llama/"])
