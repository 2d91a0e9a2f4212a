"""The engine pool's stops (plugin mechanics, FAKE engines: tests/fake_engine.py). On a machine without a
GPU the engine that makes way for another stops in the background, beside the next one's start; it has
stopped before the next engine returns (so before anything is measured), and its errors are not lost."""

from types import SimpleNamespace

import pytest
from fake_engine import EventLog

from pytest_llmperf.engines.base import EnginePool

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


def test_a_restart_in_a_fresh_start_also_stops_the_old_one_in_the_background(log):
    pool = EnginePool(engines=ENGINES, stop_in_background=True)
    first = pool.get("fake", MODEL, {"id": "a", "log": log, "wait_s": 10.0})
    again = pool.restart(first)
    assert again is not first and log == ["start a", "start a", "stop a (beside a start)"]
    pool.close()
