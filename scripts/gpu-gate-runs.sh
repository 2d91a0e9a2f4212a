#!/usr/bin/env bash
# Unchanged gate runs back to back on the lent H200, as many as fit: `scripts/gpu-gate-runs.sh PREFIX
# TOTAL_S [pytest options]` runs `scripts/gpu-gate.sh require PREFIX1`, PREFIX2, ... while a whole run
# still fits in TOTAL_S seconds (a run is given at most 250 s, and a next one starts only with 150 s left:
# a warm run takes about 140 s), cuts each results.json to what a comparison reads
# (benchmarks/keep_run.py) and packs those, the logs' last lines and the time-to-verdict lines into
# $OUT/runs.tgz (at most 8 files come back from the device). KEEP_TESTS: the test files whose results are kept
# (keep_run.py's --tests; its default, the latency module, unless given). FIRST_RUN_S: the first run's
# limit instead of 250 s (a fresh machine with no compile cache carried takes up to 400 s); KEEP_CACHE=1
# packs the vLLM compile cache after the first run only (scripts/gpu-gate.sh), for the next calls to carry.
set -o pipefail
prefix=$1 total=$2
shift 2
start=$(date +%s) k=0 labels=()
mkdir -p "$OUT/kept"
while :; do
  left=$(( total - ($(date +%s) - start) ))
  [ "$left" -ge 150 ] || break
  k=$((k + 1)) label="$prefix$k"
  labels+=("$label" "$label.log")
  cap=250 keep=0
  [ "$k" -gt 1 ] || { cap=${FIRST_RUN_S:-250}; keep=${KEEP_CACHE:-0}; }
  BUDGET_S=$(( left < cap ? left : cap )) KEEP_CACHE=$keep scripts/gpu-gate.sh require "$label" "$@"
  if [ -f "$OUT/$label/results.json" ]; then
    python3 benchmarks/keep_run.py "$OUT/$label/results.json" "$OUT/kept/$label.json" ${KEEP_TESTS:+--tests $KEEP_TESTS}
    python3 -c "import json,sys; print(sys.argv[2], json.load(open(sys.argv[1]))['session']['time_to_verdict_s'])" \
      "$OUT/$label/results.json" "$label" >> "$OUT/kept/time_to_verdict.txt"
  fi
  tail -40 "$OUT/$label.log" > "$OUT/kept/$label.tail.log"
  mkdir -p "$OUT/$label"  # a run stopped by its budget wrote no report folder: tar must still find it
done
(cd "$OUT" && tar czf runs.tgz kept "${labels[@]}" && rm -rf kept "${labels[@]}")
echo "$k runs in $(( $(date +%s) - start )) s"
