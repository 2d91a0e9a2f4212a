"""The `--llmperf-*` options and `llmperf_*` ini keys, and the session they configure: every value is
checked when pytest starts (a usage error names the option and what to give), not when a test first
needs it after an hour of measuring."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from . import gating, soak
from .baseline import PAGING_MODES, parse_tolerance, unfailable
from .engines import registry
from .engines.base import EnginePool, default_engine, parallel_sizes_problem
from .gpu import KNOWN_CLASSES
from .models import DEFAULT_MODEL, check_spec, stored_name
from .runner import WARMUP_MODES
from .session import SIDE_BY_SIDE_MODES, Session


def add(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference performance assertions")
    # no `choices`: engines are registered (engines/registry.py), checked when the session starts
    group.addoption("--llmperf-engine", default=None,
                    help="engine behind llm_engine: hf, vllm, openai or one a package registers "
                         "(default: vllm when installed, else hf)")
    group.addoption("--llmperf-base-url", default=None,
                    help="openai engine: the server, e.g. http://127.0.0.1:8000/v1")
    group.addoption("--llmperf-served-model", default=None,
                    help="openai engine: the model name at the server (default: the first it serves)")
    group.addoption("--llmperf-api-key-env", default=None,
                    help="openai engine: environment variable holding the API key (default OPENAI_API_KEY)")
    group.addoption("--llmperf-server-config", default=None, metavar="JSON",
                    help="vllm_server fixture: options for `vllm serve` as a JSON object")
    parser.addini("llmperf_base_url", "openai engine: server URL", default="")
    parser.addini("llmperf_served_model", "openai engine: model name at the server", default="")
    parser.addini("llmperf_api_key_env", "openai engine: API key variable", default="")
    parser.addini("llmperf_server_config", "vllm_server: vllm serve options (JSON object)", default="")
    group.addoption("--llmperf-model", default=None, metavar="MODEL",
                    help=f"model folder, hub id or shape:NAME with random weights (default {DEFAULT_MODEL})")
    group.addoption("--llmperf-engine-config", default=None, metavar="JSON",
                    help="options of the --llmperf-engine engine as a JSON object, under any @pytest.mark.llmperf_engine(...)")
    group.addoption("--llmperf-hardware", default=None, metavar="CLASS",
                    help="judge this machine as hardware class CLASS (default: detected; cpu without GPU): tests that "
                         "name no class are marked with it (-m CLASS selects them), tests marked for another class "
                         "are skipped, and baselines and per-hardware limits of CLASS apply")
    group.addoption("--llmperf-baseline", default=None, choices=gating.MODES,
                    help="compare with stored baselines (default; a test without one passes, reported), require "
                         "(as compare, and a missing, stale or other engine's baseline fails the test: the "
                         "pull-request gate), update them from this run, or off")
    group.addoption("--llmperf-baseline-dir", default=None, metavar="DIR", help="baseline folder (default: <rootdir>/baselines)")
    group.addoption("--llmperf-paging", default=None, choices=PAGING_MODES,
                    help="a deterministic result whose paging timeline differs from its baseline step by step: "
                         "fails (strict, default) or is reported while only the paging summaries gate (summary)")
    parser.addini("llmperf_paging", "paging timeline against the baseline: strict or summary", default="strict")
    group.addoption("--llmperf-tolerance", default=None, metavar="TOL[,METRIC=TOL...]",
                    help="relative tolerance of timing metrics against a baseline, and per metric if given: "
                         "0.10, or 0.10,output_tokens_per_s=0.05 (default: the ini llmperf_tolerance, else 0.10; a "
                         "test's llmperf_tolerance marker wins)")
    group.addoption("--llmperf-retries", default=None, type=int, metavar="N",
                    help="measure a result that violates a limit or regresses on timing metrics against its "
                         "baseline, or a failing property-test example, this many more times before it counts; "
                         "baselines are recorded as the best of 1 + N passes (default 2)")
    parser.addini("llmperf_retries", "re-measurements of a violated limit, a timing regression or a failing "
                  "property example", default="2")
    group.addoption("--llmperf-warmup", default=None, choices=WARMUP_MODES,
                    help="what llmperf.run's warm-up does: a few requests (quick), then whole passes until two agree "
                         "on throughput (steady), or auto: steady on a GPU, quick elsewhere (default)")
    parser.addini("llmperf_warmup", "warm-up: auto, quick or steady", default="auto")
    group.addoption("--llmperf-side-by-side", default=None, choices=SIDE_BY_SIDE_MODES,
                    help="start the engines of consecutive tests that gate no timing and have a fixed KV budget "
                         "(num_gpu_blocks_override) together, and keep them side by side while each is measured "
                         "in turn: on, off, or auto: on where the session has a GPU (default)")
    parser.addini("llmperf_side_by_side", "engines of paging-only tests side by side: auto, on or off", default="auto")
    group.addoption("--llmperf-gpus-per-worker", default=None, metavar="N",
                    help="GPUs each pytest-xdist worker (or this session) takes: default, the most any collected "
                         "test's engine spreads over (tensor_parallel_size x pipeline_parallel_size)")
    parser.addini("llmperf_gpus_per_worker", "GPUs per worker (default: what the tests' engines ask for)", default="")
    group.addoption("--llmperf-soak", default=1, type=int, metavar="N",
                    help="run the selected tests N times back to back, round by round, and fail if host or GPU "
                         "memory grows beyond the limit between the last two rounds or from the second round to the last")
    group.addoption("--llmperf-soak-limit-mib", default=soak.DEFAULT_LIMIT_MIB, type=float, metavar="MIB",
                    help=f"allowed memory growth between the last two soak rounds, and from the second to the last "
                         f"(default {soak.DEFAULT_LIMIT_MIB:g})")
    group.addoption("--llmperf-report", default=None, metavar="DIR",
                    help="write results.json and summary.md there (and append the summary to $GITHUB_STEP_SUMMARY)")
    parser.addini("llmperf_report", "report folder", default="")
    parser.addini("llmperf_baseline", "baseline mode: compare, require, update or off", default="compare")
    parser.addini("llmperf_baseline_dir", "baseline folder", default="baselines")
    parser.addini("llmperf_tolerance", "relative tolerance of timing metrics, and per metric: 0.10,output_tokens_per_s=0.05",
                  default="0.10")
    parser.addini("llmperf_engine", "default engine (hf, vllm or openai)", default="")
    parser.addini("llmperf_model", "default model", default=DEFAULT_MODEL)
    parser.addini("llmperf_engine_config", "default engine options (JSON object)", default="")
    parser.addini("llmperf_hardware", "hardware class override", default="")
    parser.addini("llmperf_hardware_classes", "hardware classes of this project's own, besides the known ones "
                  f"({', '.join(KNOWN_CLASSES)}), that per-hardware limits may name", type="args", default=[])


def hardware_override(config: pytest.Config) -> str | None:
    """The class --llmperf-hardware / llmperf_hardware names, as the plugin spells classes (lower case, as
    `-m` selects them and baselines/<class>/ holds them), or None: detect it."""
    given = value(config, "hardware")
    return _class_name(given, "--llmperf-hardware/llmperf_hardware") if given else None


def _declared_classes(config: pytest.Config) -> list[str]:
    """The project's own classes (llmperf_hardware_classes), spelled as the plugin spells classes."""
    return [_class_name(c, "llmperf_hardware_classes") for c in config.getini("llmperf_hardware_classes")]


def _class_name(given: str, where: str) -> str:
    cls = given.strip().lower()
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", cls):
        raise pytest.UsageError(f"{where}={given!r}: a hardware class is a name of letters, digits, '.', '_' and '-', "
                                f"e.g. {', '.join(KNOWN_CLASSES[:3])}")
    return cls


def value(config: pytest.Config, name: str) -> Any:
    """CLI value first, ini value second."""
    given = config.getoption(f"--llmperf-{name}")
    return given if given is not None else config.getini(f"llmperf_{name.replace('-', '_')}")


def session(config: pytest.Config, hardware: str, engines: dict[str, str]) -> Session:
    """The session these options describe, every value checked."""
    model_spec = value(config, "model") or DEFAULT_MODEL
    try:
        check_spec(model_spec)
    except ValueError as e:
        raise pytest.UsageError(f"--llmperf-model/llmperf_model: {e}") from None
    mode = _choice(config, "baseline", gating.MODES, default="compare")
    root = Path(value(config, "baseline-dir") or "baselines")
    paging = _choice(config, "paging", PAGING_MODES, default="strict")
    try:
        tolerance, tolerances = parse_tolerance(value(config, "tolerance"))
    except ValueError as e:
        raise pytest.UsageError(f"--llmperf-tolerance/llmperf_tolerance: {e}") from None
    _warn_unfailable(config, unfailable(tolerance, tolerances))
    retries = _retries(config)
    gpus_per_worker(config)  # a bad value is a usage error now, not when the first test claims its GPUs
    engine_name = value(config, "engine") or default_engine()
    if engine_name not in engines:
        raise pytest.UsageError(f"llmperf_engine={engine_name!r}: choose one of {', '.join(sorted(engines))}, or install "
                                f"a package that registers it under the entry-point group {registry.GROUP!r}")
    openai = {k: v for k, v in (("base_url", value(config, "base-url")), ("model", value(config, "served-model")),
                                ("api_key_env", value(config, "api-key-env"))) if v}
    return Session(
        engine_name=engine_name,
        model_spec=model_spec,
        engine_defaults=engine_config(value(config, "engine-config")),
        hardware=hardware,
        hardware_classes=frozenset(KNOWN_CLASSES) | {hardware, *_declared_classes(config)},
        gpu=None,  # claimed once the session uses the plugin (activation.py)
        gate=gating.GateConfig(mode, root if root.is_absolute() else config.rootpath / root,
                               tolerance, hardware, stored_name(model_spec), retries, tolerances,
                               _update_args(config, model_spec), paging),
        report_dir=_report_dir(value(config, "report")),
        pool=EnginePool(engines=engines),
        engines=engines,
        retries=retries,
        warmup=_choice(config, "warmup", WARMUP_MODES),
        side_by_side=_choice(config, "side-by-side", SIDE_BY_SIDE_MODES),
        xdist_worker=hasattr(config, "workerinput"),
        engine_settings={"openai": openai} if openai else {},
        server_options=engine_config(value(config, "server-config"), "server-config"),
    )


def _warn_unfailable(config: pytest.Config, metrics: dict[str, float]) -> None:
    """A tolerance that lets a rate fall 100% or more passes any fall: said now, not only in each row."""
    if metrics:
        given = ", ".join(f"{m} {t:g}" for m, t in metrics.items())
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"llmperf: --llmperf-tolerance/llmperf_tolerance gives {given}: a rate falls at most 100%, so these "
            f"rows can never fail a test; give each one below 1 to gate it (e.g. {next(iter(metrics))}=0.65)"),
            stacklevel=2)


def engine_config(text: str, option: str = "engine-config") -> dict[str, Any]:
    """`--llmperf-engine-config` (and `--llmperf-server-config`) take a JSON object:
    '{"block_size": 32, "max_num_seqs": 64}'."""
    if not text:
        return {}
    name = f"--llmperf-{option}/llmperf_{option.replace('-', '_')}"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise pytest.UsageError(f"{name} is not JSON ({e}): write e.g. '{{\"max_num_seqs\": 64}}'") from None
    if not isinstance(parsed, dict):
        raise pytest.UsageError(f"{name} must be a JSON object of engine options, e.g. '{{\"max_num_seqs\": 64}}'")
    problem = parallel_sizes_problem(parsed)
    if problem:
        raise pytest.UsageError(f"{name}: {problem}")
    return parsed


def soak_rounds(config: pytest.Config) -> tuple[int, float]:
    """--llmperf-soak and --llmperf-soak-limit-mib, checked."""
    rounds = config.getoption("--llmperf-soak")
    if rounds < 1:
        raise pytest.UsageError(f"--llmperf-soak={rounds}: give the number of rounds, 2 or more (1 is a plain run)")
    if rounds > 1 and (getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput")):
        # each worker would judge its own memory and no worker's verdict reaches the session's exit status
        raise pytest.UsageError(f"--llmperf-soak={rounds} measures the memory of one pytest process round by round: "
                                "run it without pytest-xdist's -n (or with -n 0)")
    limit_mib = config.getoption("--llmperf-soak-limit-mib")
    if not math.isfinite(limit_mib) or limit_mib <= 0:
        raise pytest.UsageError(f"--llmperf-soak-limit-mib={limit_mib}: give the memory growth allowed between "
                                "rounds in MiB, a number above 0 (e.g. 256)")
    return rounds, limit_mib


def gpus_per_worker(config: pytest.Config) -> int | None:
    """--llmperf-gpus-per-worker, checked; None: sized from what the tests' engines ask for."""
    given = value(config, "gpus-per-worker")
    if given in (None, ""):
        return None
    if not str(given).isdigit() or int(given) < 1:
        raise pytest.UsageError(f"--llmperf-gpus-per-worker/llmperf_gpus_per_worker={given!r}: give a number of "
                                "GPUs, 1 or more (e.g. 2 for tensor_parallel_size=2)")
    return int(given)


def asked(config: pytest.Config) -> bool:
    """An --llmperf option on the command line, or llmperf settings in the project's configuration file."""
    if any(str(a).startswith("--llmperf") for a in config.invocation_params.args):
        return True
    try:
        return config.inipath is not None and "llmperf" in config.inipath.read_text()
    except OSError:
        return False


def _retries(config: pytest.Config) -> int:
    given = value(config, "retries")
    try:
        retries = int(given)
    except (TypeError, ValueError):
        retries = -1
    if retries < 0:
        raise pytest.UsageError(f"--llmperf-retries/llmperf_retries={given!r}: give the number of extra measurements, "
                                "0 or more (e.g. 2)")
    return retries


def _choice(config: pytest.Config, name: str, modes: Sequence[str], default: str | None = None) -> str:
    """An option that takes one of `modes` (CLI or ini), checked: a usage error names the value and the choices."""
    given = value(config, name)
    mode = (given or default) if default is not None else given
    if mode not in modes:
        raise pytest.UsageError(f"llmperf_{name.replace('-', '_')}={mode!r}: choose one of {', '.join(modes)}")
    return mode


def _report_dir(given: str | None) -> Path | None:
    """The report folder, checked at start: a session must not measure for an hour and then find that
    its report cannot be written."""
    if not given:
        return None
    folder = Path(given)
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise pytest.UsageError(f"--llmperf-report/llmperf_report={given!r}: {existing} is a file, not a folder; "
                                "give a folder to write results.json and summary.md into")
    if not os.access(existing, os.W_OK):
        raise pytest.UsageError(f"--llmperf-report/llmperf_report={given!r}: {existing} is not writable; give a "
                                "folder this user can write")
    return folder


def _update_args(config: pytest.Config, model_spec: str) -> str:
    """The options a command that records this session's baselines must repeat (not the defaults)."""
    given = {"model": model_spec if model_spec != DEFAULT_MODEL else None,
             "engine": value(config, "engine") or None, "hardware": hardware_override(config)}
    return " ".join(f"--llmperf-{name}={shlex.quote(v)}" for name, v in given.items() if v)
