"""Cut a gate run's `results.json` to what a baseline comparison and a calibration read, for keeping
under `benchmarks/data/` (the full file holds every request, timeline and workload):

    python benchmarks/keep_run.py RUN/results.json OUT.json [--tests perf_tests/test_latency.py]

Keeps the session's hardware class, model, tolerances, baseline and paging modes and time to verdict, and of each test
(of the given files, by default the latency module: the tests whose timing a calibration covers) its outcome, gate and results
without their summaries, timelines and workloads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DROPPED = ("summary", "timeline", "workload")


SESSION_KEYS = ("hardware", "model", "tolerance", "baseline_mode", "paging", "time_to_verdict_s")


def kept(doc: dict, files: tuple[str, ...]) -> dict:
    session = doc["session"]
    tests = [{"gated": t.get("gated"), "outcome": t["outcome"], "test": t["test"],
              "results": [{k: v for k, v in r.items() if k not in DROPPED} for r in t["results"]]}
             for t in doc["tests"] if t["test"].split("::")[0] in files]
    return {"schema": doc["schema"], "tests": tests,
            "session": {k: session[k] for k in SESSION_KEYS if k in session}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("out")
    parser.add_argument("--tests", nargs="+", default=["perf_tests/test_latency.py"])
    args = parser.parse_args()
    doc = kept(json.loads(Path(args.run).read_text()), tuple(args.tests))
    Path(args.out).write_text(json.dumps(doc, separators=(", ", ": ")) + "\n")
    print(f"{args.out}: {len(doc['tests'])} tests")


if __name__ == "__main__":
    main()
