"""Whether two sets of baselines hold the same paging: every exact (deterministic) paging metric and the
step timeline of each result, file by file. How "the tiny shape pages as the 8B shape does" is checked
on the product's own files: record the paging tests twice (e.g. before and after pinning them to a small
model) and compare the folders, or a folder against the committed files of a git revision.

    python benchmarks/paging_identity.py OLD NEW
    python benchmarks/paging_identity.py git:HEAD:baselines/h200/shape_llama-3.1-8b baselines/h200/shape_llama-3.1-8b

Prints one row per result (same, or the first metric or timeline step that differs) and a summary line;
exit status 1 when any result's paging differs. Timing metrics are not compared (they are noisy).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_llmperf import baseline as bl
from pytest_llmperf.baseline import Entry

# the exact paging summaries and the step timeline, compared by the gate's own rule (`baseline.compare`)
PAGING = bl.GATE_GROUPS["paging"]


def load_folder(where: str) -> dict[str, dict[str, Any]]:
    """File name -> baseline document, from a folder or from `git:REV:PATH` (the committed files)."""
    if where.startswith("git:"):
        _, rev, path = where.split(":", 2)
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{path}"], check=True,
                               capture_output=True, text=True).stdout.split()
        return {n: json.loads(subprocess.run(["git", "show", f"{rev}:{path}/{n}"], check=True, capture_output=True,
                                             text=True).stdout) for n in names if n.endswith(".json")}
    return {p.name: json.loads(p.read_text()) for p in sorted(Path(where).glob("*.json"))}


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str | None]:
    """Label -> None where the deterministic result pages as its old one does, else what differs first
    (the gate's reason: the metric, or the first diverging step of the timeline)."""
    current = [Entry.from_dict(e) for e in new["entries"] if e.get("deterministic")]
    verdict = bl.compare(old, current, gated=PAGING)
    out: dict[str, str | None] = {}
    for entry in current:
        standing = verdict.labels.get(entry.label)
        moved = [r for r in verdict.regressions if r.label == entry.label]
        out[entry.label] = (f"not compared ({standing})" if standing != bl.COMPARED_LABEL else
                            f"{moved[0].metric}: {moved[0].reason}" if moved else None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    args = ap.parse_args(argv)
    old, new = load_folder(args.old), load_folder(args.new)
    same = changed = 0
    for name in sorted(set(old) & set(new)):
        events = {e["label"]: len((e.get("timeline") or {}).get("events") or []) for e in new[name]["entries"]}
        for label, what in differences(old[name], new[name]).items():
            print(f"{name[:-5]:<80} {label:<8} {'same' if what is None else 'DIFFERS: ' + what}"
                  f" ({events[label]} timeline events)")
            same, changed = same + (what is None), changed + (what is not None)
    print(f"paging identity: {same} results the same, {changed} differ ({args.old} vs {args.new})")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
