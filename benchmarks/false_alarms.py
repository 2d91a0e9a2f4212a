"""The gate's false-alarm rate on the shipped suite, as CI meets it: separate pytest processes.

A baseline is recorded in one CI job and compared in another, each with its own engine starts. This
runs the suite K times in K pytest processes (`--llmperf-baseline=update`, each into a baseline
folder of its own, with `--llmperf-report`), then judges every ordered pair (i, j), i != j, with the
plugin's own comparison (`baseline.compare`): run j's first pass against run i's stored baseline, and,
where that regresses on timing only, the best of run j's passes against it (the gate's second look;
`judge` measures again in fresh engine starts, so this is the harder test). K runs give K(K-1)
unchanged-code verdicts of the whole suite.

    python benchmarks/false_alarms.py run --runs 4 --out /tmp/aa [--tolerance T] -- perf_tests [pytest options]
    python benchmarks/false_alarms.py judge /tmp/aa/run1 /tmp/aa/run2 ... [--tolerance T]

A run folder holds `results.json` (`--llmperf-report`) and, for runs that recorded, `baselines/`. A
run without baselines (a compare-mode CI job) can be judged against the others but is no baseline.
`--tolerance` is the gate's (`--llmperf-tolerance`); without it the suite's ini value applies, read
from each run's results.json. Prints one row per pair and a summary line; emits JSON (`_emit`).
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _emit import emit
from _pytest_args import split

from pytest_llmperf import baseline as bl
from pytest_llmperf.baseline import Entry
from pytest_llmperf.report import load


def run(args: argparse.Namespace, pytest_args: list[str]) -> list[Path]:
    out = Path(args.out)
    dirs = []
    for k in range(1, args.runs + 1):
        d = out / f"run{k}"
        d.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pytest", *pytest_args, "--llmperf-baseline=update",
               f"--llmperf-baseline-dir={d / 'baselines'}", f"--llmperf-report={d}", "-q", "-p", "no:cacheprovider"]
        if args.tolerance:
            cmd.append(f"--llmperf-tolerance={args.tolerance}")
        start = time.monotonic()
        with open(d / "pytest.log", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"run{k}: rc={rc} wall={time.monotonic() - start:.0f}s", flush=True)
        dirs.append(d)
    return dirs


def _tests(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["test"]: t for t in results["tests"] if t["results"]}


def judge_pair(base: Path, cur: Path, tolerance: float, tolerances: dict[str, float]) -> dict[str, Any]:
    """Run `cur` against the baselines run `base` recorded: per test, its verdict after the second look."""
    session = load(base / "results.json")["session"]
    current = load(cur / "results.json")
    best_dir = cur / "baselines"
    failed, suspected, compared, metrics = [], 0, 0, Counter()
    for test_id, test in _tests(current).items():
        stored = bl.load(bl.path_for(base / "baselines", test_id, session["hardware"], session["model"]))
        if stored is None:
            continue
        compared += 1
        first = [Entry.from_dict(r) for r in test["results"]]
        gated = bl.recorded_gate(test)  # the test's llmperf_gate
        verdict = bl.compare(stored, first, tolerances, tolerance, gated=gated)
        if verdict.status != "regression":
            continue
        suspected += 1
        if verdict.worth_measuring_again():
            again = bl.load(bl.path_for(best_dir, test_id, session["hardware"], session["model"]))
            if again is not None:  # the best of this run's passes, as its own update recorded them
                best = {e["label"]: Entry.from_dict(e) for e in again["entries"]}
                verdict = bl.compare(stored, [best.get(e.label, e) for e in first], tolerances, tolerance, gated=gated)
        if verdict.status == "regression":
            failed.append(test_id)
            metrics.update(f"{r.metric} ({r.label})" for r in verdict.regressions)
    return {"baseline": base.name, "current": cur.name, "tests": compared, "suspected": suspected,
            "failed": failed, "metrics": dict(metrics)}


def _tolerance(args: argparse.Namespace, runs: list[Path]) -> tuple[float, dict[str, float]]:
    if args.tolerance:
        return bl.parse_tolerance(args.tolerance)
    return bl.recorded_tolerance(load(runs[0] / "results.json"))


def judge(args: argparse.Namespace, runs: list[Path]) -> int:
    tolerance, tolerances = _tolerance(args, runs)
    bases = [r for r in runs if (r / "baselines").is_dir()]
    pairs = [judge_pair(b, c, tolerance, tolerances) for b, c in itertools.permutations(runs, 2) if b in bases]
    print(f"{'baseline':<12} {'current':<12} {'tests':>5} {'1st-pass suspects':>17} {'failed':>6}  which")
    for p in pairs:
        which = ", ".join(f"{t.split('::')[-1]}" for t in p["failed"]) or "-"
        print(f"{p['baseline']:<12} {p['current']:<12} {p['tests']:>5} {p['suspected']:>17} {len(p['failed']):>6}  {which}")
    red = sum(bool(p["failed"]) for p in pairs)
    failing = sum(len(p["failed"]) for p in pairs)
    judged = sum(p["tests"] for p in pairs)
    metrics = sum((Counter(p["metrics"]) for p in pairs), Counter())
    print(f"{len(pairs)} unchanged suite comparisons: {red} red ({red / max(len(pairs), 1):.0%}); "
          f"{failing} failing test verdicts of {judged}; metrics: {dict(metrics) or '-'}")
    emit("false_alarms", {"pairs": len(pairs), "red": red, "failing_tests": failing, "test_verdicts": judged,
                          "tolerance": [tolerance, tolerances], "metrics": dict(metrics),
                          "rows": pairs})
    return 0


def main(argv: list[str]) -> int:
    argv, pytest_args = split(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--runs", type=int, default=4)
    r.add_argument("--out", required=True)
    r.add_argument("--tolerance", default="")
    j = sub.add_parser("judge")
    j.add_argument("runs", nargs="+")
    j.add_argument("--tolerance", default="")
    args = parser.parse_args(argv)
    if args.command == "run":
        return judge(args, run(args, pytest_args))
    return judge(args, [Path(p) for p in args.runs])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
