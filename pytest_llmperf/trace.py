"""The run trace: the one raw record every engine adapter returns.

Everything downstream (metrics, assertions, baselines, reports) reads only these values, so a new
engine is one adapter that fills them. Times are `time.perf_counter()` seconds in the test process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of output: when it arrived and how many tokens it carried (a vLLM delta
    can carry several when the consumer lags, with `stream_interval`, or with speculative decoding)."""

    t: float
    n_tokens: int


@dataclass(frozen=True)
class EngineTimes:
    """The engine's own record of one request (vLLM's `RequestOutput.metrics` with its stats on), on
    our clock: when its front end received the request, when its core produced the first and the last
    token, and the TTFT vLLM itself reports (its front end's first-token time minus arrival)."""

    arrival: float
    first_token: float
    last_token: float
    ttft_s: float | None = None


@dataclass(frozen=True)
class ServerTimes:
    """The engine's own timing of one request, in ms, as `vllm serve --enable-per-request-metrics` puts it
    in the stream's last chunk (and as vLLM's in-process stats give it): waiting in the queue until
    scheduled, scheduled to first token, first to last token. Beside the client's TTFT it splits what
    the request spent in the server from what it spent getting there."""

    queue_ms: float | None
    ttft_ms: float | None
    generation_ms: float | None


@dataclass(frozen=True)
class SequenceTrace:
    """One generated sequence: request `index` of the workload, sample `sample` of its `n`."""

    index: int
    sample: int
    prompt_len: int
    output_len: int  # what the workload asked for
    submit_t: float
    chunks: tuple[Chunk, ...]
    error: str | None = None
    engine_times: EngineTimes | None = None  # where the engine records them (vLLM >= 0.11.1 with stats on)
    # prompt tokens the engine found in its prefix cache (vLLM's num_cached_tokens); None where not told
    cached_tokens: int | None = None
    server_times: ServerTimes | None = None  # the engine's own timing, where it reports it
    # the engine streamed reasoning apart from the answer, before it (an OpenAI-compatible server with a
    # reasoning parser), and when the answer's first token then arrived (None: the output was all reasoning)
    reasoning: bool = False
    answer_t: float | None = None

    @property
    def output_tokens(self) -> int:
        return sum(c.n_tokens for c in self.chunks)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunks)


@dataclass(frozen=True)
class KVSample:
    """KV-cache state at one engine step.

    `blocks_used` are physical blocks (a block shared by several requests counts once);
    `tokens_stored` are the tokens those blocks hold, shared ones counted once; `block_size` is in
    tokens. For a contiguous cache (hf) a "block" is one token slot and block_size is 1.
    `preemptions`, `prefix_queries` and `prefix_hits` are cumulative since the run started.
    `admitted` and `preempted` name requests by workload index where the engine can tell (vLLM).
    """

    t: float
    blocks_used: int
    blocks_total: int
    block_size: int
    tokens_stored: int
    running: int
    waiting: int
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    # requests (workload indices) this step admitted to the running batch, and preempted from it
    admitted: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def slots(self) -> int:
        return self.blocks_used * self.block_size

    @property
    def fragmentation(self) -> float:
        return 1.0 - self.tokens_stored / self.slots if self.slots else 0.0

    @property
    def usage(self) -> float:
        return self.blocks_used / self.blocks_total if self.blocks_total else 0.0


@dataclass(frozen=True)
class GpuSample:
    t: float
    memory_used_bytes: int
    utilization_pct: float | None = None
    power_w: float | None = None
    energy_mj: int | None = None  # NVML total-energy counter, millijoules since driver load
    memory_total_bytes: int | None = None
    device: int = 0  # NVML index: an engine of several GPUs has a sample of each per tick, at one time


@dataclass(frozen=True)
class Roofline:
    """The memory-bandwidth floor of a decode step: every step reads all the weights and the KV cache
    it holds, at the bandwidth measured on one device, split over `tensor_parallel` devices that read
    their shares at once (pipeline stages run one after another, so they do not divide it)."""

    weight_bytes: int
    kv_bytes_per_token: int
    bandwidth_bytes_per_s: float
    tensor_parallel: int = 1


@dataclass(frozen=True)
class RunTrace:
    """Everything one pass of a workload through an engine produced."""

    engine: str
    sequences: tuple[SequenceTrace, ...]
    start_t: float
    end_t: float
    kv: tuple[KVSample, ...] = ()
    gpu: tuple[GpuSample, ...] = ()
    # what the engine can tell: the names of KV metrics it measures (see metrics.KV_FIELDS)
    kv_measures: frozenset[str] = field(default_factory=frozenset)
    framework_peak_bytes: int | None = None
    roofline: Roofline | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # why a KV measure the engine has was not measured in this pass (measure -> reason): said where a
    # limit on it cannot be checked
    unmeasured: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> tuple[SequenceTrace, ...]:
        return tuple(s for s in self.sequences if not s.ok)
