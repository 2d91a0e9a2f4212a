"""`python -m pytest_llmperf compare OLD.json NEW.json`: the baseline rules applied to two results files
written by `--llmperf-report`. Exit status 1 on a regression, 2 on bad input."""

from __future__ import annotations

import argparse
import sys

from .baseline import DEFAULT_TOLERANCE, compare_results, parse_tolerance
from .report import load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_llmperf")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="compare two results.json files (old, new)")
    cmp.add_argument("old")
    cmp.add_argument("new")
    cmp.add_argument("--tolerance", default=str(DEFAULT_TOLERANCE),
                     help=f"relative tolerance of timing metrics (default {DEFAULT_TOLERANCE}), and per metric "
                          "if given: 0.10,output_tokens_per_s=0.05")
    args = parser.parse_args(argv)
    try:
        tolerance, tolerances = parse_tolerance(args.tolerance)
        old, new = load(args.old), load(args.new)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text, regressed = compare_results(old, new, tolerance, tolerances)
    print(text)
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main())
