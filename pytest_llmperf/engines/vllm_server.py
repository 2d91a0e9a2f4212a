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
from .base import need
from .local_server import LocalServer, flags
from .vllm import CPU_ENV, TRITON_CACHE_ENV, own_socket_folder, triton_cache_folder

CPU_DEFAULTS = {"block_size": 32}
# On a CPU build vLLM pins its worker's OpenMP threads to the cores it finds and keeps one more for the
# engine core's busy loop ("auto"): on a small host nothing is left for the API server and the client
# measuring it. Measured on 2 cores (docs/performance.md, "KV usage over HTTP on a short run"): the API
# server then answered /metrics only between bursts of the engine's work, every chunk of a request
# reached the client at one instant, and a 24-request Poisson run left KV usage unmeasured in 4 of 8 runs;
# unpinned, the cores are shared and usage was measured in 8 of 8. The environment can still set it.
SERVER_CPU_ENV = {**CPU_ENV, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def server_env(cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: `environ` over the CPU build's defaults (`SERVER_CPU_ENV`), no usage stats; on a
    GPU, Triton's kernels kept in vLLM's cache root as an in-process engine keeps them (`triton_cache_folder`)."""
    env = {**SERVER_CPU_ENV, **environ} if cpu else dict(environ)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    if not cpu and (folder := triton_cache_folder(env)):
        env[TRITON_CACHE_ENV] = folder
    return env


class VLLMServer(LocalServer):
    name = "vllm serve"
    port_taken = "Address already in use"
    poll_s = 0.5

    def __init__(self, model: ModelSpec, options: dict[str, Any], log_dir: Path, cpu: bool,
                 startup_timeout_s: float = 300.0) -> None:
        self.model, self._options, self._cpu = model, options, cpu
        super().__init__(log_dir, startup_timeout_s)

    def _command(self, port: int) -> list[str]:
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model.path,
                "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
        defaults: dict[str, Any] = dict(CPU_DEFAULTS) if self._cpu else {}
        if self.model.is_shape:
            args += ["--load-format", "dummy"]
            defaults["max_model_len"] = min(self.model.max_position_embeddings or 4096, 4096)
        return args + flags({**defaults, **self._options})

    def _env(self) -> dict[str, str]:
        own_socket_folder()
        return server_env(self._cpu, os.environ)

    def down_reason(self) -> str | None:
        """Why this server cannot serve the next test, or None. An engine core that died (the OOM
        killer's usual victim) leaves the API process running for a few seconds, answering /health
        with 503: such a server is stopped here, so that it is replaced rather than asked again."""
        if self._proc.poll() is not None:
            return f"exited with code {self._proc.returncode}"
        httpx = need("httpx", "openai")
        try:
            status = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code
        except httpx.HTTPError as e:
            reason = f"was running but not answering /health ({type(e).__name__})"
        else:
            if status < 500:
                return None
            reason = f"was running but answered /health with HTTP {status} (its engine core died)"
        self.stop()
        return reason
