"""How long loading the plugin costs a pytest session that uses no engine (target: a few hundred ms).
Median wall time of fresh interpreters importing `pytest_llmperf.plugin`, against bare `import pytest`."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def wall(code: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    runs = 9
    bare = wall("import pytest", runs)
    plugin = wall("import pytest_llmperf.plugin", runs)
    engines_loaded = wall("import sys, pytest_llmperf.plugin; assert 'torch' not in sys.modules and 'vllm' not in sys.modules",
                          3)
    row = {"runs": runs, "pytest_median_s": round(statistics.median(bare), 3),
           "plugin_median_s": round(statistics.median(plugin), 3),
           "plugin_cost_s": round(statistics.median(plugin) - statistics.median(bare), 3),
           "engines_imported": False, "check_runs": len(engines_loaded)}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
