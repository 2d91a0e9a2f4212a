"""A sampling profiler for the engine processes multiprocessing starts (vLLM's engine cores): with this folder
on PYTHONPATH and LLMPERF_STACKS=DIR, every process multiprocessing forks or spawns writes the stacks of its
threads to DIR/stacks-PID.txt every LLMPERF_STACKS_EVERY seconds (default 0.5), from its start until one of
its threads enters vLLM's busy loop (the engine is ready) or LLMPERF_STACKS_FOR seconds (default 90) have
passed, so that nothing samples an engine while it is measured. Read with `summary.py` beside it."""

import os
import sys

BUSY_LOOP = "run_busy_loop"  # vLLM's EngineCoreProc: the engine has started and serves requests


def _sample(path: str, every: float, limit: float) -> None:
    import threading
    import time
    import traceback

    me = threading.get_ident()
    began = time.time()
    with open(path, "w", buffering=1) as out:  # line by line: a process that ends without closing it keeps its samples
        out.write(f"started {began:.3f} every {every}\n")
        while time.time() - began < limit:
            time.sleep(every)
            stacks = {k: traceback.extract_stack(v) for k, v in sys._current_frames().items() if k != me}
            out.write(f"@ {time.time() - began:.2f}\n")
            for ident, stack in stacks.items():
                out.write(f"thread {ident}\n")
                out.writelines(f"  {f.filename}:{f.lineno} {f.name}\n" for f in reversed(stack[-80:]))
            if any(f.name == BUSY_LOOP for stack in stacks.values() for f in stack):
                out.write("ready\n")
                return


def _start() -> None:
    import threading

    path = os.path.join(os.environ["LLMPERF_STACKS"], f"stacks-{os.getpid()}.txt")
    every, limit = float(os.environ.get("LLMPERF_STACKS_EVERY", "0.5")), float(os.environ.get("LLMPERF_STACKS_FOR", "90"))
    threading.Thread(target=_sample, args=(path, every, limit), name="llmperf-stacks", daemon=True).start()


if os.environ.get("LLMPERF_STACKS"):
    os.register_at_fork(after_in_child=_start)
    if "--multiprocessing-fork" in sys.argv:  # a spawned child: this interpreter is the new process
        _start()
