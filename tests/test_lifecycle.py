"""Engine lifecycle with real vLLM: no engine process outlives the session, even on Ctrl-C or SIGTERM; a real
checkpoint folder (weights on disk, not a shape) loads and runs."""

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytest.importorskip("vllm")

ENGINE_CONFIG = json.dumps({"num_gpu_blocks_override": 160})

HANG = """
import time
import psutil

def test_hang(vllm_engine):
    kids = [p.pid for p in psutil.Process().children(recursive=True)]
    with open("pids.txt", "w") as f:
        f.write(" ".join(map(str, kids)))
    time.sleep(600)
"""


@pytest.mark.parametrize("sig, said", [
    (signal.SIGINT, "KeyboardInterrupt"),  # Ctrl-C
    (signal.SIGTERM, "terminated by SIGTERM; engines stopped"),  # `timeout`, `kill`, a cancelled CI job
])
def test_ctrl_c_or_sigterm_during_a_test_stops_every_engine_process(pytester, sig, said):
    pytester.makepyfile(test_hang=HANG)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_hang.py", "--llmperf-engine=vllm",
         f"--llmperf-engine-config={ENGINE_CONFIG}"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    pids_file = pytester.path / "pids.txt"
    deadline = time.monotonic() + 240
    while not (pids_file.exists() and pids_file.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "the engine never started"
        time.sleep(0.5)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert pids, "vLLM runs its engine core in child processes"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=180)
    assert said in out
    time.sleep(2)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine processes outlived the session: {alive}"


def test_a_real_checkpoint_folder_loads_with_its_weights(pytester, tmp_path):
    import torch
    import transformers

    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=64, vocab_size=1024,
                                      max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    pytester.makepyfile(test_ckpt="""
from pytest_llmperf import Workload

def test_ckpt(vllm_engine, llmperf):
    r = llmperf.run(vllm_engine, Workload.offline(4, prompt_len=(16, 64), output_len=8))
    assert r.failed == 0 and r.ttft.count == 4
    assert vllm_engine.max_model_len == 512 and vllm_engine.model.is_shape is False
""")
    result = pytester.runpytest_subprocess("--llmperf-engine=vllm", f"--llmperf-model={tmp_path / 'ckpt'}",
                                           f"--llmperf-engine-config={ENGINE_CONFIG}", timeout=300)
    result.assert_outcomes(passed=1)
