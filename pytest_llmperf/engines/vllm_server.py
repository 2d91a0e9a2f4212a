"""`vllm serve` as a subprocess on a free loopback port, for the HTTP engine to measure.

A model shape runs with dummy weights and its word tokenizer (models.word_tokenizer), so the server
takes token-id, text and chat requests and streams text as a real deployment would. The server runs
in its own process group so that stopping it stops its engine-core children too; `stop()` is safe to
call twice and also runs at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..models import ModelSpec
from .base import EngineError, need
from .vllm import CPU_ENV, own_socket_folder

CPU_DEFAULTS = {"block_size": 32}
# On a CPU build vLLM pins its worker's OpenMP threads to the cores it finds and keeps one more for the
# engine core's busy loop ("auto"): on a small host nothing is left for the API server and the client
# measuring it. Measured on 2 cores (docs/performance.md, "KV usage over HTTP on a short run"): the API
# server then answered /metrics only between bursts of the engine's work, every chunk of a request
# reached the client at one instant, and a 24-request Poisson run left KV usage unmeasured in 4 of 8 runs;
# unpinned, the cores are shared and usage was measured in 8 of 8. The environment can still set it.
SERVER_CPU_ENV = {**CPU_ENV, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def server_env(cpu: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: `environ` over the CPU build's defaults (`SERVER_CPU_ENV`), no usage stats."""
    env = {**SERVER_CPU_ENV, **environ} if cpu else dict(environ)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    return env


PORT_TRIES = 3  # starts of vllm serve whose port another process took before it bound it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flags(options: dict[str, Any]) -> list[str]:
    """Engine options as `vllm serve` flags: True -> --flag, False -> --no-flag, else --flag value."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            out += [flag, str(value)]
    return out


class VLLMServer:
    def __init__(self, model: ModelSpec, options: dict[str, Any], log_dir: Path, cpu: bool,
                 startup_timeout_s: float = 300.0) -> None:
        self.model = model
        self._options, self._log_dir, self._cpu, self._startup_timeout_s = options, log_dir, cpu, startup_timeout_s
        atexit.register(self.stop)
        self._launch()

    def _launch(self) -> None:
        """Starts the server and waits until it answers. The port is free when chosen, but vllm serve binds it
        only after its imports, seconds later, and on a busy runner another process (a vLLM engine's own
        sockets among them) can take it meanwhile: a start that failed so is tried again on a new port."""
        for attempt in range(PORT_TRIES):
            self._start_process()
            try:
                self._wait_ready(self._startup_timeout_s)
                return
            except BaseException:
                taken = self._proc.poll() is not None and "Address already in use" in self.log_tail()
                self.stop()
                if not taken or attempt == PORT_TRIES - 1:
                    raise

    def _start_process(self) -> None:
        model, cpu = self.model, self._cpu
        self.port = free_port()
        self.log_path = self._log_dir / f"vllm-serve-{self.port}.log"
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model.path,
                "--host", "127.0.0.1", "--port", str(self.port), "--disable-uvicorn-access-log"]
        defaults: dict[str, Any] = dict(CPU_DEFAULTS) if cpu else {}
        if model.is_shape:
            args += ["--load-format", "dummy"]
            defaults["max_model_len"] = min(model.max_position_embeddings or 4096, 4096)
        args += flags({**defaults, **self._options})
        own_socket_folder()
        env = server_env(cpu, os.environ)
        self.command = args
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the server
        self._proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)

    def restart(self) -> None:
        """A fresh server in place of one that died (on a new port: `base_url` changes)."""
        self.stop()
        self._launch()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

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

    def _wait_ready(self, timeout_s: float) -> None:
        httpx = need("httpx", "openai")

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineError(f"vllm serve exited with code {self._proc.returncode} while starting:\n"
                                  f"{self.log_tail()}\n(full log: {self.log_path})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise EngineError(f"vllm serve did not answer /health within {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=10)
        if not self._log.closed:
            self._log.close()
