"""Hugging Face transformers, static batching through `generate` (checked on transformers 5.19).

Requests that have arrived are batched (up to `max_batch_size` sequences), left-padded to the longest
prompt and decoded together until the longest output is done; requests arriving meanwhile wait for the
next batch, as they would in a static-batching server. Every decode step is timestamped by a
`BaseStreamer`, and the KV cache the batch holds is read from the `DynamicCache` itself at each step:
every row reserves the same length (padding included), and rows that finished early keep theirs until
the batch ends. That waste is what `kv.fragmentation` reports for a contiguous cache.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import time
from collections.abc import Sequence
from typing import Any

from ..models import ModelSpec
from ..trace import Chunk, KVSample, RunTrace, SequenceTrace
from ..workload import Workload, whole_number
from .base import Engine, EngineError, EngineOptionError, need

DEFAULTS: dict[str, Any] = {"max_batch_size": 8, "device": None, "dtype": None, "attn_implementation": "sdpa",
                            "max_model_len": None}


class _StepClock:
    """A transformers streamer that records when each decode step's tokens exist, and the cache size then."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.steps: list[tuple[float, int]] = []  # (time, cached positions per row)
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        self.steps.append((time.perf_counter(), int(self.cache.get_seq_length())))

    def end(self) -> None:
        pass


class HFEngine(Engine):
    name = "hf"

    @classmethod
    def preload(cls) -> None:
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401 - importing torch initialises no device
            import transformers  # noqa: F401

    def __init__(self, model: ModelSpec, config: dict[str, Any]) -> None:
        unknown = set(config) - set(DEFAULTS)
        if unknown:
            raise EngineOptionError(f"hf engine does not take {sorted(unknown)}; it takes {sorted(DEFAULTS)}")
        torch, transformers = need("torch", "hf"), need("transformers", "hf")

        self._torch = torch
        cfg = {**DEFAULTS, **config}
        if not whole_number(cfg["max_batch_size"]) or cfg["max_batch_size"] < 1:
            raise EngineOptionError(f"max_batch_size={cfg['max_batch_size']!r}: give a whole number of sequences, "
                                    "1 or more")
        cfg["max_batch_size"] = int(cfg["max_batch_size"])
        cfg["device"] = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
        cfg["dtype"] = cfg["dtype"] or ("bfloat16" if cfg["device"].startswith("cuda") else "float32")
        self.model = model
        self.version = transformers.__version__
        self._cfg = cfg
        try:
            self._model = self._load(transformers, torch, model, cfg)
        except (OSError, ValueError) as e:
            raise EngineError(f"transformers could not load {model.name!r}: {e}") from e
        self.alive = True  # from here on, shutdown() frees the weights
        hf_config = self._model.config
        self.vocab_size = int(hf_config.vocab_size)
        positions = getattr(hf_config, "max_position_embeddings", None)
        self.max_model_len = int(cfg["max_model_len"] or positions or 2048)
        if positions and self.max_model_len > positions:  # learned positions index past their table and crash
            self.shutdown()
            raise EngineOptionError(f"max_model_len={self.max_model_len} is more than {model.name!r} has positions "
                                    f"for ({positions}, max_position_embeddings): give at most {positions}")
        self._cfg["max_model_len"] = self.max_model_len

    @staticmethod
    def _load(transformers: Any, torch: Any, model: ModelSpec, cfg: dict[str, Any]) -> Any:
        dtype = getattr(torch, cfg["dtype"])
        kwargs = {"dtype": dtype, "attn_implementation": cfg["attn_implementation"]}
        if model.is_shape:
            torch.manual_seed(0)
            hf_config = transformers.AutoConfig.from_pretrained(model.path)
            # random weights made where they run: on a GPU an 8B shape initialised on the CPU first took
            # minutes of a GPU job to start
            with torch.device(cfg["device"]):
                net = transformers.AutoModelForCausalLM.from_config(hf_config, **kwargs)
        else:
            net = transformers.AutoModelForCausalLM.from_pretrained(model.path, **kwargs)
        return net.to(cfg["device"]).eval()

    fixed_kv_budget = True  # the contiguous cache is sized by the batch, never by free memory

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._cfg, batching="static")

    # -- running ----------------------------------------------------------------------------
    def run(self, workload: Workload, salt: int = 0) -> RunTrace:
        if not self.alive:
            raise EngineError("this hf engine was shut down (the session's pool closes an engine when a test asks "
                              "for another configuration): ask hf_engine or hf_engine_factory for it in the test "
                              "that runs it")
        self.check_fits(workload)
        torch, cuda = self._torch, self._cuda_device()
        if cuda is not None:
            torch.cuda.reset_peak_memory_stats(cuda)
        # the prompts' token ids made before the clock starts, as the vLLM adapter does: the client's work,
        # not the engine's (tens of ms for a batch of long prompts)
        ids = [workload.token_ids(i, self.vocab_size, salt) for i in range(len(workload.requests))]
        start = time.perf_counter()
        sequences: list[SequenceTrace] = []
        kv: list[KVSample] = []
        for batch, submits in self._batches(workload, start, sequences):
            seqs, samples = self._generate(workload, batch, submits, ids)
            sequences.extend(seqs)
            kv.extend(samples)
        end = time.perf_counter()
        peak = torch.cuda.max_memory_allocated(cuda) if cuda is not None else None
        sequences.sort(key=lambda s: (s.index, s.sample))
        return RunTrace("hf", tuple(sequences), start, end, tuple(kv),
                        kv_measures=frozenset({"fragmentation", "preemptions"}), framework_peak_bytes=peak)

    def _batches(self, workload: Workload, start: float, done: list[SequenceTrace]):
        """Yield (request indexes, submit times) batch by batch, honouring arrivals, the closed loop or
        a session's previous answer (a later turn is due `think_s` after it)."""
        max_rows, max_len = self._cfg["max_batch_size"], self.max_model_len
        pending = list(range(len(workload.requests)))
        users = [start] * workload.concurrency if workload.concurrency else None
        answered: dict[int, float] = {}
        while pending:
            now = time.perf_counter()
            batch: list[int] = []
            submits: list[float] = []
            rows = longest_prompt = longest_output = 0
            for i in list(pending):
                req = workload.requests[i]
                if users is not None:
                    if not users or users[0] > now:
                        break
                    submit = heapq.heappop(users)
                else:
                    due = _due(workload, i, start, answered)
                    if due is None or due > now:
                        continue
                    submit = due
                # every row of a static batch runs to the longest prompt plus the longest output
                prompt, output = max(longest_prompt, req.prompt_len), max(longest_output, req.output_len)
                if batch and (rows + req.n > max_rows or prompt + output > max_len):
                    if users is not None:
                        heapq.heappush(users, submit)
                    break
                batch.append(i)
                submits.append(submit)
                rows += req.n
                longest_prompt, longest_output = prompt, output
                pending.remove(i)
            if not batch:
                dues = [d for i in pending if (d := _due(workload, i, start, answered)) is not None]
                next_t = users[0] if users is not None else min(dues)
                time.sleep(max(0.0, next_t - time.perf_counter()))
                continue
            n_before = len(done)
            yield batch, submits
            for s in done[n_before:]:
                if s.sample == 0:
                    end = s.chunks[-1].t if s.chunks else time.perf_counter()
                    answered[s.index] = end
                    if users is not None:  # each finished request frees its user, who sends the next one
                        heapq.heappush(users, end)

    def _generate(self, workload: Workload, batch: Sequence[int], submits: Sequence[float],
                  token_ids: Sequence[list[int]]):
        torch = self._torch
        rows: list[tuple[int, int, list[int]]] = []  # (request index, sample, token ids)
        for i in batch:
            rows.extend((i, s, token_ids[i]) for s in range(workload.requests[i].n))
        width = max(len(ids) for _, _, ids in rows)
        pad = 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (_, _, ids) in enumerate(rows):  # left padding, as decoder-only generation needs
            input_ids[r, width - len(ids):] = torch.tensor(ids)
            mask[r, width - len(ids):] = 1
        outs = [workload.requests[i].output_len for i, _, _ in rows]
        max_new = max(outs)
        import transformers

        cache = transformers.DynamicCache()
        clock = _StepClock(cache)
        device = self._cfg["device"]
        submit_of = dict(zip(batch, submits))
        try:
            with torch.inference_mode():
                self._model.generate(
                    input_ids=input_ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                    min_new_tokens=max_new, do_sample=False, past_key_values=cache, streamer=clock,
                    pad_token_id=pad, eos_token_id=None,
                )
        except torch.OutOfMemoryError as e:
            oom = str(e).splitlines()[0][:160]
        else:
            oom = None
        if oom is not None:
            # outside the except block, so that the traceback no longer holds generate's tensors: the
            # memory goes back, the batch's requests fail with the reason, the next batch still runs
            del cache, clock
            gc.collect()
            torch.cuda.empty_cache()
            error = (f"out of GPU memory in a static batch of {len(rows)} rows x {width} prompt tokens: lower "
                     f"max_batch_size or the prompt lengths ({oom})")
            return [SequenceTrace(i, s, len(ids), out, submit_of[i], (), error)
                    for (i, s, ids), out in zip(rows, outs)], []
        if len(clock.steps) < max_new:
            raise EngineError(f"transformers produced {len(clock.steps)} decode steps, {max_new} were asked for")
        seqs = [
            SequenceTrace(i, s, len(ids), out, submit_of[i],
                          tuple(Chunk(t, 1) for t, _ in clock.steps[:out]))
            for (i, s, ids), out in zip(rows, outs)
        ]
        prompt_lens = [len(ids) for _, _, ids in rows]
        return seqs, [self._kv_sample(t, cached, k, prompt_lens, outs) for k, (t, cached) in enumerate(clock.steps, 1)]

    def _kv_sample(self, t: float, cached: int, k: int, prompts: Sequence[int], outs: Sequence[int]) -> KVSample:
        """At decode step k every row holds `cached` positions; a live row needs its prompt plus the
        k - 1 tokens generated before this step, a finished row needs nothing."""
        needed = sum(p + k - 1 for p, o in zip(prompts, outs) if k <= o)
        reserved = cached * len(prompts)
        live = sum(1 for o in outs if k <= o)
        capacity = self._cfg["max_batch_size"] * self.max_model_len
        return KVSample(t, reserved, capacity, 1, min(needed, reserved), live, 0)

    def shutdown(self) -> None:
        if not getattr(self, "alive", False):
            return
        self.alive = False
        model, self._model = self._model, None
        if model is not None:
            # Free the weights' storage itself, not only this reference: on an H200 the 8B shape's 17 GiB
            # stayed on the card after `_model = None` (something else still referred to the module), and
            # the next engine's start waited for it in vain (docs/gpu-validation.md, 2026-12-03 evening)
            for tensor in itertools.chain(model.parameters(), model.buffers()):
                tensor.data = self._torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            del model
        gc.collect()
        if (cuda := self._cuda_device()) is not None:  # a CPU engine starts no CUDA context in the test process
            self._torch.cuda.synchronize(cuda)
            self._torch.cuda.empty_cache()

    def _cuda_device(self) -> str | None:
        device = str(self._cfg["device"])
        return device if device.startswith("cuda") else None


def _due(workload: Workload, index: int, start: float, answered: dict[int, float]) -> float | None:
    """When request `index` may be sent: its arrival time, or `think_s` after its session's previous
    answer; None while that answer has not come."""
    request = workload.requests[index]
    before = workload.previous_turn(index)
    if before is None:
        return start + request.arrival_s
    return answered[before] + request.think_s if before in answered else None
