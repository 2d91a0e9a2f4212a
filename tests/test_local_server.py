"""A server process the plugin starts (`engines/local_server.py`) stops whole: a toy server (Python's own
HTTP server answering /health, with a child of its own as `vllm serve` has its engine core), not an engine."""

import os
import signal
import sys
import time

import psutil

from pytest_llmperf.engines.local_server import LocalServer

TOY = """
import http.server, subprocess, sys
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[2], "w").write(str(child.pid))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


class ToyServer(LocalServer):
    name, port_taken = "toy server", "Address already in use"
    stop_timeout_s = 5.0

    def __init__(self, folder):
        self.script, self.child_file = folder / "toy.py", folder / "child.pid"
        self.script.write_text(TOY)
        super().__init__(folder / "logs", startup_timeout_s=30)

    def _command(self, port):
        return [sys.executable, str(self.script), str(port), str(self.child_file)]

    @property
    def child(self):
        return psutil.Process(int(self.child_file.read_text()))


def gone(process, within_s=5.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_a_server_whose_leader_was_killed_alone_still_has_its_children_stopped(tmp_path):
    """The OOM killer takes `vllm serve`'s API process and leaves its engine core holding the card: stopping
    (or restarting) the server stops what is left of its process group."""
    server = ToyServer(tmp_path)
    child = server.child
    os.kill(server.pid, signal.SIGKILL)  # the leader alone
    time.sleep(0.3)
    assert child.is_running() and server.returncode is not None
    server.stop()
    assert gone(child), "the server's child outlived its stop"


def test_a_running_server_stops_with_its_children(tmp_path):
    server = ToyServer(tmp_path)
    child = server.child
    server.stop()
    assert server.returncode is not None and gone(child)
