"""Per-session state in `config.stash` (no module globals): the options, the engine pool, the GPU, and
what every test recorded. The plugin's hooks and fixtures both read it from here."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import gating, markers
from .assertions import Limit, MarkerError
from .engines.base import Engine, EnginePool, engine_class, parallel_sizes_problem
from .gpu import GpuInfo, bandwidth_of, measure_bandwidth, start_bandwidth_probe
from .models import ModelSpec, check_spec, footprint, model_config, resolve_model
from .report import TestRecord
from .runner import LLMPerf
from .timing import workers_line
from .trace import Roofline

if TYPE_CHECKING:
    from .plots import Picture


SIDE_BY_SIDE_MODES = ("auto", "on", "off")


@dataclass
class Session:
    """Per-session state, kept in `config.stash` (no module globals)."""

    engine_name: str
    model_spec: str
    engine_defaults: dict[str, Any]
    hardware: str
    gpu: GpuInfo | None  # the first of `gpus`
    gate: gating.GateConfig
    # the classes a per-hardware limit may name: the known ones, this machine's, the project's own (ini)
    hardware_classes: frozenset[str] = frozenset()
    gpus: tuple[GpuInfo, ...] = ()  # this worker's GPUs: as many as its engines spread over
    engines: dict[str, str] = field(default_factory=dict)  # registered engines (engines.registry)
    pool: EnginePool = field(default_factory=EnginePool)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    report_dir: Path | None = None
    retries: int = 2
    warmup: str = "auto"  # what llmperf.run(warmup=True) does (runner.WARMUP_MODES)
    side_by_side: str = "auto"  # --llmperf-side-by-side (SIDE_BY_SIDE_MODES)
    xdist_worker: bool = False  # this session is a pytest-xdist worker's (not a session a test of one started)
    # warmed until steady once, with the pass-to-pass noise their warm-up saw (runner.py)
    steady_engines: MutableMapping[Engine, float] = field(default_factory=weakref.WeakKeyDictionary)
    # per engine name, options the session's command line gives that engine (the openai engine's server URL)
    engine_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    server_options: dict[str, Any] = field(default_factory=dict)
    records: list[TestRecord] = field(default_factory=list)
    server: Any = None  # the vllm_server fixture's VLLMServer, once started
    server_deaths_reported: set[int] = field(default_factory=set)  # pids of servers whose death failed a test
    bandwidth: float | None = None  # bytes/s of this GPU's memory, measured beside the first engine's imports (0: not measurable)
    footprints: dict[tuple[str, str], tuple[int, int] | None] = field(default_factory=dict)  # (path, dtype)
    pictures: list[Picture] = field(default_factory=list)  # planned by judged tests, drawn at the session's end
    picture_errors: list[str] = field(default_factory=list)  # why a picture could not be drawn
    stop_error: str = ""  # why the engines did not stop cleanly at the session's end (the card not freed, ...)
    worker_times: list[dict[str, Any]] = field(default_factory=list)  # xdist controller: each worker's own_times()

    def roofline(self, engine: Engine) -> Roofline | None:
        """The engine's memory-bandwidth floor on this GPU: its weights and KV bytes per token from the
        model's config.json, the bandwidth measured once per session."""
        model = getattr(engine, "model", None)
        if self.gpu is None or not engine.holds_device or not isinstance(model, ModelSpec):
            return None
        key = (model.path, str(engine.config.get("dtype", "bfloat16")))
        if key not in self.footprints:  # config.json is read once, not at every measured pass
            config = model_config(model)
            self.footprints[key] = footprint(config, key[1]) if config else None
        sizes = self.footprints[key]
        if sizes is None:
            return None
        if self.bandwidth is None:
            with self.pool.times.timed("bandwidth probe"):  # a child process that starts CUDA: seconds
                self.bandwidth = measure_bandwidth(self.gpu.index) or 0.0
        tensor_parallel = int(engine.config.get("tensor_parallel_size") or 1)
        return Roofline(*sizes, self.bandwidth, tensor_parallel) if self.bandwidth else None

    def describe(self) -> dict[str, Any]:
        gpu = asdict(self.gpu) if self.gpu else None
        return {"engine": self.engine_name, "model": self.model_spec, "hardware": self.hardware, "gpu": gpu,
                "gpus": [asdict(g) for g in self.gpus],
                "baseline_mode": self.gate.mode, "tolerance": [self.gate.tolerance, dict(self.gate.tolerances)],
                "paging": self.gate.paging,
                "warmup": self.warmup, "engine_config": self.engine_defaults,
                "time_to_verdict_s": {**self.own_times(), **({"workers": self.worker_times} if self.worker_times else {})}}

    def own_times(self) -> dict[str, Any]:
        """This process's time to verdict: its phases, its engine starts and what each took."""
        return {**self.pool.times.summary(), "engine_starts": self.pool.starts,
                "each_start": [list(s) for s in self.pool.start_seconds]}

    def engine_starts(self) -> int:
        """Engines this session started: under pytest-xdist, in the controller, its workers'."""
        return sum(w["engine_starts"] for w in self.worker_times) if self.worker_times else self.pool.starts

    def time_line(self) -> str:
        if self.worker_times:  # xdist controller: the engines ran in the workers
            return workers_line(self.pool.times.summary()["wall"], self.worker_times)
        return self.pool.times.line(self.pool.starts)

    def model(self, spec: str | None = None) -> ModelSpec:
        """The session's model (`--llmperf-model`), or `spec` (a test's `llmperf_model`), resolved once."""
        spec = spec or self.model_spec
        if spec not in self.models:
            self.models[spec] = resolve_model(spec)
        return self.models[spec]

    def engine(self, name: str, config: dict[str, Any], model: str | None = None) -> Engine:
        if self.gpu is not None and self.bandwidth is None:
            self._probe_beside_imports(name, self.gpu)
        return self.pool.get(name, self.model(model), self._config(name, config))

    def _config(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        # CLI/ini engine options are written for the session's engine; another engine (hf beside vLLM
        # in a comparison test) would reject them
        defaults = self.engine_defaults if name == self.engine_name else {}
        return {**self.engine_settings.get(name, {}), **defaults, **config}

    def plan_side_by_side(self, groups: list[list[tuple[str, str | None, dict[str, Any]]]]) -> None:
        """The pool starts each group's engines together (selection.side_by_side_groups), with their configurations
        as the tests will ask for them. One that cannot be resolved now (a model folder without config.json, an
        engine that does not import) is left out: its test fails at setup with that error, alone."""
        planned = []
        for group in groups:
            members = []
            for name, model, options in group:
                with contextlib.suppress(ValueError, OSError):  # resolve_model's; the pool leaves out engines that do not import
                    members.append((name, self.model(model), self._config(name, options)))
            planned.append(members)
        self.pool.plan(planned)

    @property
    def starts_side_by_side(self) -> bool:
        """Whether engines may start together: asked for, or by default where a GPU is sampled; never in a
        pytest-xdist worker, which learns the tests it runs one at a time (its collection holds them all)."""
        if self.xdist_worker:
            return False
        return self.side_by_side == "on" or (self.side_by_side == "auto" and bool(self.gpus))

    def _probe_beside_imports(self, name: str, gpu: GpuInfo) -> None:
        """The GPU's bandwidth probe (a child process that starts CUDA: seconds) runs while the first
        engine's modules are imported (seconds more, in this process, on no device), and ends before
        any engine touches the card, so that neither sees the other in its memory or its timing."""
        cls = engine_class(name, self.engines)
        if not cls.holds_device:
            return
        probe = start_bandwidth_probe(gpu.index)
        try:
            with self.pool.times.timed("engine start"):
                cls.preload()
        finally:
            with self.pool.times.timed("bandwidth probe"):
                self.bandwidth = bandwidth_of(probe) or 0.0


SESSION = pytest.StashKey[Session]()
LIMITS = pytest.StashKey[list[Limit]]()
PERF = pytest.StashKey[LLMPerf]()


def hardware_class(config: pytest.Config) -> str:
    """The class this session judges the machine as (detected, or --llmperf-hardware): for a conftest
    that parametrizes by hardware, so that test ids match that class's baselines."""
    return config.stash[SESSION].hardware


def model_option(item: pytest.Item) -> str | None:
    """The model a test's engines load instead of the session's (`@pytest.mark.llmperf_model`, the test's
    own over its module's), or None."""
    mark = item.get_closest_marker(markers.MODEL)
    if mark is None:
        return None
    if len(mark.args) != 1 or mark.kwargs or not isinstance(mark.args[0], str) or not mark.args[0]:
        raise MarkerError(f"@pytest.mark.{markers.MODEL} takes one model as --llmperf-model takes it, e.g. "
                          f"@pytest.mark.{markers.MODEL}(\"shape:tiny-llama\"); got args={mark.args!r} kwargs={mark.kwargs!r}")
    try:
        check_spec(mark.args[0])
    except ValueError as e:
        raise MarkerError(f"@pytest.mark.{markers.MODEL}({mark.args[0]!r}): {e}") from None
    return mark.args[0]


def gate_option(item: pytest.Item) -> frozenset[str] | None:
    """What the test's `llmperf_gate` marker (its own over its module's) gates, or None for the default."""
    mark = item.get_closest_marker(markers.GATE)
    return gating.gated(mark.args if mark is not None else None)


def engine_options(item: pytest.Item) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for mark in reversed(list(item.iter_markers(markers.ENGINE))):  # module first, the test's own last
        if mark.args:
            raise MarkerError(f"@pytest.mark.{markers.ENGINE} takes keyword options only, got {mark.args!r}")
        options.update(mark.kwargs)
    problem = parallel_sizes_problem(options)
    if problem:
        raise MarkerError(f"@pytest.mark.{markers.ENGINE}: {problem}")
    return options
