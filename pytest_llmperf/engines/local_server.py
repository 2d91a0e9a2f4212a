"""A server the plugin starts as a subprocess on a free loopback port for the HTTP engine to measure
(`vllm serve`, llama.cpp's `llama-server`): its start, its readiness, its log and its stop.

The port is free when chosen, but a server binds it only once it is up to that point (vllm serve after
seconds of imports), and on a busy runner another process (a vLLM engine's own sockets among them) can
take it meanwhile: a start that failed so is tried again on a new port. The server runs in its own
process group, so that stopping it stops its children too; `stop()` is safe to call twice and also runs
at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from .base import EngineError, need

PORT_TRIES = 3  # starts of a server whose port another process took before it bound it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flags(options: dict[str, Any]) -> list[str]:
    """Options as command-line flags, as vLLM's parser (vllm/engine/arg_utils.py, 0.32) reads them: True ->
    --flag, False -> --no-flag, a mapping -> --flag JSON, a list -> --flag item item (nargs="+"), else --flag value."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(_value, _items(key, value))]
        elif value is not None:
            out += [flag, _value(value)]
    return out


def _items(key: str, value: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
    """A list option's items; an empty list has no command-line form (vLLM's lists take one value or more, and
    its own --config loader drops an empty one, which would silently give the default instead)."""
    if not value:
        raise EngineError(f"server option {key}=[] cannot be written as a command-line flag (it takes one value or "
                          f"more): leave {key} out for the server's default, or set it inside a JSON config option "
                          "(e.g. compilation_config={...}) where an empty list means what it says")
    return value


def _value(value: Any) -> str:
    """One value as a command line takes it: a mapping as JSON (vLLM refuses Python's repr, single quotes, with
    "Invalid JSON"), anything else as its text."""
    return json.dumps(value) if isinstance(value, Mapping) else str(value)


class LocalServer:
    """One server process; a subclass gives its name, its command line on a port and its environment."""

    name: ClassVar[str]  # as messages and log files name it
    port_taken: ClassVar[str]  # what its log says when another process holds its port
    poll_s: ClassVar[float] = 0.2  # between two /health requests while it starts
    stop_timeout_s: ClassVar[float] = 30.0  # after SIGTERM, before SIGKILL
    _gone: int | None = None  # the process group last seen stopped: never signalled again

    def __init__(self, log_dir: Path, startup_timeout_s: float) -> None:
        self._log_dir, self._startup_timeout_s = log_dir, startup_timeout_s
        self._launch()  # a start that fails stops what it started
        atexit.register(self.stop)

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None  # this process's environment

    def _launch(self) -> None:
        """Starts the server and waits until it answers, on a new port while its port was taken."""
        for attempt in range(PORT_TRIES):
            self._start_process()
            try:
                self._wait_ready()
                return
            except BaseException:
                taken = self._proc.poll() is not None and self.port_taken in self.log_tail()
                self.stop()
                if not taken or attempt == PORT_TRIES - 1:
                    raise

    def _start_process(self) -> None:
        self.port = free_port()
        self.command = self._command(self.port)
        self.log_path = self._log_dir / f"{self.name.replace(' ', '-')}-{self.port}.log"
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the server
        try:
            self._proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self._env(),
                                          start_new_session=True)
        except BaseException:  # its command cannot be run (a missing binary): nothing started
            self._log.close()
            raise

    def _wait_ready(self) -> None:
        httpx = need("httpx", "openai")
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EngineError(f"{self.name} exited with code {self._proc.returncode} while starting:\n"
                                  f"{self.log_tail()}\n(full log: {self.log_path})")
            with contextlib.suppress(httpx.HTTPError):  # refused before it binds, 503 while the model loads
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            time.sleep(self.poll_s)
        raise EngineError(f"{self.name} did not answer /health within {self._startup_timeout_s:.0f}s:\n"
                          f"{self.log_tail()}\n(full log: {self.log_path})")

    def restart(self) -> None:
        """A fresh server in place of one that died (on a new port: `base_url` changes)."""
        self.stop()
        self._launch()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """The server's whole process group stopped, also when its leader is gone already: `vllm serve`'s API
        process killed alone (the OOM killer) leaves its engine core holding the card, and the leader's pid
        names the group while any member lives (Linux gives no new process a pid in use as a group id)."""
        group = self._proc.pid
        if group == self._gone or self._number_taken(group):  # never signal a group that is no longer this server's
            self._close_log()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=self.stop_timeout_s)
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(group) or self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            self._proc.wait(timeout=10)
        if not _group_alive(group):
            self._gone = group
        self._close_log()

    def _close_log(self) -> None:
        if not self._log.closed:
            self._log.close()

    def _number_taken(self, group: int) -> bool:
        """Whether the leader's pid names another process now: the leader reaped, and a process of that pid
        alive. Its group then is that process's, not what is left of this server's (a process group's number
        is not given to a new process while any member of it lives)."""
        return self._proc.poll() is not None and _exists(os.kill, group)

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


def _group_alive(group: int) -> bool:
    """Whether any process of the process group is left (a zombie its new parent has not reaped counts)."""
    return _exists(os.killpg, group)


def _exists(send: Callable[[int, int], None], target: int) -> bool:
    """Whether `send(target, 0)` (os.kill, os.killpg) finds a process: signal 0 is checked, not sent."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's
        return True
    return True
