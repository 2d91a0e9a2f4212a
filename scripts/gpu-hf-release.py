"""Does the transformers engine hand an H200 back when it stops, even while something else still refers
to its model? (docs/gpu-validation.md, 2026-12-03 evening: an 8B shape's 17 GiB stayed on the card.)
Starts the engine on a shape, runs a small batch, keeps a stray reference to the model, stops the engine
and prints the card's used memory before the start, at the peak and after the stop."""

import sys
import time

from pytest_llmperf import Workload
from pytest_llmperf.engines.hf import HFEngine
from pytest_llmperf.gpu import memory_used
from pytest_llmperf.models import resolve_model

GIB = 1024**3
shape = sys.argv[1] if len(sys.argv) > 1 else "shape:llama-3.1-8b"
before = memory_used(0)
start = time.monotonic()
engine = HFEngine(resolve_model(shape), {})
engine.run(Workload.offline(8, prompt_len=(64, 256), output_len=(16, 32), seed=1))
loaded = memory_used(0)
stray = engine._model  # what an outside reference (a frame, a cache) would keep alive
engine.shutdown()
time.sleep(1)
after = memory_used(0)
print(f"hf {shape}: card used {before / GIB:.1f} GiB before, {loaded / GIB:.1f} GiB running, "
      f"{after / GIB:.1f} GiB after shutdown with a stray reference to the model "
      f"({sum(p.numel() for p in stray.parameters())} parameters left in it); {time.monotonic() - start:.0f} s")
sys.exit(0 if after - before < 2 * GIB else 1)
