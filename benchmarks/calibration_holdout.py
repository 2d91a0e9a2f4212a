"""Calibrated allowances judged on runs they did not see: leave one out.

Each of N unchanged runs (their `results.json`, compare jobs against one set of stored baselines, each in
its own pytest process) is held out in turn: the other N-1 calibrate a copy of the baselines
(`python -m pytest_llmperf calibrate`'s rule, `calibration.py`), and the held-out run's first pass is
judged against that copy, and against the baselines without any calibration, with the gate's own
comparison (`baseline.compare`, the test's `llmperf_gate`, the session's tolerances under its own markers'). A first pass that
fails is not yet a red run (the gate measures a suspect again); one that passes cannot turn red.

    python benchmarks/calibration_holdout.py --baselines baselines RUN/results.json RUN/results.json ...

With `--slower RUN/results.json ...`: runs with an injected slowdown, judged against the baselines
calibrated from all N unchanged runs: each one a regression caught or missed.

With `--as-shipped RUN/results.json ...`: runs the stored calibration never saw, judged against the
baselines as they are (calibration included): the gate's own first pass, run by run.

With `--unseen`: each calibrated test in turn as a test no calibration has seen (one added, or recorded
again, since the last `calibrate`): its calibration removed, every run's first pass of it judged with
the allowances the gate then lends it from the suite's other tests (`calibration.suite_allowances`),
and with none; with `--scaled-loss`, also each run made that much slower, and each `--slower` run.

With `--scaled-loss 0.10`: each held-out run is also judged with every timing figure made that much
worse (throughput times 0.9, latencies divided by 0.9). A proxy, not a measurement: a real slowdown
does not stretch every latency alike (queueing grows more). It says whether the calibrated allowances
leave the suite room to see a loss of that size; a real slowdown (`--slower`) says whether it does.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from _emit import emit

from pytest_llmperf import baseline as bl
from pytest_llmperf import calibration
from pytest_llmperf.formatting import change
from pytest_llmperf.report import load


def failing(root: Path, run: dict[str, Any], only: str | None = None) -> list[str]:
    """The tests of `run` (or test `only`) whose first pass regresses against the baselines under `root`."""
    session = run["session"]
    default, per_metric = bl.recorded_tolerance(run)
    out = []
    for test in run["tests"]:
        if only is not None and test["test"] != only:
            continue
        if not test["results"]:  # errored before it ran (an unreadable baseline): nothing to compare
            continue
        stored = bl.load(bl.path_for(root, test["test"], session["hardware"], session["model"]))
        if stored is None:
            continue
        verdict = bl.compare(stored, [bl.Entry.from_dict(r) for r in test["results"]],
                             bl.recorded_tolerances(test, per_metric), default,
                             gated=bl.recorded_gate(test),
                             borrowed=calibration.borrowed(stored, root, session["hardware"], session["model"]))
        out += [f"{test['test'].split('::')[-1]} {r.label} {r.metric} {change(r.change)}/{r.allowed:.1%}"
                for r in verdict.regressions]
    return out


def uncalibrated_copy(src: Path, into: Path) -> Path:
    """The baselines under `src` without any calibration they carry (the shipped ones are calibrated)."""
    root = into / "uncalibrated"
    shutil.copytree(src, root)
    for path in root.rglob("*.json"):
        without_calibration(path)
    return root


def without_calibration(path: Path) -> None:
    """The baseline at `path` as if no calibration had seen it."""
    doc = bl.load(path)
    if doc is not None and doc.pop("calibrated", None) is not None:
        for entry in doc["entries"]:
            entry.pop("calibration", None)
            entry.pop("calibration_runs", None)
        bl.write(path, doc)


def scaled(run: dict[str, Any], loss: float) -> dict[str, Any]:
    """`run` with every timing metric worse by `loss` (see the module's text: a proxy)."""
    out = copy.deepcopy(run)
    for test in out["tests"]:
        for result in test["results"]:
            for metrics in [result["metrics"], *result.get("per_repeat", [])]:
                for key, value in metrics.items():
                    if key in bl.TIMING and isinstance(value, (int, float)):
                        metrics[key] = value * (1 - loss) if bl.COMPARED[key] else value / (1 - loss)
    return out


def calibrated_copy(src: Path, runs: list[dict[str, Any]], into: Path) -> Path:
    root = into / "baselines"
    shutil.copytree(uncalibrated_copy(src, into), root)
    session = runs[0]["session"]
    found = calibration.deviations(root, session["hardware"], session["model"], runs, bl.recorded_tolerance(runs[0])[1])
    calibration.write(root, session["hardware"], session["model"], calibration.allowances(found), len(runs))
    return root


def unseen(src: Path, runs: dict[str, dict[str, Any]], slower: dict[str, dict[str, Any]], loss: float) -> None:
    """Each calibrated test judged as one no calibration has seen, with the suite's allowances and without."""
    session = next(iter(runs.values()))["session"]
    hardware, model = session["hardware"], session["model"]
    counts = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        plain = uncalibrated_copy(src, Path(tmp))
        for test_id in sorted({key[0] for key in calibration.stored_deviations(src, hardware, model)}):
            lent = Path(tmp) / "lent"
            shutil.rmtree(lent, ignore_errors=True)
            shutil.copytree(src, lent)
            without_calibration(bl.path_for(lent, test_id, hardware, model))
            for kind, judged in (("unchanged", runs), ("slower", slower)):
                for path, run in judged.items():
                    if not any(t["test"] == test_id and t["results"] for t in run["tests"]):
                        continue
                    for how, root in (("lent", lent), ("none", plain)):
                        found = failing(root, run, test_id)
                        counts[kind, how, "judged"] += 1
                        counts[kind, how, "failing"] += bool(found)
                        if kind == "unchanged" and loss:
                            counts["scaled", how, "caught"] += bool(failing(root, scaled(run, loss), test_id))
                        if found and (kind == "slower" or how == "lent"):
                            print(f"{kind:<9} {how:<4} {path[-24:]:<24} {'; '.join(found)}")
    for how, text in (("lent", "with the suite's allowances"), ("none", "with no calibration")):
        n = counts["unchanged", how, "judged"]
        line = f"unseen tests {text}: {counts['unchanged', how, 'failing']} of {n} unchanged first passes regressed"
        if loss:
            line += f"; made {loss:.0%} slower: {counts['scaled', how, 'caught']} of {n} caught"
        if slower:
            line += f"; slower runs: {counts['slower', how, 'failing']} of {counts['slower', how, 'judged']} caught"
        print(line)
    emit("calibration_unseen", {f"{a}_{b}_{c}": v for (a, b, c), v in sorted(counts.items())})


def as_shipped(root: Path, paths: list[str]) -> None:
    """Each run's first pass against the stored baselines and their calibration, as the gate judged it."""
    rows = [{"run": path, "failing": failing(root, load(path))} for path in paths]
    for row in rows:
        print(f"as shipped {row['run'][-40:]:<40} {len(row['failing']):>3} failing: {'; '.join(row['failing']) or '-'}")
    red = sum(bool(row["failing"]) for row in rows)
    print(f"{len(rows)} runs against the baselines as they are: {red} with a failing first pass")
    emit("calibration_as_shipped", {"runs": len(rows), "red": red, "rows": rows})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baselines", required=True)
    ap.add_argument("--slower", nargs="*", default=[])
    ap.add_argument("--scaled-loss", type=float, default=0.0, help="also judge each held-out run made this much slower")
    ap.add_argument("--as-shipped", nargs="*", default=[], help="runs to judge against the baselines as they are")
    ap.add_argument("--unseen", action="store_true", help="judge each calibrated test as one no calibration has seen")
    ap.add_argument("runs", nargs="*")
    args = ap.parse_args(argv)
    if args.as_shipped:
        as_shipped(Path(args.baselines), args.as_shipped)
    if args.unseen:
        unseen(Path(args.baselines), {p: load(p) for p in args.runs}, {p: load(p) for p in args.slower}, args.scaled_loss)
        return 0
    if not args.runs:
        return 0
    runs = [load(p) for p in args.runs]
    rows, plain_red, cal_red, proxy_caught = [], 0, 0, 0
    print(f"{'held out':<40} {'uncalibrated':>12} {'calibrated':>10}  which (calibrated)")
    for i, path in enumerate(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            root = calibrated_copy(Path(args.baselines), runs[:i] + runs[i + 1:], Path(tmp))
            plain, cal = failing(Path(tmp) / "uncalibrated", runs[i]), failing(root, runs[i])
            slow = failing(root, scaled(runs[i], args.scaled_loss)) if args.scaled_loss else []
        plain_red, cal_red, proxy_caught = plain_red + bool(plain), cal_red + bool(cal), proxy_caught + bool(slow)
        rows.append({"run": path, "uncalibrated": plain, "calibrated": cal, "scaled": slow})
        print(f"{path[-40:]:<40} {len(plain):>12} {len(cal):>10}  {'; '.join(cal) or '-'}")
        if args.scaled_loss:
            tests = sorted({f.split()[0] for f in slow})
            label = f"  made {args.scaled_loss:.0%} slower"
            print(f"{label:<40} {len(slow):>23}  tests failing: {', '.join(tests) or 'MISSED'}")
    print(f"{len(runs)} unchanged runs held out: first pass red {plain_red} uncalibrated, {cal_red} calibrated")
    if args.scaled_loss:
        print(f"made {args.scaled_loss:.0%} slower (a proxy): {proxy_caught} of {len(runs)} caught")
    caught = Counter()
    if args.slower:
        with tempfile.TemporaryDirectory() as tmp:
            root = calibrated_copy(Path(args.baselines), runs, Path(tmp))
            for path in args.slower:
                found = failing(root, load(path))
                caught[bool(found)] += 1
                rows.append({"slower": path, "calibrated": found})
                print(f"slower {path[-40:]:<33} {len(found):>3} failing metrics: {'; '.join(found) or 'MISSED'}")
        print(f"{len(args.slower)} slower runs: {caught[True]} caught")
    emit("calibration_holdout", {"runs": len(runs), "red_uncalibrated": plain_red, "red_calibrated": cal_red,
                                 "scaled_loss": args.scaled_loss, "scaled_caught": proxy_caught,
                                 "slower_caught": caught[True], "slower": len(args.slower), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
