"""Time to verdict: the wall time of `pytest perf_tests`, split into engine start, warm-up, measurement,
re-measurement, engine stop, bandwidth probe, plots, collection, judging and the rest (pytest, reports),
with each engine start's seconds, from the plugin's own phase clock (`results.json` ->
session.time_to_verdict_s; the same line ends the terminal summary).

    python benchmarks/time_to_verdict.py [-- extra pytest arguments, e.g. -m "not slow"]
Writes one JSON line to $OUT/time_to_verdict.jsonl when OUT is set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _emit import emit

ROOT = Path(__file__).resolve().parent.parent


def main(extra: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:cacheprovider",
                               f"--llmperf-report={tmp}", *extra], cwd=ROOT, capture_output=True, text=True)
        outside = time.perf_counter() - t
        report = Path(tmp) / "results.json"
        if not report.exists():
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return 1
        doc = json.loads(report.read_text())
    phases = doc["session"]["time_to_verdict_s"]
    outcomes = [line for line in proc.stdout.splitlines() if " passed" in line or " failed" in line][-1:]
    row = {"process_wall_s": round(outside, 1), **phases, "tests": len(doc["tests"]),
           "outcome": outcomes[0].strip("= ") if outcomes else "", "pytest_rc": proc.returncode}
    emit("time_to_verdict", row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
