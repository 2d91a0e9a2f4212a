"""The plugin's overhead and fidelity against bare vLLM.

Overhead: the same offline workload (token-id prompts, mixed lengths) through bare vLLM
(`LLM.generate`, no plugin) and through `llmperf.run` with every recorder on (per-step paging
recorder, NVML where there is a GPU), in interleaved rounds whose order rotates; the ratio of output
throughputs (plugin / bare), median over the pairs.

Fidelity: our client-side timestamps against vLLM's own per-request ones (`RequestOutput.metrics`, on
an engine of the same configuration with vLLM's stats on, which the plugin leaves off): our TTFT
against the TTFT vLLM reports for the request (its front end's clock), when we saw the first/last
token against when the engine core produced it, and our submit against the front end's arrival.

    python benchmarks/overhead_fidelity.py --pairs 6 --requests 256 [--config JSON] [--bare-async]
    (each pair runs every variant once, in an order rotated by one per pair: pairs a multiple of the
     variants gives each variant every position equally)
    (--bare-async adds vLLM's AsyncLLM, bare, to each pair: splits the front end's cost from the plugin's)
    (--config '{"llmperf_stream": "delta"}' measures the plugin streaming deltas to each request)
    (--ablate adds the plugin with one part taken out at a time: the offline gate, NVML sampling, the
     paging recorder (an engine of its own), the runner's heap freeze: says which part costs what)
    (--profile PY_SPY: one more round, not counted, with py-spy sampling the engine core and the front
     end during the plugin's pass and bare AsyncLLM's; raw stacks to $OUT, compared by _profile.py)
Each plugin pass is also taken apart, from the recorder's own record: its time in the engine core
(`recorder_share_of_run`), and where the pass's span went (`plugin_phases`): first submit -> the engine's
first busy step (submitting the batch, the offline gate), first -> last busy step (the engine), last step
-> the last token stamped in the front end (the front end's tail). `engines` lists what each engine
resolved its options to (KV blocks, batch limits, async scheduling, CUDA graphs): variants that differ
there are not the same engine.

Writes one JSON line to $OUT/overhead_fidelity.jsonl when OUT is set.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
from _emit import emit
from _profile import GcPauses, child_pids, new_engine_core, sampled

from pytest_llmperf import Workload, runner
from pytest_llmperf.engines.vllm import OWN_OPTIONS, VLLMEngine, _is_cpu_build
from pytest_llmperf.gpu import detect
from pytest_llmperf.models import resolve_model
from pytest_llmperf.runner import LLMPerf


def bare_args(model, config: dict, cpu: bool) -> dict:
    # stats off as in `LLM` and the plugin: `AsyncEngineArgs` alone would turn them on (about 4% on a CPU)
    args = {"model": model.path, "skip_tokenizer_init": True, "load_format": "dummy", "seed": 0,
            "max_model_len": min(model.max_position_embeddings or 4096, 4096), "disable_log_stats": True}
    if cpu:
        args.update(block_size=32, dtype="bfloat16")
    return {**args, **{k: v for k, v in config.items() if k not in OWN_OPTIONS}}  # bare vLLM refuses ours


def bare_llm(model, config: dict, cpu: bool):
    from vllm import LLM

    return LLM(**bare_args(model, config, cpu))


class BareAsync:
    """vLLM's `AsyncLLM` with the same options and no plugin part (no recorder, no token clock), driven
    with final-only outputs from its own loop thread: splits the plugin's cost from the front end's."""

    def __init__(self, model, config: dict, cpu: bool) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        args = bare_args(model, config, cpu)

        async def start():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

        self.llm = asyncio.run_coroutine_threadsafe(start(), self.loop).result()

    def throughput(self, workload: Workload, vocab: int, salt: int) -> float:
        return asyncio.run_coroutine_threadsafe(self._drive(workload, vocab, salt), self.loop).result()

    async def _drive(self, workload: Workload, vocab: int, salt: int) -> float:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        async def one(i: int) -> int:
            params = SamplingParams(max_tokens=workload.requests[i].output_len, ignore_eos=True, detokenize=False,
                                    temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY)
            prompt = TokensPrompt(prompt_token_ids=workload.token_ids(i, vocab, salt))
            n = 0
            async for out in self.llm.generate(prompt, params, request_id=f"bare-{salt}-{i}"):
                n = len(out.outputs[0].token_ids)
            return n

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(len(workload)))))
        return tokens / (time.perf_counter() - start)

    def shutdown(self) -> None:
        async def stop():
            self.llm.shutdown()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result()


class NoRecorderEngine(VLLMEngine):
    """Ablation only: the plugin's engine without the paging recorder (vLLM's own scheduler class)."""

    def _engine_args(self, config: dict):
        from vllm.engine.arg_utils import AsyncEngineArgs

        engine_args = super()._engine_args(config)
        engine_args.scheduler_cls = AsyncEngineArgs.scheduler_cls
        return engine_args

    def _read_recorder(self):
        return (), None


class CostedEngine(VLLMEngine):
    """The plugin's engine, unchanged, keeping the recorder's own time and the phases of each run: the
    recorder is the plugin's only code on the engine core's critical path."""

    last_recorder_share = float("nan")
    last_phases: dict | None = None

    def run(self, workload: Workload, salt: int = 0):
        with GcPauses() as pauses:
            trace = super().run(workload, salt)
        self.last_recorder_share = trace.extra["recorder_s"] / (trace.end_t - trace.start_t)
        self.last_phases = {**phases(trace), **pauses.summary()}
        return trace


def phases(trace) -> dict:
    """Where one pass's span went, on the recorder's step times (busy steps only)."""
    first_submit = min(s.submit_t for s in trace.sequences)
    last_token = max(s.chunks[-1].t for s in trace.sequences if s.ok)
    first_step, last_step = trace.kv[0].t, trace.kv[-1].t
    return {"to_first_step_ms": (first_step - first_submit) * 1e3, "engine_ms": (last_step - first_step) * 1e3,
            "tail_ms": (last_token - last_step) * 1e3, "steps": len(trace.kv),
            "mean_step_ms": (last_step - first_step) * 1e3 / max(len(trace.kv) - 1, 1),
            "peak_running": max(s.running for s in trace.kv), "preemptions": trace.kv[-1].preemptions}


def engine_facts(vcfg) -> dict:
    """What an engine resolved its options to, where bare and plugin engines could differ unseen."""
    sc, cc, comp = vcfg.scheduler_config, vcfg.cache_config, getattr(vcfg, "compilation_config", None)
    sizes = getattr(comp, "cudagraph_capture_sizes", None) or []
    return {"num_gpu_blocks": cc.num_gpu_blocks, "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "async_scheduling": getattr(sc, "async_scheduling", None),
            "chunked_prefill": getattr(sc, "enable_chunked_prefill", None),
            "prefix_caching": cc.enable_prefix_caching, "scheduler_cls": str(getattr(sc, "scheduler_cls", "")),
            "cudagraph_mode": str(getattr(comp, "cudagraph_mode", None)), "max_cudagraph_size": max(sizes, default=0)}


def ablations(model, config: dict, workload: Workload, ours: VLLMEngine, perf: LLMPerf) -> tuple[dict, list]:
    """Passes of the plugin with one part out, and the engines they started (to shut down)."""
    # a closed loop as wide as the batch: the same requests at once, but not offline, so not gated
    ungated = replace(workload, concurrency=len(workload), kind="closed_loop")
    no_nvml = LLMPerf()
    no_recorder = NoRecorderEngine(model, config)
    perf.run(no_recorder, workload, warmup="quick")
    passes = {
        "plugin, no gate": partial(plugin_rate, perf, ours, ungated),
        "plugin, no recorder": partial(plugin_rate, perf, no_recorder, workload),
        "plugin, heap not frozen": partial(unfrozen_rate, perf, ours, workload),
    }
    if perf.gpu_index is not None:
        passes["plugin, no NVML"] = partial(plugin_rate, no_nvml, ours, workload)
    return passes, [no_recorder]


def plugin_rate(perf: LLMPerf, engine: VLLMEngine, workload: Workload) -> float:
    return perf.run(engine, workload, warmup=False).throughput.output_tokens_per_s


def unfrozen_rate(perf: LLMPerf, engine: VLLMEngine, workload: Workload) -> float:
    """The plugin's pass without the runner's heap freeze (the garbage collector walks everything)."""
    with mock.patch.object(runner, "static_heap", contextlib.nullcontext):
        return plugin_rate(perf, engine, workload)


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


def profile_round(pyspy: str, cores: dict, ours: VLLMEngine, perf: LLMPerf, aio: BareAsync | None,
                  workload: Workload) -> None:
    """The plugin's pass and bare AsyncLLM's, each with its engine core and this (front-end) process sampled."""
    out_dir = Path(os.environ.get("OUT", "."))
    with sampled(pyspy, {"core": cores["plugin"], "front": os.getpid()}, out_dir, "plugin"):
        rate = plugin_rate(perf, ours, workload)
    line = f"profiled round: plugin {rate:.0f} tok/s"
    if aio is not None:
        with sampled(pyspy, {"core": cores["bare AsyncLLM"], "front": os.getpid()}, out_dir, "bare-async"):
            line += f", bare AsyncLLM {aio.throughput(workload, ours.vocab_size, salt=300):.0f} tok/s"
    print(line + f" (stacks in {out_dir}/prof-*.txt)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="shape:tiny-llama")
    ap.add_argument("--config", default="{}", help="engine options for both (JSON)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--bare-async", action="store_true",
                    help="also run bare AsyncLLM (what the plugin drives) to split the front end's cost from the plugin's")
    ap.add_argument("--ablate", action="store_true", help="also run the plugin with one part out at a time")
    ap.add_argument("--profile", metavar="PY_SPY", default=os.environ.get("PY_SPY"),
                    help="py-spy binary: one more round (not counted) sampled, stacks written to $OUT or .")
    args = ap.parse_args()
    import vllm

    cpu = _is_cpu_build(vllm)
    config = json.loads(args.config)
    model = resolve_model(args.model)
    workload = Workload.offline(args.requests, prompt_len=(16, 512), output_len=(16, 256), seed=1)
    before = child_pids()
    ours = CostedEngine(model, config)
    cores = {"plugin": new_engine_core(before)}
    # the same batch limits for bare vLLM: left unset, `LLM` and `AsyncLLM` fill in different ones
    config = {**config, **{k: ours.config[k] for k in ("max_num_seqs", "max_num_batched_tokens")}}
    llm = bare_llm(model, config, cpu)
    gpu = detect()
    perf = LLMPerf(gpu_index=gpu.index if gpu else None)
    before = child_pids()
    aio = BareAsync(model, config, cpu) if args.bare_async else None
    cores["bare AsyncLLM"] = new_engine_core(before)
    engines = {"plugin": engine_facts(ours._llm.vllm_config), "bare": engine_facts(llm.llm_engine.vllm_config)}
    if aio is not None:
        engines["bare AsyncLLM"] = engine_facts(aio.llm.vllm_config)
    print("engines: " + json.dumps(engines), flush=True)
    bare_throughput(llm, workload, ours.vocab_size, salt=99)  # warm-up of each
    perf.run(ours, workload, warmup="quick")
    if aio is not None:
        aio.throughput(workload, ours.vocab_size, salt=98)
    parts, extra_engines = ablations(model, config, workload, ours, perf) if args.ablate else ({}, [])
    rates: dict[str, list[float]] = {}
    recorder_shares: list[float] = []
    plugin_phases: list[dict] = []

    def plugin_pass() -> float:
        rate = plugin_rate(perf, ours, workload)
        recorder_shares.append(ours.last_recorder_share)
        plugin_phases.append(ours.last_phases)
        return rate

    for i in range(args.pairs):
        passes = {
            "bare": partial(bare_throughput, llm, workload, ours.vocab_size, salt=i),
            "plugin": plugin_pass,
            **parts,
        }
        if aio is not None:
            passes["bare AsyncLLM"] = partial(aio.throughput, workload, ours.vocab_size, salt=200 + i)
        # rotate who goes first: with three or more variants, reversing every other pair kept the
        # middle one (the plugin) in the middle every time, so a cost of running there could not be
        # told from a cost of the plugin
        names = list(passes)
        order = names[i % len(names):] + names[:i % len(names)]
        rate = {name: passes[name]() for name in order}
        for name, value in rate.items():
            rates.setdefault(name, []).append(value)
        print(f"pass {i}: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in rate.items())
              + f", ratio {rate['plugin'] / rate['bare']:.4f}", flush=True)
        print("  plugin pass: " + ", ".join(f"{k} {v:.1f}" for k, v in plugin_phases[-1].items())
              + f", recorder {recorder_shares[-1]:.2%}", flush=True)
    if args.profile:
        profile_round(args.profile, cores, ours, perf, aio, workload)
    for engine in (ours, *extra_engines):
        engine.shutdown()
    if aio is not None:
        aio.shutdown()
    traces = [stats_on_pass(model, config, workload)]

    def ratios(over: str) -> list[float]:  # plugin / `over`, round by round
        return [p / b for p, b in zip(rates["plugin"], rates[over])]

    vs_bare = ratios("bare")
    row = {"vllm": vllm.__version__, "device": gpu.name if gpu else "cpu", "model": args.model, "config": config,
           "requests": args.requests, "pairs": args.pairs, "median_ratio": round(statistics.median(vs_bare), 4),
           "min_ratio": round(min(vs_bare), 4), "max_ratio": round(max(vs_bare), 4), "fidelity": fidelity(traces),
           "engines": engines}
    if aio is not None:
        row["median_ratio_vs_bare_async"] = round(statistics.median(ratios("bare AsyncLLM")), 4)
    # median over the plugin's passes; an upper bound on its cost where the step is CPU-bound
    row["recorder_share_of_run"] = round(statistics.median(recorder_shares), 5)
    row["plugin_phases"] = {k: round(statistics.median(p[k] for p in plugin_phases), 3) for k in plugin_phases[0]}
    # each variant against bare LLM.generate of the same round, median over the rounds
    row["median_ratio_by_variant"] = {name: round(statistics.median(v / b for v, b in zip(values, rates["bare"])), 4)
                                      for name, values in rates.items() if name != "bare"}
    emit("overhead_fidelity", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
