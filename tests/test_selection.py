"""Hardware selection: `-m CLASS` selects every test that uses the plugin and names no other class."""

import pytest

SUITE = """
import pytest

def test_any(llmperf):
    pass

@pytest.mark.max_p99_ms(ttft=100)
def test_limit_only():
    pass

@pytest.mark.h200
def test_h200_only(llmperf):
    pass

def test_not_ours():
    pass
"""


def selected(pytester, *args):
    result = pytester.runpytest_inprocess("--co", "-q", *args)
    return [line for line in result.outlines if "::" in line], result


def test_unmarked_plugin_tests_carry_this_machines_class(pytester):
    pytester.makepyfile(test_s=SUITE)
    names, _ = selected(pytester, "-m", "cpu")
    assert names == ["test_s.py::test_any", "test_s.py::test_limit_only"]
    names, _ = selected(pytester, "-m", "h200", "--llmperf-hardware", "h200")
    assert names == ["test_s.py::test_any", "test_s.py::test_limit_only", "test_s.py::test_h200_only"]
    names, _ = selected(pytester, "-m", "a100 or h200", "--llmperf-hardware", "a100")
    assert names == ["test_s.py::test_any", "test_s.py::test_limit_only", "test_s.py::test_h200_only"]


def test_a_hardware_class_given_in_capitals_is_the_lower_case_class_and_a_bad_name_a_usage_error(pytester):
    pytester.makepyfile(test_s=SUITE)
    names, _ = selected(pytester, "-m", "h200", "--llmperf-hardware", "H200")
    assert names == ["test_s.py::test_any", "test_s.py::test_limit_only", "test_s.py::test_h200_only"]
    _, result = selected(pytester, "--llmperf-hardware", "h200 sxm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-hardware/llmperf_hardware='h200 sxm': a hardware class is a name of letters*"])


def test_a_selection_that_finds_nothing_says_why(pytester):
    pytester.makepyfile(test_s=SUITE)
    names, result = selected(pytester, "-m", "a100")
    assert names == [] and result.ret == 5
    result.stdout.fnmatch_lines(["llmperf: -m 'a100' selected no test: this machine is cpu (tests that name no hardware "
                                 "carry it), and the tests carry cpu (2), h200 (1); select with -m cpu, or judge this "
                                 "machine as another class with --llmperf-hardware a100"])
    assert "selected no test" not in selected(pytester, "-m", "not a100")[1].stdout.str()


def test_a_test_marked_for_other_hardware_is_skipped_with_the_reason(pytester):
    pytester.makepyfile(test_s=SUITE)
    result = pytester.runpytest_inprocess("-rs", "-k", "h200_only")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs h200 hardware; this machine is cpu (override with --llmperf-hardware)*"])


ORDER = """
import pytest

def test_hf_first(hf_engine_factory, llmperf):
    pass

@pytest.mark.llmperf_engine(block_size=64)
def test_own_engine(vllm_engine, llmperf):
    pass

@pytest.mark.llmperf_model("shape:tiny-llama")
def test_pinned(llm_engine, llmperf):
    pass

def test_default(llm_engine, llmperf):
    pass

@pytest.mark.llmperf_engine(block_size=64)
def test_own_engine_again(vllm_engine, llmperf):
    pass
"""


def test_tests_sharing_an_engine_run_together_and_on_a_gpu_in_process_engines_run_last(pytester):
    """Each engine configuration (options and model) starts once. Where there is a GPU, transformers, whose
    CUDA context stays in the test process and would count in every later engine's device memory, runs
    after the others, and its configuration's group runs last so that the group's vLLM engine is not
    started twice; on this CPU nothing is held, so it keeps its place in its configuration's group."""
    pytester.makepyfile(test_o=ORDER)
    names, _ = selected(pytester, "-p", "no:randomly")
    assert [n.split("::")[1] for n in names] == ["test_own_engine", "test_own_engine_again", "test_hf_first",
                                                  "test_default", "test_pinned"]
    from pytest_llmperf.selection import engine_order

    items = pytester.getitems(ORDER)
    order = engine_order(items, in_process_last=True)
    on_gpu = sorted(items, key=lambda item: order[item.nodeid])
    # the default configuration's engine, started for test_default, is still live for test_hf_first
    assert [i.name for i in on_gpu] == ["test_own_engine", "test_own_engine_again", "test_pinned", "test_default",
                                        "test_hf_first"]


def case(name, *marks, fixtures="vllm_engine, llmperf"):
    """One test function of a module for pytester, with its markers (source text)."""
    return "".join(f"@{mark}\n" for mark in marks) + f"def {name}({fixtures}):\n    pass\n"


def engine(**options):
    return "pytest.mark.llmperf_engine(" + ", ".join(f"{k}={v!r}" for k, v in options.items()) + ")"


def module(gate, *cases):
    return f"import pytest\n\nPAGING = pytest.mark.llmperf_gate({gate})\n\n" + "\n".join(cases)


BESIDE = module(
    '"paging", "memory"',
    case("test_paging_a", "PAGING", engine(block_size=16, num_gpu_blocks_override=64)),
    case("test_timed", fixtures="llm_engine, llmperf"),
    case("test_paging_b", "PAGING", engine(block_size=32, num_gpu_blocks_override=32)),
    case("test_paging_b_again", "PAGING", engine(block_size=32, num_gpu_blocks_override=32)),
    case("test_no_engine", fixtures=""),
    case("test_paging_by_memory", "PAGING", engine(enable_prefix_caching=True)),
    case("test_timed_fixed_budget", engine(block_size=64, num_gpu_blocks_override=16)),
    case("test_paging_with_a_factory", "PAGING", engine(block_size=64, num_gpu_blocks_override=16),
         fixtures="vllm_engine, hf_engine_factory, llmperf"),
)


def test_engines_of_paging_only_tests_with_a_fixed_budget_are_planned_side_by_side_and_run_one_after_another(pytester):
    """Only tests whose baseline gates no timing and whose engine has a fixed KV budget may share the card
    with their neighbours' engines; side by side, the sort puts them after the other engines' tests, so that
    they follow one another, and the planned group holds each configuration once."""
    from pytest_llmperf.selection import engine_order, side_by_side_groups

    items = pytester.getitems(BESIDE)
    order = engine_order(items, in_process_last=True, beside_last=True, engine_name="vllm", engines={"vllm", "hf"})
    ran = sorted(items, key=lambda item: order[item.nodeid])
    assert [i.name for i in ran] == ["test_paging_by_memory", "test_timed", "test_no_engine", "test_paging_a",
                                     "test_paging_b", "test_paging_b_again", "test_timed_fixed_budget",
                                     "test_paging_with_a_factory"]
    groups = side_by_side_groups(ran, "vllm", {"vllm", "hf"})
    assert groups == [[("vllm", None, {"block_size": 16, "num_gpu_blocks_override": 64}),
                       ("vllm", None, {"block_size": 32, "num_gpu_blocks_override": 32})]]
    # a test between them that asks for another engine ends a run; one that uses none does not
    assert side_by_side_groups(items, "vllm", {"vllm", "hf"}) == []
    assert len(side_by_side_groups([items[i] for i in (0, 4, 2)], "vllm", {"vllm", "hf"})[0]) == 2


SHARED = module(
    '"paging"',
    case("test_a", "PAGING", engine(block_size=16, num_gpu_blocks_override=64)),
    case("test_skipped", "PAGING", 'pytest.mark.skip(reason="not here")', engine(block_size=256, num_gpu_blocks_override=8)),
    case("test_skipped_if", "PAGING", 'pytest.mark.skipif(condition=True, reason="not here either")',
         engine(block_size=1024, num_gpu_blocks_override=8)),
    case("test_other_hardware", "PAGING", "pytest.mark.h100", engine(block_size=512, num_gpu_blocks_override=8)),
    case("test_c", "PAGING", engine(block_size=64, num_gpu_blocks_override=16)),
    case("test_e", "PAGING", engine(block_size=8, num_gpu_blocks_override=8)),
    case("test_b", "PAGING", engine(block_size=32, num_gpu_blocks_override=32)),
    case("test_limited", "PAGING", "pytest.mark.max_p99_ms(ttft=100)", engine(block_size=128, num_gpu_blocks_override=8)),
    case("test_timed_b", engine(block_size=32, num_gpu_blocks_override=32)),
    case("test_timed_pair", engine(block_size=8, num_gpu_blocks_override=8), fixtures="hf_engine, vllm_engine, llmperf"),
    case("test_timed_pinned", 'pytest.mark.llmperf_model("shape:tiny-llama")',
         engine(block_size=64, num_gpu_blocks_override=16)),
)


def test_a_configuration_some_test_times_is_never_planned_nor_one_whose_tests_will_be_skipped(pytester):
    """The pool hands out one engine per configuration: one that a timed test also uses (by its baseline
    or by a limit such as max_p99_ms; one engine of several or the session's model named as its own) must be
    found alone, so it is never in a group, and the sort keeps it out of the groups' block; tests that will
    be skipped start no engine and do not end a run."""
    from pytest_llmperf.selection import engine_order, side_by_side_groups

    engines = {"vllm", "hf"}
    items = pytester.getitems(SHARED)
    a, c = (("vllm", None, {"block_size": b, "num_gpu_blocks_override": n}) for b, n in ((16, 64), (64, 16)))
    assert side_by_side_groups(items, "vllm", engines, "cpu") == [[a, c]]
    # on the hardware the test names, it is planned too
    assert len(side_by_side_groups(items, "vllm", engines, "h100")[0]) == 3
    # test_c's configuration is test_timed_pinned's where the session's model is the one that test names
    assert side_by_side_groups(items, "vllm", engines, "cpu", "shape:tiny-llama") == []
    order = engine_order(items, in_process_last=True, beside_last=True, engine_name="vllm", engines=engines)
    ran = sorted(items, key=lambda item: order[item.nodeid])
    names = [i.name for i in ran]
    assert names.index("test_b") < min(names.index("test_a"), names.index("test_c"))  # not inside their block
    assert side_by_side_groups(ran, "vllm", engines, "cpu") == [[a, c]]


def test_engines_start_side_by_side_with_a_gpu_or_when_asked_and_never_in_an_xdist_worker():
    """A pytest-xdist worker collects every test but runs those the controller sends: it cannot plan. A
    session that a test of such a worker starts is no worker, although it inherits its environment."""
    from pathlib import Path

    from pytest_llmperf.gating import GateConfig
    from pytest_llmperf.session import Session

    def session(mode, gpus=(), worker=False):
        return Session("vllm", "shape:tiny-llama", {}, "cpu", None, GateConfig("off", Path("."), 0.1, "cpu", "m"),
                       gpus=gpus, side_by_side=mode, xdist_worker=worker)

    assert [session(m).starts_side_by_side for m in ("auto", "on", "off")] == [False, True, False]
    assert session("auto", gpus=("a card",)).starts_side_by_side
    assert not session("on", worker=True).starts_side_by_side


def test_a_planned_configuration_that_cannot_be_resolved_is_left_out_for_its_test_to_fail_alone(tmp_path):
    """Planning runs at the end of collection: a test's model folder without config.json, or an engine
    that does not import, must fail that test at its setup, not the session."""
    from pytest_llmperf.engines.base import config_key
    from pytest_llmperf.gating import GateConfig
    from pytest_llmperf.session import Session

    state = Session("vllm", "shape:tiny-llama", {}, "cpu", None, GateConfig("off", tmp_path, 0.1, "cpu", "m"),
                    engines={"vllm": "pytest_llmperf.engines.vllm:VLLMEngine", "broken": "no_such_module:Engine"})
    budget = {"num_gpu_blocks_override": 8}
    state.plan_side_by_side([[("vllm", str(tmp_path), budget), ("broken", None, budget),
                              ("vllm", None, {**budget, "block_size": 32}), ("vllm", None, {**budget, "block_size": 64})]])
    model = state.model()
    planned = {config_key("vllm", model, {**budget, "block_size": b}) for b in (32, 64)}
    assert set(state.pool._groups) == planned
