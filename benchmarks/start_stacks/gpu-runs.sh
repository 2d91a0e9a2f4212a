#!/usr/bin/env bash
# The gate suite back to back on the lent GPU, each engine core's start sampled: `benchmarks/start_stacks/gpu-runs.sh
# PREFIX TOTAL_S` runs `scripts/gpu-gate.sh require PREFIX1`, PREFIX2, ... (the first with no compile cache
# unless one is carried: a fresh machine) while a run still fits in TOTAL_S seconds (the first is given at
# most 250 s, the next ones 150 s, and a next one starts only with 130 s left), then prints for each run its
# time-to-verdict line and where its longest engine start went (summary.py), and packs the logs, the reports
# (cut by benchmarks/keep_run.py), stack files and Triton's cache listing into $OUT/stacks.tgz (at most 8 files come back from the device).
set -o pipefail
prefix=$1 total=$2
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=$here:$PYTHONPATH
start=$(date +%s) k=0
while :; do
  left=$(( total - ($(date +%s) - start) ))
  [ "$left" -ge 130 ] || break
  k=$((k + 1)) label="$prefix$k" cap=150
  [ "$k" -gt 1 ] || cap=250
  mkdir -p "/tmp/stacks/$label"
  LLMPERF_STACKS=/tmp/stacks/$label BUDGET_S=$(( left < cap ? left : cap )) scripts/gpu-gate.sh require "$label"
done
mkdir -p "$OUT/kept"
for label in $(cd /tmp/stacks && ls); do
  echo "== $label: $(grep -h "^time to verdict" "$OUT/$label.log" | tail -1)"
  python3 "$here/summary.py" --longest "/tmp/stacks/$label" | tail -14  # where the longest engine start went
  cp -r "/tmp/stacks/$label" "$OUT/kept/stacks-$label"
  # the report cut to what a comparison and a calibration read (benchmarks/keep_run.py), the summary and the log
  [ -f "$OUT/$label/results.json" ] && python3 benchmarks/keep_run.py "$OUT/$label/results.json" "$OUT/kept/$label.json" \
    --tests perf_tests/test_latency.py perf_tests/test_paging.py
  mv "$OUT/$label.log" "$OUT/$label/summary.md" "$OUT/kept/" 2> /dev/null && mv "$OUT/kept/summary.md" "$OUT/kept/$label.md"
  rm -rf "${OUT:?}/$label"
done
# where Triton's kernels were written: the vLLM cache's folder (the plugin's TRITON_CACHE_DIR) or elsewhere
find "${VLLM_CACHE_ROOT:-/tmp/vllm-cache}" ~/.triton /tmp/torchinductor_* -maxdepth 3 -type d 2> /dev/null \
  | grep -i triton > "$OUT/kept/triton-folders.txt"
echo "compiled kernels named top-k: $(find /tmp ~ -iname "*top*k*.json" 2> /dev/null | grep -v site-packages | head -5)"
(cd "$OUT" && tar czf stacks.tgz kept && rm -rf kept)
echo "$k runs in $(( $(date +%s) - start )) s"
