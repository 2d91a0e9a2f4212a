r"""The gate on tests no one here has seen, in its own flow: baselines recorded in one pytest process, then
compared in others, each with its own engine starts, exactly as two CI jobs would run them.

`benchmarks/false_alarms.py` judges pairs of runs offline; this runs the gate itself
(`--llmperf-baseline=require`, which measures a suspected regression again in fresh engine starts before it
fails a test), so every red test here is one a pull request would have seen. A suite written for it,
`benchmarks/unseen_suite/`, was written as a new user would write one, before any of it was run.

    python benchmarks/unseen_gate.py --out /tmp/unseen [--suite benchmarks/unseen_suite] [--compares 5] \
        [--changed "--llmperf-engine-config='{\"max_num_seqs\": 8}'"] [--changed "VAR=value ... options"] [-- pytest options]
    python benchmarks/unseen_gate.py --out /tmp/unseen --table

It records into OUT/baselines (report OUT/record) unless OUT has them, compares K times (OUT/c1 ...), then once per
`--changed`, split as a shell would split it, with those options added and its leading VAR=value words in
the environment (OUT/changed1 ...): a change the gate must flag. Then it prints one row per run (tests
compared, tests failed, the failing rows) and emits JSON (`_emit`); `--table` only prints them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _emit import emit
from _pytest_args import split

from pytest_llmperf.baseline import FAILING

PASSING = frozenset({"passed", "skipped"})
ENV_WORD = re.compile(r"^[A-Z][A-Z0-9_]*=")
COMPARE = re.compile(r"^c\d+$")  # the unchanged compares' reports: c1, c2, ...


def pytest_run(suite: str, mode: str, out: Path, name: str, extra: list[str], env: dict[str, str] | None = None) -> None:
    report = out / name
    report.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", suite, "-q", "-p", "no:cacheprovider", f"--llmperf-baseline={mode}",
           f"--llmperf-baseline-dir={out / 'baselines'}", f"--llmperf-report={report}", *extra]
    start = time.monotonic()
    with open(report / "pytest.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    (report / "run.json").write_text(json.dumps({"rc": rc, "wall_s": round(time.monotonic() - start, 1), "cmd": cmd,
                                                 "env": env or {}}))
    print(f"{name}: rc={rc} wall={time.monotonic() - start:.0f}s", flush=True)


def run(args: argparse.Namespace, pytest_args: list[str]) -> None:
    out = Path(args.out)
    if not (out / "baselines").is_dir():
        pytest_run(args.suite, "update", out, "record", pytest_args)
    for k in range(1, args.compares + 1):
        pytest_run(args.suite, "require", out, f"c{k}", pytest_args)
    for k, change in enumerate(args.changed, 1):
        words = shlex.split(change)
        assignments = list(itertools.takewhile(ENV_WORD.match, words))
        env = dict(w.split("=", 1) for w in assignments)
        options = words[len(assignments):]
        pytest_run(args.suite, "require", out, f"changed{k}", [*pytest_args, *options], env)


def summary(report: Path) -> dict[str, Any]:
    """One run: its tests with a baseline verdict, those that failed, and each failing row. A run that left
    no report (pytest could not start, or crashed) counts as failed: it judged nothing."""
    meta = json.loads((report / "run.json").read_text()) if (report / "run.json").exists() else {}
    if not (report / "results.json").exists():
        return {"run": report.name, "rc": meta.get("rc"), "wall_s": meta.get("wall_s", 0.0), "tests": 0,
                "failed": ["(no report: see pytest.log)"], "rows": [], "starts": 0, "remeasure_s": 0.0}
    results = json.loads((report / "results.json").read_text())
    tests = [t for t in results["tests"] if t["results"]]
    failed = [t for t in tests if t["outcome"] not in PASSING]
    rows = [f"{t['test'].split('::')[-1]} {r['label']} {r['metric']} {r['verdict']}"
            for t in failed for r in t["baseline_rows"] if r["verdict"] in FAILING]
    ttv = results["session"]["time_to_verdict_s"]
    return {"run": report.name, "rc": meta.get("rc"), "wall_s": ttv["wall"], "tests": len(tests),
            "failed": [t["test"].split("::")[-1] for t in failed], "rows": rows,
            "starts": ttv["engine_starts"], "remeasure_s": ttv["re-measurement"]}


def red(run: dict[str, Any]) -> bool:
    """A run a pull request would have seen red: a failed test, or pytest's own exit status."""
    return bool(run["failed"]) or run["rc"] not in (0, None)


def table(out: Path) -> int:
    reports = [d for d in out.iterdir() if (d / "results.json").exists() or (d / "run.json").exists()]
    runs = [summary(d) for d in sorted(reports, key=lambda p: (len(p.name), p.name))]
    print(f"{'run':<10} {'rc':>3} {'wall s':>7} {'starts':>6} {'re-measure s':>12} {'tests':>5} {'failed':>6}  failing rows")
    for r in runs:
        print(f"{r['run']:<10} {r['rc']!s:>3} {r['wall_s']:>7.0f} {r['starts']:>6} {r['remeasure_s']:>12.0f} "
              f"{r['tests']:>5} {len(r['failed']):>6}  {'; '.join(r['rows']) or '-'}")
    compares = [r for r in runs if COMPARE.match(r["run"])]
    reds = sum(map(red, compares))
    print(f"{len(compares)} unchanged compares: {reds} red; "
          f"{sum(len(r['failed']) for r in compares)} failing test verdicts of {sum(r['tests'] for r in compares)}")
    emit("unseen_gate", {"runs": runs, "unchanged_compares": len(compares), "red": reds})
    return 0


def main(argv: list[str]) -> int:
    argv, pytest_args = split(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the folder of the baselines and of each run's report")
    parser.add_argument("--suite", default="benchmarks/unseen_suite")
    parser.add_argument("--compares", type=int, default=5)
    parser.add_argument("--changed", action="append", default=[], help="a change the gate must flag: options, VAR=value first")
    parser.add_argument("--table", action="store_true", help="only print the table of the runs already in OUT")
    args = parser.parse_args(argv)
    if not args.table:
        run(args, pytest_args)
    return table(Path(args.out))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
