#!/usr/bin/env bash
# One pytest process of the GPU gate suite on the lent H200 (docs/gpu-validation.md), as perf-gate.yml
# runs it: `scripts/gpu-gate.sh MODE LABEL [pytest options]`, MODE update or require. Writes the log,
# results.json and summary.md under $OUT/LABEL*. A vLLM compile cache carried in .vllm-cache/cache.tgz
# is unpacked first, and the cache is packed back to $OUT/cache.tgz when KEEP_CACHE=1. An update packs the
# baselines it wrote to $OUT/baselines-CLASS.tgz. pytest stops after BUDGET_S seconds (default 520: unpacking the bundle and packing the
# cache take up to a minute more, and a device run stopped at its 600 s limit returns nothing it packed).
set -o pipefail
mode=$1 label=$2
shift 2
source .gpukit/env.sh || exit 9
# The bundle carries vLLM's sources without bytecode; pip compiles it at install, so a runner's first
# import does not. Compile it once here (16 cores, in parallel) rather than inside the first engine start.
if [ ! -f "$GPUKIT_DIR/.compiled" ]; then
  t=$(date +%s)
  python3 -m compileall -q -j 0 "$GPUKIT_DIR" > /dev/null 2>&1; touch "$GPUKIT_DIR/.compiled"
  echo "bytecode of the bundle compiled in $(( $(date +%s) - t )) s"
fi
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 VLLM_CACHE_ROOT=/tmp/vllm-cache
mkdir -p "$VLLM_CACHE_ROOT"
if [ -f .vllm-cache/cache.tgz ] && [ ! -f "$VLLM_CACHE_ROOT/.unpacked" ]; then
  tar -xzf .vllm-cache/cache.tgz -C "$VLLM_CACHE_ROOT" && touch "$VLLM_CACHE_ROOT/.unpacked"
fi
start=$(date +%s)
# GATE_TESTS: the perf-gate workflow's PERF_TESTS unless given; GATE_CLASS: the runner's hardware class (its
# `-m` selection and baselines/<class>/), unless given the lent card's (a device asked for an H200 may lend an H100)
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H100*) found=h100 ;;
  *) found=h200 ;;
esac
cls=${GATE_CLASS:-$found}
echo "$label: hardware class $cls"
timeout "${BUDGET_S:-520}" python3 -m pytest -p pytest_llmperf.plugin -p no:cacheprovider ${GATE_TESTS:-perf_tests/test_latency.py perf_tests/test_paging.py} \
  -m "$cls" --llmperf-model=shape:llama-3.1-8b --llmperf-baseline="$mode" \
  --llmperf-tolerance=0.10,output_tokens_per_s=0.05 --llmperf-report="$OUT/$label" -v -rA "$@" > "$OUT/$label.log" 2>&1
rc=$?
rm -rf "$OUT/$label/plots"  # at most 8 files come back from the device: keep results.json and summary.md
echo "$label: rc=$rc wall=$(( $(date +%s) - start ))s"
grep -E "^(FAILED|ERROR)|passed|failed|^baselines:|^time to verdict" "$OUT/$label.log" | tail -15
if [ "$mode" = update ]; then
  tar -czf "$OUT/baselines-$cls.tgz" "baselines/$cls" && ls "baselines/$cls"/*/ | wc -l
fi
if [ "${KEEP_CACHE:-0}" = 1 ]; then
  tar -czf "$OUT/cache.tgz" -C "$VLLM_CACHE_ROOT" . && du -h "$OUT/cache.tgz"
fi
exit $rc
