"""The GPU layer: which device this is and what class of hardware (NVML through nvidia-ml-py).

Knows nothing of engines or pytest. Without NVML (a CPU machine) `detect()` returns None and the
hardware class is "cpu".
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass

from .trace import GpuSample

# ordered: the first pattern found in the lower-cased device name wins
HARDWARE_CLASSES: tuple[tuple[str, str], ...] = (
    ("gh200", r"gh200"),
    ("h200", r"h200"),
    ("h100", r"h100|h800"),
    ("b200", r"b200"),
    ("a100", r"a100|a800"),
    ("a10g", r"a10g"),
    ("l40s", r"l40s"),
    ("l4", r"\bl4\b"),
    ("mi300x", r"mi300x"),
)
KNOWN_CLASSES = tuple(c for c, _ in HARDWARE_CLASSES) + ("cpu",)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    hardware_class: str
    memory_total_gib: float
    driver: str
    cuda: str
    compute_capability: str


def classify(device_name: str | None) -> str:
    """`a100`, `h100`, ... from an NVML device name; `cpu` without one; else a slug of the name."""
    if not device_name:
        return "cpu"
    low = device_name.lower()
    for cls, pattern in HARDWARE_CLASSES:
        if re.search(pattern, low):
            return cls
    return re.sub(r"[^a-z0-9]+", "-", low.replace("nvidia", "")).strip("-") or "unknown-gpu"


def detect(index: int = 0) -> GpuInfo | None:
    """The device at `index` (after CUDA_VISIBLE_DEVICES mapping is applied by the caller), or None."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        if pynvml.nvmlDeviceGetCount() <= index:
            return None
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(h))
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
        return GpuInfo(
            index=index,
            name=name,
            hardware_class=classify(name),
            memory_total_gib=pynvml.nvmlDeviceGetMemoryInfo(h).total / 1024**3,
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda=f"{cuda // 1000}.{cuda % 1000 // 10}",
            compute_capability=f"{major}.{minor}",
        )
    finally:
        pynvml.nvmlShutdown()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSampler:
    """Samples one device in a background thread: memory used, utilisation, power, total energy.

    NVML calls take a few microseconds and release the GIL, so a 10 ms interval costs the engine
    nothing measurable (benchmarks/ measures it). Use as a context manager around one run.
    """

    def __init__(self, index: int = 0, interval_s: float = 0.01) -> None:
        import threading

        import pynvml

        self._nvml = pynvml
        self._interval = interval_s
        self._stop = threading.Event()
        self._samples: list[GpuSample] = []
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._thread = threading.Thread(target=self._loop, name="llmperf-nvml", daemon=True)

    def _read(self) -> GpuSample:
        nv, h = self._nvml, self._handle
        util = power = energy = None
        with contextlib.suppress(nv.NVMLError):
            util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        with contextlib.suppress(nv.NVMLError):
            power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        with contextlib.suppress(nv.NVMLError):
            energy = int(nv.nvmlDeviceGetTotalEnergyConsumption(h))
        return GpuSample(time.perf_counter(), int(nv.nvmlDeviceGetMemoryInfo(h).used), util, power, energy)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._samples.append(self._read())
            self._stop.wait(self._interval)

    def __enter__(self) -> NvmlSampler:
        self._samples.append(self._read())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._samples.append(self._read())
        self._nvml.nvmlShutdown()

    @property
    def samples(self) -> tuple[GpuSample, ...]:
        return tuple(self._samples)
