"""Engine lifecycle with real vLLM: no engine process outlives the session, even on Ctrl-C or SIGTERM; a real
checkpoint folder (weights on disk, not a shape) loads and runs."""

import getpass
import json
import shutil
import signal
import tempfile
from pathlib import Path

import psutil
import pytest
from hanging_session import start, stop, survivors

pytest.importorskip("vllm")

ENGINE_CONFIG = json.dumps({"num_gpu_blocks_override": 160})


@pytest.mark.parametrize("sig, said", [
    (signal.SIGINT, "KeyboardInterrupt"),  # Ctrl-C
    (signal.SIGTERM, "terminated by SIGTERM; engines stopped"),  # `timeout`, `kill`, a cancelled CI job
])
def test_ctrl_c_or_sigterm_during_a_test_stops_every_engine_process(pytester, monkeypatch, session_temp, sig, said):
    # vLLM's own topology, which conftest.py trims for speed: the engine core and, on the CPU, a worker
    # process of its own, the one that outlived shutdowns that did not wait for it
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    proc, pids = start(pytester, ENGINE_CONFIG)
    assert any(p.is_socket() for p in session_temp.glob("llmperf-*/*")), "vLLM's sockets are not in the plugin's folder"
    names = [psutil.Process(p).name() for p in pids]
    assert any("EngineCore" in n for n in names) and any("Worker" in n for n in names), names
    out = stop(proc, sig)
    assert said in out
    if sig == signal.SIGTERM:
        assert proc.returncode == 143  # what a killed job reports, so CI shows the kill, not a test failure
    alive = survivors(pids)
    assert not alive, f"engine processes outlived the session: {alive}"
    left = [p.name for p in session_temp.iterdir() if p.name not in CACHES]
    assert not left, "the session left files in the temp folder"


# caches kept between sessions on purpose: the shapes' config and tokenizer folders (models.py) and torch's
# compile folder (its cache proper stays where it was, below)
CACHES = {"pytest-llmperf-shapes", f"torchinductor_{getpass.getuser()}"}


@pytest.fixture
def session_temp(monkeypatch):
    """An empty temp folder for the session in the subprocess, to see what it leaves there."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    temp = Path(tempfile.mkdtemp(prefix="lifecycle-"))  # short: a socket's path may not exceed 107 characters
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    yield temp
    shutil.rmtree(temp)


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
    # the engine's shutdown is logged before pytest's summary (its routine lines left out), never after it
    lines = result.stdout.lines + result.stderr.lines
    last = max(i for i, line in enumerate(lines) if "1 passed" in line)
    assert not [line for line in lines[last + 1:] if line.strip()], lines[last:]
    assert not any("[shutdown]" in line for line in lines)


def test_a_session_that_does_not_exit_after_its_signal_fails_with_its_processes_and_output(pytester):
    """The helper above: a process that ignores SIGINT (a stand-in for a stuck session, not vLLM) fails the
    check with what it printed and its process tree, and is killed, never left behind."""
    import subprocess
    import sys

    from hanging_session import stop

    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('waiting', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().strip() == "waiting"
    with pytest.raises(AssertionError, match="had not exited 2 s after signal") as failed:
        stop(proc, signal.SIGINT, timeout_s=2, second_wait_s=2)
    said = str(failed.value)
    assert str(proc.pid) in said and "time.sleep(60)" in said
    assert "ignored yes" in said and "a second signal 2 did not end it either" in said  # where the signal went
    assert proc.poll() is not None

    # one that drops only the first signal: the second ends it, and the failure says so
    code = ("import signal, time; signal.signal(signal.SIGINT, lambda *a: signal.signal(signal.SIGINT, "
            "signal.default_int_handler)); print('waiting', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline().strip() == "waiting"
    with pytest.raises(AssertionError, match="within 10 s of a second signal 2") as failed:
        stop(proc, signal.SIGINT, timeout_s=2, second_wait_s=10)
    assert "caught yes" in str(failed.value)
