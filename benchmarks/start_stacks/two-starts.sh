#!/usr/bin/env bash
# The Triton-cache check in the least device time: a fresh engine start of the gate's 8B shape (it compiles),
# then a second in a new process that finds the first's vLLM compile cache (the first warm start after a
# compile), each engine core's start sampled (sitecustomize.py). `benchmarks/start_stacks/two-starts.sh` on the
# lent GPU, `.gpukit` carried; MODEL=shape:... for another model. Prints each start's and stop's seconds, where
# the second start went (summary.py: its samples by phase, vLLM's `warmup_kernels` among them), and the
# folders Triton wrote.
set -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
source .gpukit/env.sh || exit 9
python3 -m compileall -q -j 0 "$GPUKIT_DIR" > /dev/null 2>&1  # as scripts/gpu-gate.sh: no bytecode compile in a start
export PYTHONPATH=$here:$PWD:$PYTHONPATH VLLM_CACHE_ROOT=/tmp/vllm-cache PYTHONUNBUFFERED=1
for k in 1 2; do
  mkdir -p "/tmp/stacks/start$k"
  LLMPERF_STACKS=/tmp/stacks/start$k python3 - "${MODEL:-shape:llama-3.1-8b}" > "/tmp/start$k.log" 2>&1 <<'PY'
import sys, time
from pytest_llmperf.engines.vllm import VLLMEngine
from pytest_llmperf.models import resolve_model
t0 = time.monotonic()
engine = VLLMEngine(resolve_model(sys.argv[1]), {})
t1 = time.monotonic()
engine.shutdown()
print(f"RESULT start {t1 - t0:.1f} s, stop {time.monotonic() - t1:.1f} s")
PY
  echo "start $k: $(grep RESULT "/tmp/start$k.log" || tail -5 "/tmp/start$k.log")"
done
python3 "$here/summary.py" --longest /tmp/stacks/start2 | tail -14
echo "Triton folders:"; find "$VLLM_CACHE_ROOT" ~/.triton -maxdepth 3 -type d 2> /dev/null | grep -i triton | head
find "$VLLM_CACHE_ROOT" ~/.triton -path "*triton*" -iname "*top*.json" 2> /dev/null | sed "s|^|  kernel: |"
for k in 1 2; do echo "start $k, vLLM's own timings:"; grep -E "took|graph capturing finished" "/tmp/start$k.log" | sed 's/^.*\] /  /' | tail -6; done
