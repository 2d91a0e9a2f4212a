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

PAGING_PREFIX = "kv_"


def load_folder(where: str) -> dict[str, dict[str, Any]]:
    """File name -> baseline document, from a folder or from `git:REV:PATH` (the committed files)."""
    if where.startswith("git:"):
        _, rev, path = where.split(":", 2)
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{path}"], check=True,
                               capture_output=True, text=True).stdout.split()
        return {n: json.loads(subprocess.run(["git", "show", f"{rev}:{path}/{n}"], check=True, capture_output=True,
                                             text=True).stdout) for n in names if n.endswith(".json")}
    return {p.name: json.loads(p.read_text()) for p in sorted(Path(where).glob("*.json"))}


def paging(entry: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    metrics = {k: v for k, v in entry["metrics"].items() if k.startswith(PAGING_PREFIX)}
    return metrics, list((entry.get("timeline") or {}).get("events") or [])


def differs(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """None when the two entries page alike, else what differs first."""
    (om, ot), (nm, nt) = paging(old), paging(new)
    for key in sorted(set(om) | set(nm)):
        if om.get(key) != nm.get(key):
            return f"{key} {om.get(key)} -> {nm.get(key)}"
    for i, (a, b) in enumerate(zip(ot, nt)):
        if a != b:
            return f"timeline event {i}: {a!r} -> {b!r}"
    if len(ot) != len(nt):
        return f"timeline {len(ot)} -> {len(nt)} events"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    args = ap.parse_args(argv)
    old, new = load_folder(args.old), load_folder(args.new)
    same = changed = 0
    for name in sorted(set(old) & set(new)):
        olds = {e["label"]: e for e in old[name]["entries"] if e.get("deterministic")}
        for entry in new[name]["entries"]:
            if not entry.get("deterministic") or entry["label"] not in olds:
                continue
            what = differs(olds[entry["label"]], entry)
            steps = len(paging(entry)[1])
            print(f"{name[:-5]:<80} {entry['label']:<8} {'same' if what is None else 'DIFFERS: ' + what}"
                  f" ({steps} timeline events)")
            same, changed = same + (what is None), changed + (what is not None)
    print(f"paging identity: {same} results the same, {changed} differ ({args.old} vs {args.new})")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
