"""vLLM beside llama.cpp's own `llama-server` on one workload: the framework comparison the project grew
from, as a test. Both serve a model of the tiny shape's sizes with random weights (vLLM in-process,
llama.cpp from a GGUF file written here; bfloat16 in vLLM's CPU build, f32 in the GGUF file, so the
columns compare the two servers as set up here, not kernels); the test prints the table a comparison reads and checks that
each engine served every request with the token counts asked for.

`make test-servers` builds `llama-server` and runs this against its CPU baseline; without the binary
the test is skipped (`make test` and `make perf-gate` do not build it)."""

import json
import os
from importlib import resources

import pytest

from pytest_llmperf import Workload, side_by_side
from pytest_llmperf.engines.llamacpp_server import BINARY_ENV, VOCAB, LlamaCppServer, write_tiny_llama_gguf

BINARY = os.environ.get(BINARY_ENV, "")
pytestmark = [
    pytest.mark.cpu,  # sized for the tiny shape on a CPU runner, where the server is built
    pytest.mark.skipif(not (BINARY and os.access(BINARY, os.X_OK)),
                       reason=f"llama-server is not built: `make test-servers` builds it and sets {BINARY_ENV}"),
]
pytest.importorskip("vllm")

WORKLOAD = Workload.offline(16, prompt_len=(32, 256), output_len=(32, 128), seed=41)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    shape = json.loads(resources.files("pytest_llmperf.shapes").joinpath("tiny-llama.json").read_text())
    model = write_tiny_llama_gguf(
        tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", layers=shape["num_hidden_layers"],
        hidden=shape["hidden_size"], heads=shape["num_attention_heads"], kv_heads=shape["num_key_value_heads"],
        ffn=shape["intermediate_size"], context=shape["max_position_embeddings"])
    server = LlamaCppServer(BINARY, model, tmp_path_factory.mktemp("llama-logs"))
    yield server
    server.stop()


@pytest.mark.llmperf_engine(num_gpu_blocks_override=512)
def test_vllm_and_llamacpp_on_the_same_workload(vllm_engine, openai_engine_factory, llama, llmperf):
    """Same requests, same lengths: continuous batching with paging (vLLM) against llama.cpp's slots."""
    vllm = llmperf.run(vllm_engine, WORKLOAD, label="vllm")
    llamacpp = llmperf.run(openai_engine_factory(base_url=llama.base_url, vocab_size=VOCAB), WORKLOAD,
                           label="llama.cpp")
    print("\n" + side_by_side({"vllm": vllm, "llama.cpp": llamacpp}))
    asked = sum(q.output_len for q in WORKLOAD.requests)
    for r in (vllm, llamacpp):
        assert r.failed == 0 and r.ttft.count == len(WORKLOAD.requests)
        assert sum(s.output_len for s in r.sequences) == asked
    # what each measures of its KV cache: vLLM's blocks from its scheduler; llama.cpp exports no usage
    assert vllm.kv.blocks_peak > 0 and vllm.kv.preemptions == 0
    assert llamacpp.kv.usage_peak is None and llamacpp.kv.prefix_hit_rate is not None
