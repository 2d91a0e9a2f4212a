"""Latency and throughput of the everyday traffic shapes, on the session's default engine."""

import pytest

from pytest_llmperf import LogNormal, Workload


@pytest.mark.max_p99_ms(ttft=2_000, tpot=100)
@pytest.mark.min_throughput(output_tokens_per_s=100)
def test_short_chat(llm_engine, llmperf):
    """Chat turns under 500 tokens arriving as a Poisson stream."""
    chat = Workload.poisson(qps=8, n=48, prompt_len=LogNormal(mean=160, sigma=0.6, hi=400),
                            output_len=(16, 96), seed=1)
    llmperf.run(llm_engine, chat)


@pytest.mark.max_p99_ms(tpot=50)
@pytest.mark.min_throughput(output_tokens_per_s=50)
def test_long_generation(llm_engine, llmperf):
    """A few requests writing 1k-3k tokens: decode speed over a long context."""
    llmperf.run(llm_engine, Workload.offline(4, prompt_len=64, output_len=(1000, 3000), seed=2))


@pytest.mark.max_p99_ms(ttft=5_000, e2e=20_000)
@pytest.mark.max_p95_ms(itl=200)
def test_mixed_load(llm_engine, llmperf):
    """Short questions and long documents together, with bursty arrivals."""
    mixed = Workload.poisson(qps=12, n=64, prompt_len=LogNormal(mean=400, sigma=1.0, hi=2000),
                             output_len=LogNormal(mean=80, sigma=0.8, hi=500), seed=3, burstiness=0.5)
    result = llmperf.run(llm_engine, mixed)
    assert result.goodput(ttft=5_000, e2e=20_000) > 0


@pytest.mark.parametrize("concurrency", [1, 4, 16])
@pytest.mark.max_p99_ms(tpot=100)
def test_concurrency_sweep(llm_engine, llmperf, concurrency):
    """Closed loop at rising concurrency: throughput should grow, per-token latency stay bounded."""
    w = Workload.closed_loop(concurrency=concurrency, n=4 * concurrency, prompt_len=(64, 256),
                             output_len=(32, 64), seed=4)
    r = llmperf.run(llm_engine, w, label=f"c{concurrency}")
    assert r.throughput.output_tokens_per_s > 0
