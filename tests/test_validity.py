"""Validity verdicts: a result the client could not measure (it fell behind its arrival schedule) is
neither judged nor gated, and says what to change. The late client below is a FAKE engine that stamps
its own submission times: plugin mechanics, not evidence about an engine adapter."""

import dataclasses

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace
from pytest_llmperf.trace_replay import TraceInfo
from pytest_llmperf.validity import LATE_S, behind_schedule, saturated, schedule_lags, why_invalid

TIMED = Workload.poisson(qps=10, n=40, prompt_len=8, output_len=4, seed=1)


def sent(workload, late, ttft=lambda i: 0.1):
    """A pass whose request i was sent `late(i)` seconds after its time and answered `ttft(i)` later."""
    seqs = tuple(SequenceTrace(i, 0, r.prompt_len, r.output_len, 5.0 + r.arrival_s + late(i),
                               (Chunk(5.0 + r.arrival_s + late(i) + ttft(i), r.output_len),))
                 for i, r in enumerate(workload.requests))
    return RunTrace("fake", seqs, 5.0, 10.0)


def test_lags_are_measured_against_the_schedule_of_timed_workloads_only():
    assert schedule_lags(sent(TIMED, lambda i: 0.01), TIMED) == pytest.approx([0.01] * 40)
    offline = Workload.offline(4, 8, 4)
    loop = Workload.closed_loop(2, 4, 8, 4)
    assert schedule_lags(sent(offline, lambda i: 1.0), offline) == schedule_lags(sent(loop, lambda i: 1.0), loop) == []


def test_a_pass_with_more_than_one_request_in_twenty_late_is_invalid_and_says_what_to_change():
    assert behind_schedule([sent(TIMED, lambda i: 0.05)], TIMED) == ""  # within the bound
    assert behind_schedule([sent(TIMED, lambda i: 0.3 if i < 2 else 0.0)], TIMED) == ""  # 2 of 40: a stall
    why = behind_schedule([sent(TIMED, lambda i: 0.0), sent(TIMED, lambda i: 0.02 * i)], TIMED)
    assert why.startswith("the client fell behind its arrival schedule in pass 2 of 2: 34 of 40 requests were sent "
                          f"more than {LATE_S * 1e3:.0f} ms late (at worst 780 ms)")
    assert "fewer requests per second" in why


LATE_CLIENT = """
import pytest
from pytest_llmperf import Workload
from pytest_llmperf.engines.base import Engine
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace


class LateClient(Engine):
    '''FAKE: every request is sent `late` seconds after its time.'''
    name, version, max_model_len, vocab_size, model = "fake", "0", 4096, 1000, None

    def __init__(self, late):
        self.late = late

    @property
    def config(self):
        return {}

    def run(self, workload, salt=0):
        seqs = tuple(SequenceTrace(i, 0, r.prompt_len, r.output_len, r.arrival_s + self.late,
                                   (Chunk(r.arrival_s + self.late + 0.01, r.output_len),))
                     for i, r in enumerate(workload.requests))
        return RunTrace("fake", seqs, 0.0, workload.requests[-1].arrival_s + self.late + 0.02)

    def shutdown(self):
        pass


W = Workload.poisson(qps=10, n=20, prompt_len=8, output_len=4, seed=1)


@pytest.mark.max_p99_ms(ttft=10_000)
def test_late(llmperf):
    llmperf.run(LateClient(0.3), W, warmup=False)


@pytest.mark.max_p99_ms(ttft=10_000)
def test_on_time(llmperf):
    llmperf.run(LateClient(0.0), W, warmup=False)
"""


def test_an_invalid_result_fails_with_its_own_status_and_writes_no_baseline(pytester):
    pytester.makepyfile(test_late=LATE_CLIENT)
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", "--llmperf-baseline=update",
                                           "--llmperf-report=report", timeout=300)
    out = result.stdout.str()
    assert "test_late.py::test_late PERF-INVALID" in out and "test_late.py::test_on_time PASSED" in out, out[-3000:]
    assert "not a valid measurement (neither judged nor gated, no baseline written)" in out
    assert "the client fell behind its arrival schedule: 20 of 20 requests were sent more than 100 ms late" in out
    stored = {p.name for p in (pytester.path / "baselines").rglob("*.json")}
    assert stored == {"test_late.py_test_on_time.json"}, stored
    assert "| **INVALID** |" in (pytester.path / "report" / "summary.md").read_text()


def test_ttft_rising_to_the_end_of_an_open_loop_run_is_saturation_and_says_what_to_change():
    on_time = lambda i: 0.0  # noqa: E731
    growing = sent(TIMED, on_time, lambda i: 0.05 + 0.01 * i)  # the queue grows by one request's worth each arrival
    why = saturated([sent(TIMED, on_time), growing], TIMED)
    assert why.startswith("the engine saturated under this open-loop load in pass 2 of 2: median TTFT rose from "
                          "95.0 ms (first quarter of arrivals) to 395.0 ms (last quarter)"), why
    assert "rank correlation with arrival time 1.00" in why and "fewer requests per second" in why
    assert why_invalid([growing], TIMED) == saturated([growing], TIMED) != ""
    # a run that is behind its schedule says that first: the late client explains the rest
    assert why_invalid([sent(TIMED, lambda i: 0.3, lambda i: 0.05 + 0.01 * i)], TIMED).startswith("the client fell")


def test_the_advice_names_the_knob_of_the_workload_at_hand():
    """A Poisson load slows down by its qps; a replayed trace by its time_scale (Workload.poisson takes none)."""
    replay = dataclasses.replace(TIMED, trace=TraceInfo("trace.jsonl", 0, 0))
    for workload, knob, other in ((TIMED, "a lower qps", "time_scale"),
                                  (replay, "a larger time_scale in Workload.from_trace", "qps")):
        late = behind_schedule([sent(workload, lambda i: 0.02 * i)], workload)
        rising = saturated([sent(workload, lambda i: 0.0, lambda i: 0.05 + 0.01 * i)], workload)
        for why in (late, rising):
            assert f"fewer requests per second ({knob})" in why and other not in why, why


@pytest.mark.parametrize("ttft", [
    lambda i: 0.1 + 0.02 * (i % 3),  # steady, noisy
    lambda i: 0.05 if i < 4 else 0.12,  # the first requests found an empty batch, then steady
    lambda i: 0.4 if 15 <= i < 30 else 0.1,  # a burst in the middle of a replayed trace, drained by the end
    lambda i: 0.1 + 0.01 * i if i < 30 else 0.1,  # rose, then the engine caught up before the end
    lambda i: 0.1 + 0.001 * i,  # rising, but by less than twice over the run
])
def test_a_load_the_engine_keeps_up_with_is_not_saturation(ttft):
    assert saturated([sent(TIMED, lambda i: 0.0, ttft)], TIMED) == ""


def test_saturation_is_judged_on_open_loop_runs_with_enough_requests_only():
    growing = lambda i: 0.05 + 0.05 * i  # noqa: E731
    offline, loop = Workload.offline(40, 8, 4), Workload.closed_loop(2, 40, 8, 4)
    few = Workload.poisson(qps=10, n=15, prompt_len=8, output_len=4, seed=1)
    for w in (offline, loop, few):
        assert saturated([sent(w, lambda i: 0.0, growing)], w) == ""


def test_sessions_that_all_start_at_once_are_a_batch_neither_late_nor_saturated():
    """`Workload.sessions` without qps hands every first turn over at once, as an offline batch: its TTFT rises with
    the order the engine took them in, and a client sends a batch at its own pace. Judged as timed arrivals, such a
    run was PERF-INVALID ("engine saturated", "client fell behind") where the same offline batch was valid."""
    chat = Workload.sessions(96, turns=2, message_len=8, output_len=4, seed=1)
    first = [i for i, r in enumerate(chat.requests) if r.turn == 0]
    at_400_per_s = sent(chat, lambda i: first.index(i) / 400 if i in first else 0.0,
                        lambda i: 0.03 + 0.003 * first.index(i) if i in first else 0.05)
    assert why_invalid([at_400_per_s], chat) == "" and schedule_lags(at_400_per_s, chat) == []
    timed = Workload.sessions(96, turns=2, message_len=8, output_len=4, qps=50, seed=1)
    assert schedule_lags(sent(timed, lambda i: 0.0), timed) != []  # with a qps, a schedule to keep


def test_one_stall_that_delays_a_request_or_two_leaves_a_small_pass_valid():
    """Below 40 requests, two late ones were more than 5% of them: one stall made a whole pass invalid."""
    small = Workload.poisson(qps=10, n=16, prompt_len=8, output_len=4, seed=1)
    assert behind_schedule([sent(small, lambda i: 0.15 if i in (3, 4) else 0.0)], small) == ""
    assert behind_schedule([sent(small, lambda i: 0.15 if i in (3, 4, 5) else 0.0)], small).startswith(
        "the client fell behind its arrival schedule: 3 of 16 requests")


def test_a_sessions_later_turns_growing_with_their_history_are_not_saturation():
    """A later turn carries the conversation so far: its TTFT rises with its turn whether or not a queue
    grows. Only the first turns, the ones the workload schedules, tell saturation."""
    chat = Workload.sessions(20, turns=3, message_len=8, output_len=4, qps=10, seed=1)
    turn = lambda i: chat.requests[i].turn  # noqa: E731
    later_turns_slower = sent(chat, lambda i: 2.5 * turn(i), lambda i: 0.05 + 0.2 * turn(i))  # each turn after the last
    assert saturated([later_turns_slower], chat) == ""
    first = [i for i, r in enumerate(chat.requests) if r.turn == 0]
    queue_grows = sent(chat, lambda i: 0.0, lambda i: 0.05 + 0.02 * first.index(i) if i in first else 0.05)
    assert saturated([queue_grows], chat).startswith("the engine saturated under this open-loop load")
