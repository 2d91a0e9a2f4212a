"""Multi-turn sessions on real engines (vLLM and transformers on this CPU): each turn is sent after the
previous answer arrived plus its think time, and its history reaches vLLM's prefix cache."""

import pytest
from fake_openai_server import FakeServer

from pytest_llmperf import Workload

SESSIONS = Workload.sessions(6, turns=3, message_len=(16, 48), output_len=(8, 24), think_s=0.05, qps=20,
                             system_prompt_len=64, seed=4)
BASE = dict(num_gpu_blocks_override=160)


def assert_turns_waited_for_their_answers(trace, workload):
    sent = {s.index: s for s in trace.sequences}
    for i, request in enumerate(workload.requests):
        before = workload.previous_turn(i)
        if before is not None:
            answered = sent[before].chunks[-1].t
            assert sent[i].submit_t >= answered + request.think_s, (i, sent[i].submit_t - answered)


@pytest.mark.llmperf_engine(enable_prefix_caching=False, **BASE)
def test_vllm_turns_wait_for_their_answers_and_reuse_the_conversation_through_the_prefix_cache(
        vllm_engine, vllm_engine_factory, llmperf):
    pytest.importorskip("vllm")
    uncached = llmperf.run(vllm_engine, SESSIONS, label="prefix cache off")
    assert_turns_waited_for_their_answers(vllm_engine.run(SESSIONS), SESSIONS)
    cached = llmperf.run(vllm_engine_factory(**BASE), SESSIONS, label="prefix cache on")  # the pool's next engine
    assert cached.failed == uncached.failed == 0
    assert [(t.turn, t.requests, t.ttft.count) for t in cached.by_turn] == [(0, 6, 6), (1, 6, 6), (2, 6, 6)]
    assert [t.prefix_cached_share for t in uncached.by_turn] == [0.0, 0.0, 0.0]
    # later turns find their own history (the earlier prompts, whole blocks of it) in the cache
    on = [t.prefix_cached_share for t in cached.by_turn]
    assert on[1] > 0.3 and on[2] > 0.3, on
    assert "by_turn" in cached.to_dict() and cached.to_dict()["by_turn"][2]["turn"] == 2


def test_transformers_turns_wait_for_their_answers(hf_engine, llmperf):
    result = llmperf.run(hf_engine, SESSIONS)
    assert_turns_waited_for_their_answers(hf_engine.run(SESSIONS), SESSIONS)
    assert result.failed == 0 and [t.requests for t in result.by_turn] == [6, 6, 6]
    assert all(t.prefix_cached_share is None for t in result.by_turn)  # transformers keeps no prefix cache


def test_the_http_client_sends_each_turn_after_its_answer(openai_engine_factory):
    """FAKE server (plugin mechanics of the openai engine's schedule, not evidence about a server)."""
    server = FakeServer({})
    try:
        engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000, metrics_interval_s=0)
        trace = engine.run(SESSIONS)
    finally:
        server.stop()
    assert not trace.failed
    assert_turns_waited_for_their_answers(trace, SESSIONS)


def test_the_terminal_shows_each_turn(pytester):
    """Through pytest, on transformers: the `turns of` line beside the result table."""
    pytester.makepyfile(test_chat="""
from pytest_llmperf import Workload

def test_chat(hf_engine, llmperf):
    llmperf.run(hf_engine, Workload.sessions(2, turns=2, message_len=8, output_len=4), warmup=False)
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmperf-engine=hf", timeout=300)
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"  turns of test_chat.py::test_chat \[0\]: turn 0: 2 requests, TTFT p50 \S+ ms p99 \S+ ms; "
                                  r"turn 1: 2 requests, TTFT p50 \S+ ms p99 \S+ ms$"])
