"""`python -m pytest_llmperf compare OLD.json NEW.json`: the baseline rules applied to two results files
written by `--llmperf-report`. Exit status 1 on a regression, 2 on bad input (two reports with no test in common too).

`python -m pytest_llmperf calibrate RUN.json RUN.json RUN.json ... [--baseline-dir baselines] [--add]`: the
allowance each gated timing metric needs, from unchanged runs compared with the stored baselines
(`calibration.py`), written into those baselines; with --add, the runs join those the baselines were
calibrated from. Exit status 2 on bad input."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from . import calibration
from .baseline import (
    DEFAULT_TOLERANCE,
    PAGING_MODES,
    BaselineError,
    compare_results,
    parse_tolerance,
    recorded_tolerance,
)
from .models import stored_name
from .report import load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_llmperf")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="compare two results.json files (old, new)")
    cmp.add_argument("old")
    cmp.add_argument("new")
    cmp.add_argument("--tolerance", default=None,
                     help="relative tolerance of timing metrics, and per metric if given: 0.10,output_tokens_per_s=0.05 "
                          f"(default: the new run's own, as its gate judged; {DEFAULT_TOLERANCE} in a report that "
                          "names none)")
    cmp.add_argument("--paging", choices=PAGING_MODES, default=None,
                     help="whether a moved step timeline fails (strict) or is reported (summary); default: the new "
                          "run's own --llmperf-paging")
    cal = sub.add_parser("calibrate", help="store in the baselines the allowance unchanged runs show each metric needs")
    cal.add_argument("runs", nargs="+", help=f"results.json of at least {calibration.MIN_RUNS} unchanged runs "
                                             "(--llmperf-report), each in its own pytest process (with --add, any number)")
    cal.add_argument("--baseline-dir", default="baselines", help="the baselines the runs were compared with")
    cal.add_argument("--alpha", type=_share, default=calibration.ALPHA,
                     help=f"false-alarm budget of the whole suite per run (default {calibration.ALPHA})")
    cal.add_argument("--add", action="store_true",
                     help="add these runs to those the stored calibration came from (other machines, other days) "
                          "instead of replacing it")
    cal.add_argument("--dry-run", action="store_true", help="print the allowances, write nothing")
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        return _calibrate(args)
    try:
        old, new = load(args.old), load(args.new)
        _one_class_and_model(old, new)
        tolerance, tolerances = parse_tolerance(args.tolerance) if args.tolerance else recorded_tolerance(new)
        paging = args.paging or new["session"].get("paging", "strict")
        text, regressed, compared = compare_results(old, new, tolerance, tolerances, paging)
    except (ValueError, KeyError, TypeError) as e:  # bad input is status 2: status 1 means a regression
        print(f"error: {_why(e)}", file=sys.stderr)
        return 2
    print(text)
    if not compared:  # nothing compared never reads as a pass
        print("error: nothing was compared: no test has a result of the same workload, label and engine in both "
              "reports (see each test's line above); give two results.json of the same suite (--llmperf-report), "
              "the old one first", file=sys.stderr)
        return 2
    return 1 if regressed else 0


def _one_class_and_model(old: dict[str, Any], new: dict[str, Any]) -> None:
    """A baseline holds for one hardware class and model, so the reports must share both: an H100 run against an
    H200 one would fail as a regression, a smaller model's would pass as an improvement."""
    before, after = _class_and_model(old), _class_and_model(new)
    if before != after:
        raise ValueError(f"the reports are of different hardware classes or models (old: {before[0]}, {before[1]}; "
                         f"new: {after[0]}, {after[1]}): a baseline judges one class and model; compare a run with one "
                         "of the same class and model")


def _class_and_model(report: dict[str, Any]) -> tuple[str, str]:
    """A report's hardware class and its model as baselines name it (`models.stored_name`: a hub id and its
    snapshot in Hugging Face's cache are one model; a local folder is known by its name, not its path)."""
    return report["session"]["hardware"], stored_name(report["session"]["model"])


def _why(error: Exception) -> str:
    """What was wrong with the input, in a sentence: a missing key says it is not a report this plugin wrote."""
    if isinstance(error, KeyError):
        return (f"a results file without {error} where a --llmperf-report results.json holds it: give the "
                "results.json of runs this version of pytest-llmperf wrote")
    if isinstance(error, TypeError):
        return f"a results file this version of pytest-llmperf cannot read ({error})"
    return str(error)


def _share(text: str) -> float:
    """--alpha: a probability, strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share strictly between 0 and 1 (e.g. 0.05: 5% per run)")
    return value


def _calibrate(args: argparse.Namespace) -> int:
    try:
        runs = [load(path) for path in args.runs]
        _each_once(runs, args.runs)
        hardware, model, tolerances = _session(runs, args.runs, args.add)
        root = Path(args.baseline_dir)
        for path, run in zip(args.runs, runs):
            _unchanged(root, hardware, model, run, path)
        if args.add:
            found, kept = _added(root, hardware, model, runs, args.runs, tolerances), 0
        else:
            found = calibration.deviations(root, hardware, model, runs, tolerances)
            kept = calibration.kept_elsewhere(root, hardware, model, found)
        calibrated = calibration.allowances(found, args.alpha, kept)
    except (ValueError, KeyError, TypeError, BaselineError) as e:
        print(f"error: {_why(e)}", file=sys.stderr)
        return 2
    if not calibrated:
        print(f"error: no metric was measured by {calibration.MIN_RUNS} of these runs against a baseline in "
              f"{args.baseline_dir}/{hardware}/ (with --add, counting the runs stored there): pass the results.json "
              "of compare runs of the same suite", file=sys.stderr)
        return 2
    print(calibration.table(calibrated, args.alpha))
    if args.dry_run:
        return 0
    total = max(len(a.deviations) for a in calibrated)  # with --add, the stored runs and these
    try:
        written = calibration.write(root, hardware, model, calibrated, total, args.alpha, len(calibrated) + kept)
    except BaselineError as e:  # each baseline is written whole or not at all; the message names the one that failed
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"calibrated {len(calibrated)} metrics of {len(written)} baselines from {total} runs "
          f"(alpha {args.alpha} over the suite)")
    return 0


def _added(root: Path, hardware: str, model: str, runs: list[dict[str, Any]], paths: list[str],
           tolerances: dict[str, float]) -> dict[tuple[str, str, str], list[float]]:
    """The stored calibration runs with these joined, each refused if it is already among them."""
    found = calibration.stored_deviations(root, hardware, model)
    for path, run in zip(paths, runs):
        own = calibration.deviations(root, hardware, model, [run], tolerances)
        if calibration.seen_before(found, own):
            raise ValueError(f"{path}: every deviation of this run is already stored in the calibration of "
                             f"{root}/{hardware}/ (added before, or given twice): leave it out")
        found = calibration.merged(found, own)
    return found


def _each_once(runs: list[dict[str, Any]], paths: list[str]) -> None:
    """Each run once: the same file (or a copy of it) twice would count one machine's spread as two runs'."""
    for i, run in enumerate(runs):
        if run in runs[:i]:
            raise ValueError(f"{paths[i]} and {paths[runs.index(run)]} are the same run: give each run once")


def _unchanged(root: Path, hardware: str, model: str, run: dict[str, Any], path: str) -> None:
    mode = run["session"].get("baseline_mode")  # a run kept by benchmarks/keep_run.py before 2026-12-08 names none
    if mode not in (None, "compare", "require"):
        raise ValueError(f"{path} ran with --llmperf-baseline={mode}: it was not compared with the baselines, so it "
                         "shows nothing of their spread (a run that recorded them deviates by 0); calibrate from runs "
                         "made with --llmperf-baseline=compare or require")
    changed = calibration.changed_settings(root, hardware, model, run)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise ValueError(f"{path} is not an unchanged run: {changed[0]}{more}; calibrate from compare runs of the "
                         f"code and settings the baselines in {root}/{hardware}/ were recorded with")


def _session(runs: list[dict[str, Any]], paths: list[str], add: bool) -> tuple[str, str, dict[str, float]]:
    """The hardware class, model and per-metric tolerances every run shares."""
    if len(runs) < calibration.MIN_RUNS and not add:
        raise ValueError(f"a calibration needs at least {calibration.MIN_RUNS} runs, got {len(runs)}")
    sessions = [_class_and_model(r) for r in runs]
    if len(set(sessions)) > 1:
        found = ", ".join(f"{p}: {h}/{m}" for p, (h, m) in zip(paths, sessions))
        raise ValueError(f"the runs are of different hardware classes or models ({found}); calibrate each apart")
    return sessions[0][0], sessions[0][1], recorded_tolerance(runs[0])[1]


if __name__ == "__main__":
    sys.exit(main())
