"""The plugin's overhead and fidelity against bare vLLM.

Overhead: the same offline workload (token-id prompts, mixed lengths) through bare vLLM
(`LLM.generate`, no plugin) and through `llmperf.run` with every recorder on (per-step paging
recorder, NVML where there is a GPU), in interleaved pairs whose order alternates; the ratio of output
throughputs (plugin / bare), median over the pairs.

Fidelity: our client-side timestamps against vLLM's own per-request ones (`RequestOutput.metrics`, on
an engine of the same configuration with vLLM's stats on, which the plugin leaves off): our TTFT
against the TTFT vLLM reports for the request (its front end's clock), when we saw the first/last
token against when the engine core produced it, and our submit against the front end's arrival.

    python benchmarks/overhead_fidelity.py --pairs 5 --requests 256 [--config JSON]
    (--config '{"llmperf_stream": "delta"}' measures the plugin streaming deltas to each request)
Writes one JSON line to $OUT/overhead_fidelity.jsonl when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from _emit import emit

from pytest_llmperf import Workload
from pytest_llmperf.engines.vllm import STREAM_OPTION, VLLMEngine, _is_cpu_build
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import LLMPerf


def bare_llm(model, config: dict, cpu: bool):
    from vllm import LLM

    args = {"model": model.path, "skip_tokenizer_init": True, "load_format": "dummy", "seed": 0,
            "max_model_len": min(model.max_position_embeddings or 4096, 4096)}
    if cpu:
        args.update(block_size=32, dtype="bfloat16")
    ours_only = {STREAM_OPTION}  # the plugin's own engine options; bare vLLM would refuse them
    return LLM(**{**args, **{k: v for k, v in config.items() if k not in ours_only}})


def bare_throughput(llm, workload: Workload, vocab: int, salt: int) -> float:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=workload.token_ids(i, vocab, salt)) for i in range(len(workload))]
    params = [SamplingParams(max_tokens=r.output_len, ignore_eos=True, detokenize=False, temperature=0.0)
              for r in workload.requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def fidelity(result_traces) -> dict:
    ttft, first, last, arrival = [], [], [], []
    for trace in result_traces:
        for s in trace.sequences:
            e = s.engine_times
            if s.ok and e:
                if e.ttft_s is not None:  # our TTFT minus the TTFT vLLM itself reports for the request
                    ttft.append((s.chunks[0].t - s.submit_t - e.ttft_s) * 1e3)
                first.append((s.chunks[0].t - e.first_token) * 1e3)  # we saw the first token this long after the core made it
                last.append((s.chunks[-1].t - e.last_token) * 1e3)
                arrival.append((e.arrival - s.submit_t) * 1e3)  # the front end took the request this long after our submit

    def stat(xs):
        return {"median_ms": round(float(np.median(xs)), 3), "p99_ms": round(float(np.percentile(xs, 99)), 3),
                "n": len(xs)} if xs else None
    return {"ttft_vs_vllm_ttft": stat(ttft), "first_token_delivery": stat(first), "last_token_delivery": stat(last),
            "submit_to_arrival": stat(arrival)}


def stats_on_pass(model, config: dict, workload: Workload):
    """One pass on an engine with vLLM's stats on: every sequence with vLLM's own timestamps."""
    engine = VLLMEngine(model, {**config, "disable_log_stats": False})
    try:
        LLMPerf().run(engine, workload)  # warm-up
        return engine.run(workload, salt=50)
    finally:
        engine.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="shape:tiny-llama")
    ap.add_argument("--config", default="{}", help="engine options for both (JSON)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256)
    args = ap.parse_args()
    import vllm

    cpu = _is_cpu_build(vllm)
    config = json.loads(args.config)
    model = resolve_model(args.model)
    workload = Workload.offline(args.requests, prompt_len=(16, 512), output_len=(16, 256), seed=1)
    ours = VLLMEngine(model, config)
    llm = bare_llm(model, config, cpu)
    gpu = detect()
    perf = LLMPerf(gpu_index=gpu.index if gpu else None)
    bare_throughput(llm, workload, ours.vocab_size, salt=99)  # warm-up of both
    perf.run(ours, workload)
    ratios = []
    for i in range(args.pairs):
        if i % 2 == 0:
            b = bare_throughput(llm, workload, ours.vocab_size, salt=i)
            r = perf.run(ours, workload, warmup=False)
        else:
            r = perf.run(ours, workload, warmup=False)
            b = bare_throughput(llm, workload, ours.vocab_size, salt=i)
        ratios.append(r.throughput.output_tokens_per_s / b)
        print(f"pair {i}: plugin {r.throughput.output_tokens_per_s:.0f} tok/s, bare {b:.0f} tok/s, ratio {ratios[-1]:.4f}",
              flush=True)
    ours.shutdown()
    traces = [stats_on_pass(model, config, workload)]
    row = {"vllm": vllm.__version__, "device": gpu.name if gpu else "cpu", "model": args.model, "config": config,
           "requests": args.requests, "pairs": args.pairs, "median_ratio": round(statistics.median(ratios), 4),
           "min_ratio": round(min(ratios), 4), "max_ratio": round(max(ratios), 4), "fidelity": fidelity(traces)}
    emit("overhead_fidelity", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
