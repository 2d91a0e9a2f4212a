"""A port taken before a server binds it: how the local-server tests (vllm serve, llama-server) check that a
start which lost its port is tried again on a new one."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def first_port_taken(env: pytest.MonkeyPatch) -> Iterator[int]:
    """While inside: the first port `local_server.free_port` offers is one another socket listens on (yielded),
    later ones are free. Start the server inside."""
    from pytest_llmperf.engines import local_server

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        first = held.getsockname()[1]
        taken, free = iter([first]), local_server.free_port
        env.setattr(local_server, "free_port", lambda: next(taken, None) or free())
        yield first
