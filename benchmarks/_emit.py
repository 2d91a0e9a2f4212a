"""Every benchmark ends the same way: one JSON row on stdout, appended to $OUT/<name>.jsonl when OUT is
set (the device tool brings $OUT back)."""

import json
import os
from pathlib import Path


def emit(name: str, row: dict) -> None:
    print(json.dumps(row))
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / f"{name}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
