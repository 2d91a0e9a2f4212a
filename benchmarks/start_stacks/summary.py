"""Where an engine process's start went, from sitecustomize.py's samples: one line per sample, the working
thread's vLLM phase, its innermost frame and its innermost vLLM frame; then the samples counted by phase.
`python summary.py DIR/stacks-PID.txt [...]`; `python summary.py --longest DIR` for the file of DIR with the most
samples (the longest start sampled there), or nothing where DIR holds none."""

import collections
import glob
import os
import sys


def samples(path: str) -> list[tuple[str, list[list[str]]]]:
    """(time, the stacks of its threads, innermost frame first) of each sample in `path`."""
    found: list[tuple[str, list[list[str]]]] = []
    with open(path) as lines:
        for line in lines:
            if line.startswith("@ "):
                found.append((line[2:].strip(), []))
            elif line.startswith("thread ") and found:
                found[-1][1].append([])
            elif line.startswith("  ") and found and found[-1][1]:
                found[-1][1][-1].append(line.strip())
    return found


IDLE = {"wait", "select", "_recv", "recv", "poll", "sleep", "_wait_for_tstate_lock", "accept", "recv_multipart",
        "_recv_bytes", "recv_pyobj", "readinto", "_worker", "get"}
# vLLM's start, phase by phase (the worker's and the engine core's methods)
PHASES = ("init_device", "load_model", "profile_run", "determine_available_memory", "_initialize_kv_caches",
          "initialize_from_config", "capture_model", "compile_or_warm_up_model", "warmup_kernels", "_dummy_run")


def busiest(threads: list[list[str]]) -> list[str]:
    """The thread doing the work: the longest stack of those not waiting."""
    working = [t for t in threads if t and t[0].rpartition(" ")[2] not in IDLE]
    return max(working or threads, key=len, default=[])


def phase(stack: list[str]) -> str:
    names = [f.rpartition(" ")[2] for f in stack]
    return "/".join(n for n in reversed(names) if n in PHASES) or "-"


def short(frame: str) -> str:
    where, _, name = frame.rpartition(" ")
    path, _, lineno = where.rpartition(":")
    return f"{path.split('site-packages/')[-1]}:{lineno} {name}"


def longest(folder: str) -> list[str]:
    """The stacks file of `folder` with the most samples, as a list of at most one path."""
    files = glob.glob(os.path.join(folder, "stacks-*.txt"))
    return [max(files, key=lambda f: len(samples(f)))] if files else []


def main(paths: list[str]) -> None:
    for path in paths:
        print(f"== {path}")
        seen: collections.Counter[str] = collections.Counter()
        for when, threads in samples(path):
            stack = busiest(threads)
            inner = short(stack[0]) if stack else "-"
            ours = next((short(f) for f in stack if "/vllm/" in f), "-")
            seen[phase(stack)] += 1
            print(f"{when:>7}  {phase(stack)}  {inner}  <<  {ours}")
        print("samples by phase:", *(f"{n} x {f}" for f, n in seen.most_common(8)), sep="\n  ")


if __name__ == "__main__":
    main(longest(sys.argv[2]) if sys.argv[1:2] == ["--longest"] else sys.argv[1:])
