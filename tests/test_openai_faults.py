"""Faults of the OpenAI-compatible HTTP engine found by review: its connection pool, its health rule, the measures
it claims from /metrics, the prompts it sends to a server's prefix cache, and the flags it writes for `vllm serve`.

Every server here is the FAKE one (tests/fake_openai_server.py): plugin mechanics only, never evidence that the
engine works with a real server (tests/test_openai_engine.py runs a real `vllm serve` for that)."""

import pytest
from fake_openai_server import FakeServer
from test_metrics_dialects import WRITTEN_LLAMACPP, WRITTEN_SGLANG

from pytest_llmperf import Request, Workload, assertions, validity
from pytest_llmperf.engines import metrics_dialects, openai
from pytest_llmperf.engines.base import EngineError
from pytest_llmperf.engines.local_server import flags
from pytest_llmperf.metrics import peak_concurrency, summarize

HELD = 10  # the prompt length the fake server holds for `hold_s` before its first token


@pytest.fixture
def fake():
    server = FakeServer({HELD: "hold"})
    yield server
    server.stop()


def held(n: int, every_s: float = 0.0) -> Workload:
    """`n` requests the fake server holds, due `every_s` apart (0: an offline batch)."""
    return Workload(tuple(Request(HELD, 3, arrival_s=k * every_s) for k in range(n)), seed=1)


# -- 1. requests beyond max_connections -----------------------------------------------------------------
def test_requests_beyond_max_connections_leave_health_and_metrics_alone_and_start_their_clock_when_sent(
        openai_engine_factory, fake, monkeypatch):
    """Six requests on two connections, each held 0.5 s: /health is asked every 0.1 s and must be answered
    within 0.2 s all along (it once queued behind the requests in their pool and failed the run as a server
    gone), and no request's clock runs while it waits for a connection (peak in flight: two)."""
    monkeypatch.setattr(openai, "HEALTH_TIMEOUT_S", 0.2)
    monkeypatch.setattr(openai, "HEALTH_POLL_S", 0.1)
    fake.set_health(200)
    fake.httpd.pages = {"/metrics": WRITTEN_SGLANG}
    engine = openai_engine_factory(base_url=fake.base_url, vocab_size=1000, max_connections=2, metrics_interval_s=0.05)
    trace = engine.run(held(6))
    assert all(s.ok for s in trace.sequences) and engine.alive
    assert fake.httpd.health_calls >= 4  # the check before the run, and polls during it
    assert peak_concurrency(trace.sequences) <= 2
    assert trace.extra["requests_waited_for_a_connection"] == 4


def test_an_open_loop_request_that_waited_for_a_connection_shows_as_sent_late(openai_engine_factory, fake):
    """Due every 0.1 s, each held 0.5 s on the one connection there is: the client cannot offer this load, and
    the result must say so (sent late, so invalid) rather than count the wait into each request's latency or hide it."""
    engine = openai_engine_factory(base_url=fake.base_url, vocab_size=1000, max_connections=1)
    w = held(4, every_s=0.1)
    trace = engine.run(w)
    assert all(s.ok for s in trace.sequences) and peak_concurrency(trace.sequences) == 1
    assert validity.behind_schedule([trace], w).startswith("the client fell behind its arrival schedule")
    assert trace.extra["requests_waited_for_a_connection"] == 3


def test_a_closed_loop_wider_than_the_connections_is_refused_before_it_runs(openai_engine_factory, fake):
    """Eight users in a closed loop on four connections would be measured as a loop of four."""
    engine = openai_engine_factory(base_url=fake.base_url, vocab_size=1000, max_connections=4)
    with pytest.raises(ValueError, match=r"concurrency 8 needs as many connections; .*max_connections=8"):
        engine.run(Workload.closed_loop(8, 8, prompt_len=12, output_len=3))
    assert len(fake.httpd.prompts) == 1  # the probe at the engine's start: nothing of the run was sent


# -- 2. options written as vLLM's command line reads them -------------------------------------------------
VLLM_OPTIONS = {"compilation_config": {"cudagraph_capture_sizes": [1, 2]}, "cudagraph_capture_sizes": [1, 2, 4],
                "served_model_name": ["a", "b"], "hf_overrides": {"rope_theta": 10000.0, "name": "x"},
                "enforce_eager": True, "enable_prefix_caching": False, "max_num_seqs": 4, "seed": None}


def test_mappings_are_written_as_json_and_lists_as_one_argument_an_item():
    assert flags(VLLM_OPTIONS) == [
        "--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}', "--cudagraph-capture-sizes", "1", "2", "4",
        "--served-model-name", "a", "b", "--hf-overrides", '{"rope_theta": 10000.0, "name": "x"}', "--enforce-eager",
        "--no-enable-prefix-caching", "--max-num-seqs", "4"]
    # vLLM's lists take one value or more: an empty one would silently be the server's default
    with pytest.raises(EngineError, match=r"server option allowed_media_domains=\[\] cannot be written as a command"):
        flags({"allowed_media_domains": []})


def test_vllms_own_parser_reads_the_flags_written():
    """vLLM 0.32's engine argument parser, built without starting anything."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "m", *flags(VLLM_OPTIONS)])
    assert args.compilation_config.cudagraph_capture_sizes == [1, 2]
    assert args.cudagraph_capture_sizes == [1, 2, 4] and args.served_model_name == ["a", "b"]
    assert args.hf_overrides == {"rope_theta": 10000.0, "name": "x"}
    assert args.enforce_eager is True and args.enable_prefix_caching is False and args.max_num_seqs == 4


# -- 3. measures from what the server sent ----------------------------------------------------------------
def _without(text: str, name: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if name not in line)


@pytest.mark.parametrize(("page", "family", "missing", "marker", "kept"), [
    (_without(WRITTEN_SGLANG, "num_retracted_requests"), "sglang", "preemptions", ("max_preemptions", (0,)),
     "prefix_hit_rate"),
    (_without(WRITTEN_LLAMACPP, "prompt_tokens_cached"), "llamacpp", "prefix_hit_rate",
     ("min_prefix_cache_hit_rate", (0.5,)), None),
])
def test_a_metric_the_server_did_not_send_is_not_measured_never_0(openai_engine_factory, page, family, missing, marker,
                                                                   kept):
    """SGLang's /metrics without its retractions counter, llama.cpp's without its cached prompt tokens: the
    family's table names them, the server did not send them, so preemptions (prefix hit rate) are not
    measured, with the reason, and a limit on them cannot pass."""
    server = FakeServer({})
    try:
        server.httpd.pages = {"/metrics": page}
        engine = openai_engine_factory(base_url=server.base_url, vocab_size=100)
        w = Workload.offline(4, prompt_len=8, output_len=4, seed=1)
        trace = engine.run(w)
    finally:
        server.stop()
    assert trace.extra["metrics_dialect"] == family and trace.kv
    assert missing not in trace.kv_measures and (kept is None or kept in trace.kv_measures)
    assert "did not send" in trace.unmeasured[missing]
    result = summarize([trace], w.hash, len(w.requests))
    assert result.flat()[f"kv_{missing}"] is None
    with pytest.raises(assertions.MarkerError, match=f"did not measure kv_{missing} in this run: .*did not send"):
        assertions.check(assertions.parse(marker[0], marker[1], {}, "cpu"), [result])


def test_a_field_summed_from_several_metrics_is_not_sent_when_one_of_them_was_not():
    """llama.cpp's queried prompt tokens are its processed plus its cached ones: without the cached counter the sum
    would read as the processed ones alone, a count too low, and so would the prompt tokens."""
    fields = metrics_dialects.DIALECTS["llamacpp"].read(_without(WRITTEN_LLAMACPP, "prompt_tokens_cached"))
    assert fields == {"running": 2, "waiting": 5, "output_tokens": 64}


# -- 4. the health check after a run with failures ------------------------------------------------------------
@pytest.mark.parametrize(("slow", "stops"), [
    (1, None),
    (1000, r"did not answer /health within 0 s 3 times in a row during this run: 1 of 2 sequences failed"),
])
def test_after_a_run_with_failures_a_slow_health_answer_is_asked_again(openai_engine_factory, monkeypatch, slow, stops):
    """A request failed (HTTP 500), so /health is asked after the run; its answer comes later than the engine
    waits. Once is a busy server, asked again (the rule of the run itself); every time is a server gone."""
    monkeypatch.setattr(openai, "HEALTH_TIMEOUT_S", 0.2)
    monkeypatch.setattr(openai, "HEALTH_POLL_S", 60.0)  # no poll during the run: only the check after it is slow
    server = FakeServer({11: "500"})
    try:
        server.set_health(200)
        engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000)
        server.set_health(200, slow=slow)
        w = Workload(tuple(Request(p, 3) for p in (10, 11)), seed=1)
        if stops is None:
            trace = engine.run(w)
            assert [s.error is None for s in trace.sequences] == [True, False] and engine.alive
            assert server.httpd.health_calls == 3  # before the run; after it, slow; asked again
        else:
            with pytest.raises(EngineError, match=stops):
                engine.run(w)
            assert not engine.alive
    finally:
        server.stop()


@pytest.mark.parametrize(("slow", "health", "down"), [
    (1, 200, None),
    (1000, 200, r"was running but did not answer /health within 1 s 3 times in a row"),
    (0, 503, r"was running but answers http://127.0.0.1:\d+/health with HTTP 503 \(vLLM says so when its engine is dead\)"),
])
def test_a_vllm_serve_slow_to_answer_health_between_tests_is_asked_again_before_it_is_stopped(
        monkeypatch, tmp_path, slow, health, down):
    """Between tests the vllm_server fixture asks whether its server died. It stopped (and restarted) a healthy one
    after one /health slower than 2 s, as a server answers beside a neighbour's engine start on a 2-core CPU; a
    slow answer is now asked again, under the rule of a run. A 503 (its engine core dead) still stops it at once.
    FAKE server: the process is a `sleep`."""
    import re
    import subprocess
    from urllib.parse import urlsplit

    import httpx

    from pytest_llmperf.engines.vllm_server import VLLMServer

    monkeypatch.setattr(openai, "HEALTH_TIMEOUT_S", 1.0)
    server = FakeServer({})
    vllm = VLLMServer.__new__(VLLMServer)  # its process and port, not a `vllm serve`
    vllm._proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    vllm.port, vllm.log_path = urlsplit(server.base_url).port, tmp_path / "serve.log"
    vllm._log = open(vllm.log_path, "w")  # noqa: SIM115 - closed by stop()
    try:
        server.set_health(health, slow=slow)
        server.httpd.slow_health_s = 2.5  # past the 2 s the check waited once
        httpx.get(f"http://127.0.0.1:{vllm.port}/health")  # the fake answers its first /health at once
        reason = vllm.down_reason()
        if down is None:
            assert reason is None and vllm.returncode is None, reason
        else:
            assert re.fullmatch(down, reason), reason
            assert vllm.returncode is not None  # stopped, to be replaced
    finally:
        vllm.stop()
        server.stop()


# -- 5. prompts never sent before to the server ------------------------------------------------------------------
def _prompts(server: FakeServer, engine, w: Workload) -> list[tuple[int, ...]]:
    server.httpd.prompts.clear()
    engine.run(w)  # salt 0, as the runner passes to the first pass of every llmperf.run
    return [tuple(p) for p in server.httpd.prompts]


def test_every_run_sends_prompts_never_sent_before_of_the_same_lengths_sharing_what_the_workload_shares(
        openai_engine_factory):
    """Two runs of one workload on one engine, and one on another engine of the same server: a server's prefix
    cache (vllm serve's is on by default) must not serve a later pass what an earlier one sent. Within a run,
    the requests of one prefix group still share their system prompt."""
    server = FakeServer({})
    try:
        w = Workload.shared_prefix(6, prefix_len=16, suffix_len=(4, 12), output_len=3, groups=2, seed=4)
        engine = openai_engine_factory(base_url=server.base_url, vocab_size=1000)
        runs = [_prompts(server, engine, w), _prompts(server, engine, w)]
        runs.append(_prompts(server, openai_engine_factory(base_url=server.base_url, vocab_size=1000, max_connections=8), w))
    finally:
        server.stop()
    for prompts in runs:
        assert sorted(map(len, prompts)) == sorted(r.prompt_len for r in w.requests)
        by_group: dict[int, set[tuple[int, ...]]] = {}
        for p in prompts:  # the fake answers in any order: a prefix group is found by its first tokens
            by_group.setdefault(p[:16], set()).add(p)
        assert sorted(map(len, by_group.values())) == [3, 3]
    firsts = [{p[:16] for p in prompts} for prompts in runs]
    assert not (firsts[0] & firsts[1]) and not (firsts[2] & (firsts[0] | firsts[1]))




def test_token_ids_beyond_the_served_models_vocabulary_are_an_error_not_a_switch_to_text(openai_engine_factory):
    """vLLM answers ids its model has no row for with HTTP 400, which the probe took for a server refusing token
    ids: it sent word prompts, which a real tokenizer splits into other lengths than the workload's. FAKE server."""
    fake = FakeServer({})
    try:
        fake.httpd.vocab_size = 50
        with pytest.raises(EngineError, match=r"refused token ids of .* \(vocabulary 100\) and took ids 1-3"):
            openai_engine_factory(base_url=fake.base_url, vocab_size=100)
        fake.httpd.vocab_size, fake.httpd.refuse_token_ids = 1 << 31, True  # a server that takes no ids at all
        assert openai_engine_factory(base_url=fake.base_url, vocab_size=100).config["prompt"].startswith("text")
    finally:
        fake.stop()


def test_a_counter_the_server_creates_at_its_first_request_is_measured_from_0():
    """A fresh server's scrape before the run lacks the counters it creates at its first request (prometheus_client's
    labelled metrics): they read as 0 there, and were taken for metrics the server does not send."""
    scraper = openai._Scraper(None, "http://server", 0.1, "sglang")
    busy = {"usage": 0.5, "running": 2.0, "waiting": 0.0, "preemptions": 1.0, "prefix_queries": 40.0,
            "prefix_hits": 10.0}
    scraper.rows = [(0.0, 0.01, {"usage": 0.0, "running": 0.0, "waiting": 0.0}), (0.1, 0.11, busy),
                    (0.2, 0.21, {**busy, "preemptions": 2.0})]
    assert {"preemptions", "prefix_hit_rate", "usage"} <= scraper.measures() and scraper.missing() == {}
    assert [k.preemptions for k in scraper.samples()] == [1, 2]
