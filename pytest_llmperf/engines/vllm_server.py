"""`vllm serve` as a subprocess on a free loopback port (local_server.py), for the HTTP engine to measure.

A model shape runs with dummy weights and its word tokenizer (models.word_tokenizer), so the server
takes token-id, text and chat requests and streams text as a real deployment would. Stopping it stops
its engine-core children too (its process group).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..models import ModelSpec
from .local_server import LocalServer, flags
from .openai import health_problem
from .vllm import TRITON_CACHE_ENV, cpu_dtype, cpu_env, own_socket_folder, triton_cache_folder

CPU_DEFAULTS = {"block_size": 32}
# On a CPU build vLLM pins its worker's OpenMP threads to the cores it finds and keeps one more for the
# engine core's busy loop ("auto"): on a small host nothing is left for the API server and the client
# measuring it. Measured on 2 cores (docs/performance.md, "KV usage over HTTP on a short run"): the API
# server then answered /metrics only between bursts of the engine's work, every chunk of a request
# reached the client at one instant, and a 24-request Poisson run left KV usage unmeasured in 4 of 8 runs;
# unpinned, the cores are shared and usage was measured in 8 of 8. The environment can still set it.
SERVER_CPU_BIND = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def server_env(environ: Mapping[str, str], dtype_on_cpu: str | None) -> dict[str, str]:
    """The server's environment: `environ` over, on a CPU build, its defaults for engines of that dtype
    (`cpu_env`, the threads unpinned), no usage stats; on a GPU (`dtype_on_cpu` None), Triton's kernels kept in
    vLLM's cache root as an in-process engine keeps them (`triton_cache_folder`)."""
    env = {**cpu_env(dtype_on_cpu), **SERVER_CPU_BIND, **environ} if dtype_on_cpu else dict(environ)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    if not dtype_on_cpu and (folder := triton_cache_folder(env)):
        env[TRITON_CACHE_ENV] = folder
    return env


def serve_command(model: ModelSpec, options: dict[str, Any], dtype_on_cpu: str | None, port: int) -> list[str]:
    """`vllm serve`'s command line; `dtype_on_cpu` names a CPU build's dtype (None: a GPU takes the model's)."""
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model.path,
            "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    # on a CPU, the in-process engine's dtype (bf16 only where the CPU computes in it), not the model's
    defaults: dict[str, Any] = {**CPU_DEFAULTS, "dtype": dtype_on_cpu} if dtype_on_cpu else {}
    if model.is_shape:
        args += ["--load-format", "dummy"]
        defaults["max_model_len"] = min(model.max_position_embeddings or 4096, 4096)
    return args + flags({**defaults, **options})


class VLLMServer(LocalServer):
    name = "vllm serve"
    port_taken = "Address already in use"
    poll_s = 0.5

    def __init__(self, model: ModelSpec, options: dict[str, Any], log_dir: Path, cpu: bool,
                 startup_timeout_s: float = 300.0) -> None:
        self.model, self._options = model, options
        self._dtype = cpu_dtype(options) if cpu else None
        super().__init__(log_dir, startup_timeout_s)

    def _command(self, port: int) -> list[str]:
        return serve_command(self.model, self._options, self._dtype, port)

    def _env(self) -> dict[str, str]:
        own_socket_folder()
        return server_env(os.environ, self._dtype)

    def down_reason(self) -> str | None:
        """Why this server cannot serve the next test, or None. An engine core that died (the OOM
        killer's usual victim) leaves the API process running for a few seconds, answering /health
        with 503: such a server is stopped here, so that it is replaced rather than asked again. A slow answer
        is asked again, as in a run (`openai.health_problem`): a server busy beside a neighbour's engine start
        on a small CPU was stopped after one 2 s timeout, and restarted for the next test."""
        if self._proc.poll() is not None:
            return f"exited with code {self._proc.returncode}"
        problem = health_problem(f"http://127.0.0.1:{self.port}")
        if problem is None:
            return None
        self.stop()
        return f"was running but {problem}"
