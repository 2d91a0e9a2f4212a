"""The GPU layer: which device this is and what class of hardware (NVML through nvidia-ml-py).

Knows nothing of engines or pytest. Without NVML (a CPU machine) `detect()` returns None and the
hardware class is "cpu".
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


def device_count() -> int:
    """NVML devices on this machine (0 without NVML or a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no device: all mean "no GPU here"
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


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
    """Samples the devices of one engine (one, or all a tensor-parallel engine uses) in a background
    thread, one sample per device per tick, all with the tick's time, each figure as often as it can change:

    - memory used every `interval_s` (a peak can last milliseconds);
    - utilisation and power every `slow_interval_s`: NVML averages both over its own period (1/6 s to
      1 s), so reading them faster only repeats them;
    - the total-energy counter at the start and the end: it is cumulative, and energy per token
      needs only those two. Read every 10 ms it kept the sampler thread busy a third of an H200 run
      (py-spy, docs/performance.md); its reads take milliseconds where the others take microseconds.

    NVML calls release the GIL. Use as a context manager around one run.
    """

    def __init__(self, index: int | Sequence[int] = 0, interval_s: float = 0.01, slow_interval_s: float = 0.1) -> None:
        import threading

        import pynvml

        self._nvml = pynvml
        self._interval = interval_s
        self._slow_interval = slow_interval_s
        self._next_slow = 0.0
        self._stop = threading.Event()
        self._samples: list[GpuSample] = []
        self.error: str | None = None
        pynvml.nvmlInit()
        indices = (index,) if isinstance(index, int) else tuple(index)
        self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        self._thread = threading.Thread(target=self._loop, name="llmperf-nvml", daemon=True)

    def _read(self, ends: bool) -> list[GpuSample]:
        """One tick: a sample of each device; `ends` (the first and the last) reads everything, the
        energy counter too."""
        now = time.perf_counter()
        slow = ends or now >= self._next_slow
        if slow:
            self._next_slow = now + self._slow_interval
        return [self._read_one(i, h, now, slow, ends) for i, h in self._handles]

    def _read_one(self, index: int, h: Any, now: float, slow: bool, ends: bool) -> GpuSample:
        nv = self._nvml
        util = power = energy = None
        if slow:
            with contextlib.suppress(nv.NVMLError):
                util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            with contextlib.suppress(nv.NVMLError):
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        if ends:
            with contextlib.suppress(nv.NVMLError):
                energy = int(nv.nvmlDeviceGetTotalEnergyConsumption(h))
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        return GpuSample(now, int(mem.used), util, power, energy, int(mem.total), device=index)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._try_read():
                return
            self._stop.wait(self._interval)

    def _try_read(self, ends: bool = False) -> bool:
        """One sample; an NVML failure mid-run ends sampling (the figures so far stand, the error is
        kept for the report) instead of failing the measured run."""
        if self.error is not None:
            return False
        try:
            self._samples.extend(self._read(ends))
            return True
        except self._nvml.NVMLError as e:
            self.error = f"NVML failed during the run: {e}"
            return False

    def __enter__(self) -> NvmlSampler:
        self._try_read(ends=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._try_read(ends=True)
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    @property
    def samples(self) -> tuple[GpuSample, ...]:
        return tuple(self._samples)


class GpuError(RuntimeError):
    """The GPU is not in the state a measurement needs; the message says what to do."""


def nvml_index(uuid: str) -> int:
    """The NVML index of the card CUDA_VISIBLE_DEVICES names by its UUID (`GPU-...`)."""
    why = "a MIG instance has no card of its own to sample" if uuid.startswith("MIG-") else ""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no library, no driver, an unknown UUID: said below
        why = why or f"{type(e).__name__}: {e}"
    raise GpuError(f"CUDA_VISIBLE_DEVICES names {uuid!r}, which NVML cannot map to a card's index ({why}); the "
                   "plugin samples each card's memory through NVML by index: name the cards by index "
                   "(`nvidia-smi -L` lists them)")


def assign_devices(worker: str | None, visible: str | None, count: int, per_worker: int = 1,
                   index_of: Callable[[str], int] = nvml_index) -> tuple[str | None, tuple[int, ...]]:
    """The GPUs a pytest-xdist worker takes: (value for CUDA_VISIBLE_DEVICES, their NVML indices).

    Outside xdist nothing changes (None) and the process uses the first `per_worker` visible GPUs.
    Worker gwN takes the N-th run of `per_worker` visible GPUs (of CUDA_VISIBLE_DEVICES when the
    runner set it, else of all NVML devices): a tensor-parallel engine of 2 under `-n 2` on four
    cards gives gw0 cards 0-1 and gw1 cards 2-3. Too few GPUs is an error, never two engines sharing
    a card.
    """
    devices = [d.strip() for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(count)]
    n = int(worker.removeprefix("gw")) if worker else 0
    mine = devices[n * per_worker:(n + 1) * per_worker]
    if len(mine) < per_worker:
        who = f"pytest-xdist worker {worker}" if worker else "this session"
        workers = len(devices) // per_worker
        fix = (f"run with -n {workers} or fewer" if workers else
               f"make {per_worker} GPUs visible, or lower tensor_parallel_size x pipeline_parallel_size")
        if worker and workers and n >= int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or n + 1):
            # pytest-xdist names a worker started in place of one that crashed gwN, N past the count
            fix = ("it replaces a worker that crashed (its log above says why: often the OOM killer), and the "
                   "card it had is not handed on; the tests it runs fail, the other workers' go on")
        raise GpuError(f"{who} needs {per_worker} GPU{'s' if per_worker > 1 else ''} of its own and has "
                       f"{len(mine)}: {len(devices)} visible ({', '.join(devices) or 'none'}), {per_worker} per worker; {fix}")
    # a card named by UUID is found by it: its place in the list is not its NVML index
    indices = tuple(int(d) if d.isdigit() else index_of(d) for d in mine)
    return (",".join(mine) if worker else None), indices


def visible_count() -> int:
    """GPUs this process may use: those CUDA_VISIBLE_DEVICES names, else every NVML device."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return len([d for d in visible.split(",") if d.strip()])
    return device_count()


def assign_device(worker: str | None, visible: str | None, count: int,
                  index_of: Callable[[str], int] = nvml_index) -> tuple[str | None, int]:
    """`assign_devices` for an engine of one GPU: (CUDA_VISIBLE_DEVICES value, NVML index)."""
    if not worker and not visible and not count:
        return None, 0
    env, indices = assign_devices(worker, visible, count, index_of=index_of)
    return env, indices[0]


def memory_info(index: int) -> tuple[int, int, int]:
    """(used, free, total) bytes of the device at NVML `index`."""
    import pynvml

    pynvml.nvmlInit()
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return int(info.used), int(info.free), int(info.total)
    finally:
        pynvml.nvmlShutdown()


def memory_used(index: int) -> int:
    return memory_info(index)[0]


def memory_held_by(indices: Sequence[int], pids: frozenset[int]) -> dict[int, int]:
    """Bytes NVML charges the processes `pids` on each device of `indices` (its per-process accounting):
    engines idle beside the one measured, whose memory the card's reading holds too."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return {index: sum(int(p.usedGpuMemory or 0) for p in
                           pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))
                           if p.pid in pids)
                for index in indices}
    finally:
        pynvml.nvmlShutdown()


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def beside_checker(gpus: Sequence[GpuInfo]) -> Callable[[Sequence[frozenset[int]]], str | None] | None:
    """Why engines side by side on `gpus` cannot be measured apart, given each engine's processes (None:
    they can): the runner takes what NVML charges an idle neighbour's processes off the card's reading,
    which needs every engine to name its processes and NVML to charge them memory (in a container
    without the host's process ids it charges them nothing)."""
    if not gpus:
        return None
    indices = [g.index for g in gpus]

    def why_not(engines: Sequence[frozenset[int]]) -> str | None:
        for pids in engines:
            if not pids:
                return "an engine of the group names no process of its own"
            if not any(memory_held_by(indices, pids).values()):
                return (f"NVML charges no memory to the engine processes {sorted(pids)}: in a container without "
                        "the host's process ids it cannot, so a neighbour's memory could not be taken off the card's")
        return None

    return why_not


def wait_for_release(index: int, limit_bytes: int, timeout_s: float = 60.0) -> float:
    """Block until the device's used memory is back under `limit_bytes` (the memory seen before the
    engine started, plus slack); returns the seconds waited. Two engines on one card give false
    numbers, so a card that stays full is an error."""
    start = time.monotonic()
    while True:
        used = memory_used(index)
        if used <= limit_bytes:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise GpuError(
                f"GPU {index} still uses {used / 1024**3:.1f} GiB {timeout_s:.0f}s after the engine shut down "
                f"(expected at most {limit_bytes / 1024**3:.1f} GiB){_held_here()}: another process holds the card "
                "or the engine leaked; check nvidia-smi before measuring"
            )
        time.sleep(0.2)


def _held_here() -> str:
    """What this process's own torch allocator holds (an in-process engine that leaked), where torch is
    already imported: the plugin never imports it for this."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return ""
    gib = 1024**3
    return (f"; this process's torch holds {torch.cuda.memory_allocated() / gib:.1f} GiB allocated, "
            f"{torch.cuda.memory_reserved() / gib:.1f} GiB reserved")


_BANDWIDTH_PROBE = """
import sys, torch
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    b.copy_(a)
end.record()
torch.cuda.synchronize()
print(2 * n * 20 / (start.elapsed_time(end) / 1e3))  # each copy reads and writes n bytes
"""


def start_bandwidth_probe(index: int) -> subprocess.Popen[str] | None:
    """Device memory bandwidth from 1 GiB device-to-device copies, measured in a child process (so that
    no CUDA context stays behind in this one) that runs while the caller goes on; `bandwidth_of` ends it."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
    try:
        return subprocess.Popen([sys.executable, "-c", _BANDWIDTH_PROBE], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env)
    except OSError:
        return None


def bandwidth_of(probe: subprocess.Popen[str] | None, timeout_s: float = 120.0) -> float | None:
    """The probe's bandwidth (bytes/s) once it ended; None where it could not measure."""
    if probe is None:
        return None
    try:
        out, _ = probe.communicate(timeout=timeout_s)
        return float(out.strip().splitlines()[-1]) if probe.returncode == 0 else None
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.communicate()
        return None
    except (ValueError, IndexError):
        return None


def measure_bandwidth(index: int, timeout_s: float = 120.0) -> float | None:
    """Device memory bandwidth (bytes/s), waited for; None where it cannot be measured."""
    return bandwidth_of(start_bandwidth_probe(index), timeout_s)


# -- claiming this process's GPUs ---------------------------------------------------------------
# Memory the test process itself may keep on the card after an engine is gone (its CUDA context and
# caching allocator, when transformers ran in-process).
OWN_CONTEXT_SLACK = 2 * 1024**3


def machine_class() -> str:
    """This machine's hardware class, read from NVML without claiming anything: the first GPU this
    process sees (as CUDA_VISIBLE_DEVICES maps them), or cpu."""
    count = device_count()
    if not count:
        return "cpu"
    _, index = assign_device(None, os.environ.get("CUDA_VISIBLE_DEVICES"), count, index_of=_index_or_first)
    gpu = detect(index)
    return gpu.hardware_class if gpu else "cpu"


def _index_or_first(uuid: str) -> int:
    """For the hardware class only, read in every session, the plugin's or not: a card NVML cannot find by its
    name (a MIG slice) is classed as the first card; only a session that claims cards needs its index."""
    try:
        return nvml_index(uuid)
    except GpuError:
        return 0


def claim(per_worker: int) -> tuple[GpuInfo, ...]:
    """This worker's GPUs. Under pytest-xdist each worker takes cards of its own, set in
    CUDA_VISIBLE_DEVICES before any engine starts."""
    count = device_count()
    if not count:
        return ()
    visible, indices = assign_devices(os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("CUDA_VISIBLE_DEVICES"),
                                      count, per_worker)
    if visible is not None:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers cards as NVML does
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return tuple(g for g in map(detect, indices) if g is not None)


def release_waiter(gpus: Sequence[GpuInfo]) -> Callable[[], None] | None:
    """After an engine shuts down, wait until its cards show their memory freed (or fail clearly)."""
    if not gpus:
        return None
    limits = {g.index: memory_used(g.index) + OWN_CONTEXT_SLACK for g in gpus}

    def wait() -> None:
        for index, limit in limits.items():
            wait_for_release(index, limit)

    return wait
