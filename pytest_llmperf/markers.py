"""Every marker the plugin registers, in one place: the limit markers (defined with their checks in
`assertions`), `llmperf_engine`, `llmperf_model`, `llmperf_gate`, `llmperf_tolerance` and the hardware
classes. `pytest --markers` is generated from this catalogue, and "does this test use the plugin" asks it."""

from __future__ import annotations

from . import assertions
from .gpu import KNOWN_CLASSES

ENGINE = "llmperf_engine"
MODEL = "llmperf_model"
GATE = "llmperf_gate"
TOLERANCE = "llmperf_tolerance"

_OWN = {
    ENGINE: f"{ENGINE}(**options): llmperf: engine options for this test or module, passed to the engine "
            "unchanged (e.g. block_size=32, max_num_seqs=64); engines are cached per distinct option set.",
    MODEL: f"{MODEL}(model): llmperf: every engine of this test or module loads `model` (as --llmperf-model "
           "takes it, e.g. \"shape:tiny-llama\") instead of the session's; its baseline stays in the session "
           "model's folder and records the model.",
    GATE: f"{GATE}(*metrics): llmperf: what this test's baseline comparison gates, instead of the default "
          "(throughput, TTFT and TPOT medians, memory, capacity, paging): groups paging, memory, timing, capacity "
          "or metric names, e.g. llmperf_gate(\"paging\", \"memory\"); the rest is reported.",
    TOLERANCE: f"{TOLERANCE}(**metric_fractions): llmperf: relative tolerance per metric against the stored "
               "baseline, e.g. p99_ttft_ms=0.15 (also ttft_p99=0.15); paging metrics given here stop comparing exactly.",
}


def hardware_help(cls: str, detected: bool = False) -> str:
    where = "this machine's class" if detected else f"select with -m {cls}"
    return f"{cls}: llmperf: run only on {cls} hardware ({where})"


def catalogue(hardware: str) -> list[str]:
    """The `pytest --markers` lines: limits, engine options, tolerance, every known hardware class, and
    this machine's class when it is not a known one."""
    lines = [assertions.marker_help(name) for name in assertions.MARKERS]
    lines += _OWN.values()
    lines += [hardware_help(cls) for cls in KNOWN_CLASSES]
    if hardware not in KNOWN_CLASSES:
        lines.append(hardware_help(hardware, detected=True))
    return lines


def is_plugin_marker(name: str) -> bool:
    """A marker that makes a test a user of the plugin (hardware classes do not: any test may carry one)."""
    return name in assertions.MARKERS or name in _OWN
