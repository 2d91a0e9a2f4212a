"""A perf suite written as a new user would write one, for measuring the gate's false alarms on tests
no calibration and no tuning has seen (benchmarks/unseen_gate.py). Written once from the README and
docs/writing-tests.md, on 2026-12-05, before any of it was run; not changed after its results were seen.
It is not part of the shipped suite and has no baselines in the repository: the benchmark records them
in one pytest process and compares in others, as two CI jobs would."""

import pytest

from pytest_llmperf import LogNormal, Workload


@pytest.mark.max_p50_ms(ttft=3_000)
def test_support_chat(llm_engine, llmperf):
    chat = Workload.poisson(qps=6, n=40, prompt_len=LogNormal(mean=200, sigma=0.5), output_len=(24, 80), seed=11)
    result = llmperf.run(llm_engine, chat)
    assert result.failed == 0


def test_nightly_batch_summaries(vllm_engine, llmperf):
    llmperf.run(vllm_engine, Workload.offline(24, prompt_len=(300, 600), output_len=(32, 64), seed=12))


@pytest.mark.llmperf_engine(block_size=32, num_gpu_blocks_override=64, max_model_len=1024)
@pytest.mark.max_kv_fragmentation(0.5)
def test_long_answers_in_a_small_cache(vllm_engine, llmperf):
    llmperf.run(vllm_engine, Workload.offline(20, prompt_len=(32, 200), output_len=(100, 300), seed=13))


def test_four_users_at_once(vllm_engine, llmperf):
    llmperf.run(vllm_engine, Workload.closed_loop(concurrency=4, n=32, prompt_len=(64, 192), output_len=(32, 96), seed=14))


@pytest.mark.llmperf_engine(enable_prefix_caching=True)
def test_rag_with_shared_instructions(vllm_engine, llmperf):
    rag = Workload.shared_prefix(n=32, prefix_len=256, suffix_len=(16, 64), output_len=(16, 48), groups=3, seed=15)
    llmperf.run(vllm_engine, rag)


def test_agent_conversations(vllm_engine, llmperf):
    llmperf.run(vllm_engine, Workload.sessions(4, turns=3, message_len=(16, 64), output_len=(16, 48), think_s=0.2, seed=16))


@pytest.mark.parametrize("qps", [2, 8])
def test_request_rates(vllm_engine, llmperf, qps):
    llmperf.run(vllm_engine, Workload.poisson(qps=qps, n=24, prompt_len=(32, 256), output_len=(16, 64), seed=17))


def test_a_minute_of_production_traffic(vllm_engine, llmperf):
    trace = Workload.from_trace("perf_tests/data/mooncake_conversation_head400.jsonl", start=60, duration_s=60,
                                length_scale=1 / 64, time_scale=1 / 10, too_long="clip")
    llmperf.run(vllm_engine, trace)
