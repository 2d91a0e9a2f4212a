"""The engine pool's stops and its groups side by side (plugin mechanics, FAKE engines: tests/fake_engine.py;
real vLLM engines side by side: test_side_by_side.py). On a machine without a GPU the engine that makes way
for another stops in the background, beside the next one's start; it has stopped before the next engine
returns (so before anything is measured), and its errors are not lost."""

from types import SimpleNamespace

import pytest
from fake_engine import EventLog, Outcomes, Together

from pytest_llmperf.engines.base import EngineError, EnginePool

MODEL = SimpleNamespace(name="fake-model")
ENGINES = {"fake": "fake_engine:FakeStoppingEngine"}


@pytest.fixture
def log():
    return EventLog()


def switch(pool, log, **first):
    """Starts engine a, then b (a makes way for it); returns the log as it stood when b was returned."""
    pool.get("fake", MODEL, {"id": "a", "log": log, **first})
    pool.get("fake", MODEL, {"id": "b", "log": log})
    return list(log)


def test_without_a_gpu_the_old_engine_stops_beside_the_next_start_and_before_it_is_used(log):
    pool = EnginePool(engines=ENGINES, stop_in_background=True)
    assert switch(pool, log, wait_s=10.0) == ["start a", "start b", "stop a (beside a start)"]
    pool.close()
    assert log[-1] == "stop b" and pool.starts == 2 and pool.times.seconds["engine stop"] >= 0


def test_with_a_gpu_the_old_engine_stops_before_the_next_starts(log):
    pool = EnginePool(engines=ENGINES)  # the next engine needs the device memory the old one holds
    assert switch(pool, log, wait_s=0.2) == ["start a", "stop a", "start b"]
    pool.close()


def test_a_failed_background_stop_fails_the_next_engines_start_and_close_still_stops_everything(log):
    pool = EnginePool(engines=ENGINES, stop_in_background=True)
    with pytest.raises(RuntimeError, match="worker did not exit"):
        switch(pool, log, wait_s=10.0, stop_error=RuntimeError("worker did not exit"))
    pool.close()
    assert log == ["start a", "start b", "stop a (beside a start)", "stop b"]


def test_a_stop_that_failed_still_waits_for_the_card_to_be_freed(log):
    """vLLM's stop timed out: the wait for the card's memory was skipped, and the next engine could start,
    or be measured, beside what the old one still held."""
    waited = []
    pool = EnginePool(after_close=lambda: waited.append(list(log)), engines=ENGINES)
    with pytest.raises(RuntimeError, match="shutdown timed out"):
        switch(pool, log, stop_error=RuntimeError("shutdown timed out"))
    assert waited == [["start a", "stop a"]]
    pool.close()


def test_a_restart_in_a_fresh_start_also_stops_the_old_one_in_the_background(log):
    pool = EnginePool(engines=ENGINES, stop_in_background=True)
    first = pool.get("fake", MODEL, {"id": "a", "log": log, "wait_s": 10.0})
    again = pool.restart(first)
    assert again is not first and log == ["start a", "start a", "stop a (beside a start)"]
    pool.close()


BESIDE = {"fake": "fake_engine:FakeBesideEngine", "single": "fake_engine:FakeStoppingEngine"}


def member(log, id_, **more):
    return ("fake", MODEL, {"id": id_, "log": log, "pid": ord(id_), **more})


def test_a_planned_group_starts_together_and_each_engine_is_handed_out_beside_the_others(log):
    pool = EnginePool(engines=BESIDE)
    together = Together(3)  # passed only if the three starts run at once
    group = [member(log, id_, together=together, start_s=0.2) for id_ in "abc"]
    pool.plan([group])
    first = pool.get(*group[0])
    # the time to verdict counts the group's start once, as wall time; each start keeps its own seconds
    assert pool.times.seconds["engine start"] < 0.6 * sum(seconds for *_, seconds in pool.start_seconds)
    # every member began before any had ended, and all had started before the first was handed out
    assert sorted(log[:3]) == ["begin a", "begin b", "begin c"] and sorted(log[3:]) == ["start a", "start b", "start c"]
    assert pool.beside(first) == {ord("b"), ord("c")} and pool.starts == 3
    assert pool.get(*group[1]) is not first and len(log) == 6  # handed out, not started again
    assert pool.live(first) is first
    pool.get("single", MODEL, {"id": "d", "log": log})  # another configuration: the group stops first
    assert sorted(log[6:9]) == ["stop a", "stop b", "stop c"] and log[9] == "start d"
    assert pool.beside(first) == frozenset()
    # a member asked for again (a re-measurement after the group stopped) starts alone, not with the group
    again = pool.get(*group[0])
    assert again is not first and log[-3:] == ["stop d", "begin a", "start a"] and pool.starts == 5
    assert log.count("begin b") == log.count("begin c") == 1
    pool.close()
    assert log[-1] == "stop a"


def test_a_member_that_fails_to_start_beside_the_others_stops_the_group_and_engines_start_one_at_a_time(log):
    """An engine may not start beside others (the card's memory): its neighbours stop, the session goes on
    one engine at a time, and the failing configuration fails its own test, alone, with its own error."""
    pool = EnginePool(engines=BESIDE)
    broken = member(log, "b", start_error=RuntimeError("no memory"))
    group = [member(log, "a"), broken]
    pool.plan([group])
    with pytest.warns(UserWarning, match=r"not started side by side \(RuntimeError: no memory\).*one at a time"):
        a = pool.get(*group[0])
    # b tried once more beside a (a passing fault would have cleared), then the group stopped
    assert sorted(log[:3]) == ["begin a", "begin b", "start a"] and log[3:] == ["begin b", "stop a", "begin a", "start a"]
    assert pool.beside(a) == frozenset()
    with pytest.raises(RuntimeError, match="no memory"):
        pool.get(*broken)
    assert log[-2:] == ["stop a", "begin b"]  # tried alone: the engine before it stopped first
    pool.close()


def test_a_member_whose_start_beside_the_others_failed_once_is_started_again_beside_them(log):
    """A passing fault (two engine cores' sockets racing for one port) costs one start, not side by side for
    the rest of the session: the failed member starts again beside the started ones, and no warning is given."""
    import warnings

    from pytest_llmperf.engines.base import SideBySideWarning

    pool = EnginePool(engines=BESIDE)
    flaky = member(log, "b", start_errors=Outcomes([OSError("EADDRINUSE: address already in use"), None]))
    group = [member(log, "a"), flaky, member(log, "c")]
    pool.plan([group])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SideBySideWarning)
        a = pool.get(*group[0])
    assert log.count("begin b") == 2 and log.count("begin a") == log.count("begin c") == 1 and "stop a" not in log
    assert pool.beside(a) == {ord("b"), ord("c")} and pool.starts == 3
    b = pool.get(*flaky)
    assert pool.beside(b) == {ord("a"), ord("c")} and log.count("begin b") == 2
    pool.close()
    assert sorted(log[-3:]) == ["stop a", "stop b", "stop c"]


def test_a_warning_made_an_error_still_leaves_the_session_one_engine_at_a_time(log):
    """Under `-W error` the warning is raised: the group is stopped and the plan dropped before it is."""
    import warnings

    from pytest_llmperf.engines.base import SideBySideWarning

    pool = EnginePool(engines=BESIDE)
    group = [member(log, "a"), member(log, "b", start_error=RuntimeError("no memory"))]
    pool.plan([group])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SideBySideWarning)
        with pytest.raises(SideBySideWarning):
            pool.get(*group[0])
    assert log[-1] == "stop a"
    pool.get(*group[0])
    assert log[-2:] == ["begin a", "start a"] and log.count("begin b") == 2  # beside a, then once more
    pool.close()


def test_a_group_whose_memory_nvml_cannot_tell_apart_is_stopped_and_engines_start_one_at_a_time(log):
    """In a container without the host's process ids NVML charges an engine's processes nothing: no
    neighbour's memory could be taken off the card's reading, so no engine may start beside another."""
    pool = EnginePool(engines=BESIDE)
    seen = []
    pool.check_beside = lambda engines: seen.append(engines) or "NVML charges no memory to the engine processes"
    groups = [[member(log, "a"), member(log, "b")], [member(log, "c"), member(log, "d")]]
    pool.plan(groups)
    with pytest.warns(UserWarning, match="NVML charges no memory"):
        a = pool.get(*groups[0][0])
    assert seen == [[{ord("a")}, {ord("b")}]] and pool.beside(a) == frozenset()
    pool.get(*groups[1][0])  # the next group too starts one engine at a time
    assert log[-3:] == ["stop a", "begin c", "start c"] and "begin d" not in log
    pool.close()


def test_a_sigterm_swallowed_while_a_group_is_checked_starts_no_engine_after_it(log):
    """SIGTERM's exit is an `Exception`: landing in the group's NVML check, it was taken for one more reason to
    start the engines one at a time, and a new engine started after the job was cancelled. The handler refuses
    every start first (activation), so the test fails with the reason and the session ends at its boundary."""

    def signalled(engines):
        pool.refuse_starts("llmperf: terminated by SIGTERM")
        raise Exception("pytest.exit's Exit, swallowed by the check's except")  # noqa: TRY002 - Exit is one

    pool = EnginePool(engines=BESIDE)
    pool.check_beside = signalled
    group = [member(log, "a"), member(log, "b")]
    pool.plan([group])
    with pytest.warns(UserWarning, match="swallowed"), \
            pytest.raises(EngineError, match="fake engine not started: llmperf: terminated by SIGTERM"):
        pool.get(*group[0])
    begun = [e for e in log if e.startswith("begin")]
    assert sorted(begun) == ["begin a", "begin b"] and pool.starts == 2, log  # the group only, then nothing
    pool.close()
    assert sorted(log[-2:]) == ["stop a", "stop b"]


def test_a_session_interrupted_while_a_group_starts_still_stops_every_engine_of_it(log, monkeypatch):
    """Ctrl-C reaches the main thread while it waits for the group's starts: the starts go on in their
    threads, and closing the pool waits for them and stops what they started."""
    from pytest_llmperf.engines import base

    def interrupted(futures):
        raise KeyboardInterrupt

    pool = EnginePool(engines=BESIDE)
    group = [member(log, "a", start_s=0.2), member(log, "b", start_s=0.2)]
    pool.plan([group])
    monkeypatch.setattr(base, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.get(*group[0])
    monkeypatch.undo()
    again = pool.get(*group[0])  # a session that goes on (pytest-timeout's Failed): the started two stop first
    assert sorted(log[-4:-2]) == ["stop a", "stop b"] and log[-2:] == ["begin a", "start a"]
    pool.close()
    assert log[-1] == "stop a" and pool.beside(again) == frozenset()


def test_a_member_that_fails_to_start_again_alone_fails_its_test_and_the_group_stays_planned(log):
    """Started again alone (a re-measurement), a member's error is its own: raised as it is, side by side
    kept for the others."""
    import warnings

    from pytest_llmperf.engines.base import SideBySideWarning

    pool = EnginePool(engines=BESIDE)
    group = [member(log, "a", start_errors=Outcomes([None, RuntimeError("gone")])), member(log, "b")]
    pool.plan([group])
    a, b = pool.get(*group[0]), pool.get(*group[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SideBySideWarning)
        with pytest.raises(RuntimeError, match="gone"):
            pool.restart(a)
    assert pool.get(*group[1]) is b and pool.beside(b) == frozenset()
    pool.close()


def test_a_restarted_or_broken_member_is_replaced_beside_the_others(log):
    pool = EnginePool(engines=BESIDE)
    group = [member(log, "a"), member(log, "b")]
    pool.plan([group])
    a = pool.get(*group[0])
    b = pool.get(*group[1])
    again = pool.restart(a)
    assert again is not a and pool.get(*group[1]) is b and log[-3:] == ["stop a", "begin a", "start a"]
    pool.discard(b)
    assert pool.beside(again) == frozenset() and pool.get(*group[1]) is not b
    assert log[-2:] == ["begin b", "start b"]  # b alone: a still runs beside it
    pool.close()


def test_a_broken_member_is_stopped_before_its_place_is_taken_and_is_no_neighbour_meanwhile(log):
    """A member that broke without the pool being told (a core that died idle; a stuck engine) was replaced
    unstopped, its processes keeping their memory to the session's end, and its processes were still named as
    a neighbour's; a group overlapping a started one started its running member a second time. FAKE engines."""
    pool = EnginePool(engines=BESIDE)
    a, b, c = (member(log, i) for i in "abc")
    pool.plan([[a, b], [a, c]])
    first = pool.get(*a)
    second = pool.get(*b)
    second.alive = False  # broke, the pool not told
    assert pool.beside(first) == frozenset()
    assert pool.get(*b) is not second and log.count("stop b") == 1  # stopped, then started again
    pool._drop_beside(pool.get(*b))  # b's engine discarded; c, of a's other group, asked for
    assert pool.get(*c) and pool.get(*a) is first and log.count("begin a") == 1
    pool.close()
    assert log.count("stop a") == 1


def test_a_group_of_engines_that_cannot_start_beside_another_is_not_planned(log):
    pool = EnginePool(engines=BESIDE)
    group = [("single", MODEL, {"id": "a", "log": log}), ("single", MODEL, {"id": "b", "log": log})]
    pool.plan([group])
    pool.get(*group[0])
    pool.get(*group[1])
    assert log == ["start a", "stop a", "start b"]
    pool.close()


def test_vllm_engines_may_be_planned_side_by_side_in_either_topology(monkeypatch):
    """AsyncLLM runs its engine core in a process of its own whatever VLLM_ENABLE_V1_MULTIPROCESSING says (that
    setting picks the executor inside it), so NVML can tell each engine's memory from its neighbours' in both
    (tests/test_vllm_engine.py checks the process a real engine names)."""
    from pytest_llmperf.engines.vllm import VLLMEngine

    for multiprocessing in ("0", "1"):
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)
        assert VLLMEngine.starts_beside()
