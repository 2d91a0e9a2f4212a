"""A pytest session in a subprocess whose one test holds a vLLM engine until it is signalled: how the
lifecycle tests (CPU) and the GPU reliability tests check that no engine outlives a killed session."""

from __future__ import annotations

import os
import signal
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
        preexec_fn=_as_in_a_terminal,
    )
    pids_file = pytester.path / "pids.txt"
    deadline = time.monotonic() + start_timeout_s
    while not (pids_file.exists() and pids_file.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the engine never started:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.5)
    return proc, [int(p) for p in pids_file.read_text().split()]


def _as_in_a_terminal() -> None:
    """SIGINT as a terminal's foreground job has it. A test run started in the background of a shell without
    job control (`make test &`) inherits SIGINT ignored, and Python keeps a signal ignored at its start
    ignored: the session then never sees the Ctrl-C this test sends (seen 2026-12-05: "ignored yes")."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen, sig: int, timeout_s: float = 180, second_wait_s: float = 30) -> str:
    """Signals the session and returns what it printed on its way out. A session still there after
    `timeout_s` fails with what it printed, its process tree (the command line and state of each
    process: where it waits) and where the signal went (`_signal_state`), is sent the signal once more (does
    a second one end it?), then is killed with its children."""
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        tree, state = _tree(proc.pid), _signal_state(proc.pid, sig)
        # a second signal tells a lost first one (the session exits now) from one that is never acted on
        proc.send_signal(sig)
        try:
            proc.wait(timeout=second_wait_s)
            second = f"it exited {proc.returncode} within {second_wait_s:.0f} s of a second signal {sig}"
        except subprocess.TimeoutExpired:
            second = f"a second signal {sig} did not end it either"
        for p in _children(proc.pid):
            p.kill()
        proc.kill()
        out = proc.communicate()[0]
        raise AssertionError(f"the session had not exited {timeout_s:.0f} s after signal {sig}; {second}; its processes "
                             f"then:\n{tree}\nits signal state then:\n{state}\n"
                             f"what it printed (last 4000 characters):\n{out[-4000:]}") from None


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_state(pid: int, sig: int) -> str:
    """Whether `sig` is pending, ignored, caught or blocked in the process and each of its threads, from
    /proc (Linux): a signal pending and blocked everywhere, ignored, or caught by a handler that never
    tells Python's are each a different fault."""
    bit = 1 << (sig - 1)

    def fields(path: str) -> dict[str, str]:
        with open(path) as f:
            return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)

    def has(value: str) -> str:
        return "yes" if int(value, 16) & bit else "no"

    try:
        top = fields(f"/proc/{pid}/status")
        lines = [f"  process: shared pending {has(top['ShdPnd'])}, ignored {has(top['SigIgn'])}, "
                 f"caught {has(top['SigCgt'])}"]
        for task in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            t = fields(f"/proc/{pid}/task/{task}/status")
            lines.append(f"  thread {task} {t['Name'].strip()}: pending {has(t['SigPnd'])}, blocked {has(t['SigBlk'])}")
        return "\n".join(lines)
    except (OSError, KeyError, ValueError) as e:
        return f"  (not readable: {e})"


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
