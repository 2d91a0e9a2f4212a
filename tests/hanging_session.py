"""A pytest session in a subprocess whose one test holds a vLLM engine until it is signalled: how the
lifecycle tests (CPU) and the GPU reliability tests check that no engine outlives a killed session."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

HANG = """
import time
import psutil

def test_hang(vllm_engine):
    kids = [p.pid for p in psutil.Process().children(recursive=True)]
    with open("pids.txt", "w") as f:
        f.write(" ".join(map(str, kids)))
    time.sleep(600)
"""


def start(pytester, engine_config: str, start_timeout_s: float = 240) -> tuple[subprocess.Popen, list[int]]:
    """The session, once its engine is up, and the pids of the engine's processes."""
    pytester.makepyfile(test_hang=HANG)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_hang.py", "--llmperf-engine=vllm",
         f"--llmperf-engine-config={engine_config}"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    pids_file = pytester.path / "pids.txt"
    deadline = time.monotonic() + start_timeout_s
    while not (pids_file.exists() and pids_file.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the engine never started:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.5)
    return proc, [int(p) for p in pids_file.read_text().split()]


def stop(proc: subprocess.Popen, sig: int, timeout_s: float = 180) -> str:
    """Signals the session and returns what it printed on its way out. A session still there after
    `timeout_s` fails with what it printed and its process tree (the command line and state of each
    process: where it waits), then is killed with its children."""
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        tree = _tree(proc.pid)
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        out = proc.communicate()[0]
        raise AssertionError(f"the session had not exited {timeout_s:.0f} s after signal {sig}; its processes then:\n"
                             f"{tree}\nwhat it printed (last 4000 characters):\n{out[-4000:]}") from None


def _tree(pid: int) -> str:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        return "\n".join(f"  {p.pid} {p.status()} threads={p.num_threads()} {' '.join(p.cmdline())[:160]}"
                         for p in procs if p.is_running())
    except psutil.Error as e:
        return f"  (not readable: {e})"


def survivors(pids: list[int]) -> list[int]:
    time.sleep(2)  # a process that is exiting gets a moment to finish
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
