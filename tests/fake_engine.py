"""A FAKE engine for plugin mechanics (warm-up bookkeeping, the baseline gate's re-measurement): never
evidence that an engine adapter works; real engines are tested in test_vllm_engine.py and tests/gpu."""

import gc
import threading
import time

from pytest_llmperf import Workload
from pytest_llmperf.engines.base import Engine
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace

WORKLOAD = Workload.offline(8, prompt_len=16, output_len=10, seed=1)


class FakeWarmingEngine(Engine):
    """A FAKE engine for plugin mechanics: pass k of the whole workload takes
    `durations[k]` seconds (the last one repeats), or raises it when it is an exception; shorter workloads
    (the quick warm-up) take 0.01 s."""

    name, version = "fake", "0"
    max_model_len, vocab_size = 4096, 1000
    model = None

    def __init__(self, durations):
        self.durations = list(durations)
        self.passes: list[tuple[int, int, bool]] = []  # (requests, salt, offline)
        self.frozen: list[int] = []  # objects the collector left alone during each pass

    @property
    def config(self):
        return {}

    def run(self, workload, salt=0):
        full = [p for p in self.passes if p[0] == len(WORKLOAD)]
        self.passes.append((len(workload), salt, workload.is_offline))
        self.frozen.append(gc.get_freeze_count())
        elapsed = 0.01 if len(workload) < len(WORKLOAD) else self.durations[min(len(full), len(self.durations) - 1)]
        if isinstance(elapsed, BaseException):
            raise elapsed
        seqs = tuple(SequenceTrace(i, 0, r.prompt_len, r.output_len, 0.0, (Chunk(elapsed, r.output_len),))
                     for i, r in enumerate(workload.requests))
        return RunTrace("fake", seqs, 0.0, elapsed)

    def shutdown(self):
        pass

    @property
    def full_passes(self) -> int:
        return sum(p[0] == len(WORKLOAD) for p in self.passes)


class EventLog(list):
    """What FakeStoppingEngine instances did, in order; one repr, so that engine configurations holding
    it keep one pool key however long it grows."""

    def __repr__(self):
        return "EventLog"


class Outcomes(list):
    """What each start of a FakeBesideEngine does (`start_errors`), consumed as it starts; one repr, so that
    the configuration holding it keeps one pool key."""

    def __repr__(self):
        return "Outcomes"


class Together(threading.Barrier):
    """A barrier passed once, by `parties` threads at once; later waits return at once. Its repr does not
    change while threads wait at it, so engine configurations holding it keep one pool key (Barrier's own
    repr counts its waiters)."""

    passed = False

    def wait(self, timeout=None):
        if not self.passed:
            super().wait(timeout)
            self.passed = True

    def __repr__(self):
        return f"Together({self.parties})"


class FakeStoppingEngine(Engine):
    """A FAKE engine for plugin mechanics (the engine pool's starts and stops): it logs its start and its
    stop to `config["log"]`. Its stop first waits up to `config["wait_s"]` for a later engine's start to
    begin (so a test sees whether the two overlapped), and raises `config["stop_error"]` if given."""

    name, version = "fake", "0"
    max_model_len, vocab_size = 4096, 1000
    model = None

    def __init__(self, model, config):
        self._config = config
        self.log = config["log"]
        self.log.append(f"start {config['id']}")
        self._started_at = len(self.log)

    @property
    def config(self):
        return {"id": self._config["id"]}

    def run(self, workload, salt=0):
        raise NotImplementedError("never measured: a pool test only starts and stops it")

    def shutdown(self):
        deadline = time.monotonic() + self._config.get("wait_s", 0.0)
        while not (overlapped := any(e.startswith("start") for e in self.log[self._started_at:])):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        self.log.append(f"stop {self._config['id']}" + (" (beside a start)" if overlapped else ""))
        if self._config.get("stop_error"):
            raise self._config["stop_error"]


class FakeProbedEngine(Engine):
    """A FAKE engine for plugin mechanics (the GPU's bandwidth probe beside the first engine's imports):
    it logs, at its preload and at its start, which of the probe processes in `probes` still run."""

    name, version = "fake", "0"
    max_model_len, vocab_size = 4096, 1000
    model = None
    probes: list = []
    log: list = []

    @classmethod
    def preload(cls):
        cls.log.append(("preload", [p.poll() is None for p in cls.probes]))

    def __init__(self, model, config):
        self._config = config
        self.log.append(("start", [p.poll() is None for p in self.probes]))

    @property
    def config(self):
        return dict(self._config)

    def run(self, workload, salt=0):
        raise NotImplementedError("never measured: a probe test only starts it")

    def shutdown(self):
        pass


class FakeBesideEngine(FakeStoppingEngine):
    """A FAKE engine for plugin mechanics (engines started side by side): its start takes
    `config["start_s"]` and logs when it began and ended, waits at `config["together"]` (a Together barrier: it
    passes only if every member's start runs at once), raises `config["start_error"]` if given (or at each
    start the next of `config["start_errors"]`, an Outcomes list, None for a start that succeeds), and it
    names `config["pid"]` as the process holding its device memory."""

    @classmethod
    def starts_beside(cls):
        return True

    def __init__(self, model, config):
        config["log"].append(f"begin {config['id']}")
        time.sleep(config.get("start_s", 0.0))
        if config.get("together"):
            config["together"].wait(timeout=10)
        error = config["start_errors"].pop(0) if config.get("start_errors") else config.get("start_error")
        if error:
            raise error
        super().__init__(model, config)
        self.alive = True

    def device_pids(self):
        return frozenset({self._config["pid"]})

    def shutdown(self):
        self.alive = False
        self.log.append(f"stop {self._config['id']}")


class FakeScriptedEngine(Engine):
    """A FAKE engine for plugin mechanics: each pass of a workload of more than 4 requests behaves as `script`
    says for its load (the workload's seed) and call: "ok" (TTFT 10 ms), "slow" (1 s, flat) or "saturated" (TTFT
    rising with arrival, as an engine that cannot keep up); shorter workloads (warm-ups) are "ok"."""

    name, version = "fake", "0"
    max_model_len, vocab_size = 4096, 1000
    model = None

    def __init__(self, script):
        self.script, self.calls = script, {}

    @property
    def config(self):
        return {}

    def run(self, workload, salt=0):
        kind = "ok"
        if len(workload) > 4:
            k = self.calls[workload.seed] = self.calls.get(workload.seed, -1) + 1
            kinds = self.script[workload.seed]
            kind = kinds[min(k, len(kinds) - 1)]
        seqs = []
        for i, r in enumerate(workload.requests):
            ttft = {"ok": 0.01, "slow": 1.0, "saturated": 0.01 + 0.2 * i}[kind]
            seqs.append(SequenceTrace(i, 0, r.prompt_len, r.output_len, r.arrival_s,
                                      (Chunk(r.arrival_s + ttft, 1), Chunk(r.arrival_s + ttft + 0.01 * r.output_len,
                                                                             r.output_len - 1))))
        return RunTrace("fake", tuple(seqs), 0.0, max(s.chunks[-1].t for s in seqs))

    def shutdown(self):
        pass
