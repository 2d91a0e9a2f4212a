"""The HTTP engine against `vllm serve` on a real GPU: completions with token ids, chat, /metrics paging,
and the same workload in-process for the HTTP path's TTFT overhead. Skipped without NVML (CI) or
without vLLM; run on the H200 through the device tool (docs/gpu-validation.md)."""

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.gpu import device_count

pytestmark = pytest.mark.skipif(device_count() == 0, reason="needs an NVIDIA GPU (NVML); none on this machine")
OPTIONS = {"gpu_memory_utilization": 0.3, "enforce_eager": True}
CHAT = Workload.offline(64, prompt_len=(32, 512), output_len=(64, 256), seed=7)


def test_http_engine_against_vllm_serve_on_the_gpu(llmperf_session, openai_engine_factory, vllm_engine_factory,
                                                   llmperf, tmp_path):
    pytest.importorskip("vllm")
    from pytest_llmperf.engines.vllm_server import VLLMServer

    server = VLLMServer(llmperf_session.model(), OPTIONS, tmp_path, cpu=False)
    try:
        http = llmperf.run(openai_engine_factory(base_url=server.base_url), CHAT, label="http")
        chat = llmperf.run(openai_engine_factory(base_url=server.base_url, endpoint="chat"), CHAT, label="chat")
    finally:
        server.stop()
    inproc = llmperf.run(vllm_engine_factory(**OPTIONS), CHAT, label="in-process")
    for r in (http, chat, inproc):
        print(f"{r.label}: TTFT p50 {r.ttft.p50:.1f} ms p99 {r.ttft.p99:.1f} ms, TPOT p50 {r.tpot.p50:.2f} ms, "
              f"{r.throughput.output_tokens_per_s:.0f} out tok/s, KV usage peak {r.kv.usage_peak}, "
              f"prefix hit rate {r.kv.prefix_hit_rate}")
    assert http.failed == chat.failed == inproc.failed == 0
    assert http.ttft.count == chat.ttft.count == inproc.ttft.count == 64
    assert http.kv.usage_peak is not None and http.kv.usage_peak > 0  # /metrics scraped during the run
