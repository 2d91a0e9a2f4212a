#!/usr/bin/env bash
# The gate suite with the paging module's engines side by side against one at a time, on one lent GPU
# machine (docs/gpu-validation.md): `scripts/gpu-side-by-side.sh TOTAL_S`. A fresh run side by side (the
# default on a GPU), then a warm run with --llmperf-side-by-side=off and a warm run side by side, each its
# own pytest process against the shipped baselines of the lent card's class (scripts/gpu-gate.sh require),
# while they fit in TOTAL_S. Prints each run's time to verdict, its engine starts, and each paging test's
# GPU memory against its baseline, and the pool's warning if it gave side by side up; packs the runs into
# $OUT/runs.tgz. RUNS: which runs and in what order
# (default "s1 o1 s2"; sN side by side, oN one at a time; the first is the fresh one).
set -o pipefail
total=${1:-560}
start=$(date +%s)
left() { echo $(( total - ($(date +%s) - start) )); }
runs=()
run() {  # LABEL CAP [pytest options]
  local label=$1 cap=$2 budget
  shift 2
  budget=$(left)
  [ "$budget" -ge 120 ] || { echo "$label: not run, $budget s left"; return; }
  BUDGET_S=$(( budget < cap ? budget : cap )) scripts/gpu-gate.sh require "$label" "$@"
  runs+=("$label")
}
first=1
for label in ${RUNS:-s1 o1 s2}; do
  cap=170
  [ "$first" = 1 ] && cap=300 first=0
  case $label in
    o*) run "$label" "$cap" --llmperf-side-by-side=off ;;
    *) run "$label" "$cap" ;;
  esac
done
for label in "${runs[@]}"; do
  python3 - "$OUT/$label/results.json" "$label" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(print(sys.argv[2], "no results.json"))
t = doc["session"]["time_to_verdict_s"]
print(sys.argv[2], f"wall {t['wall']:.0f} s, engine start {t['engine start']:.0f} s, engine stop {t['engine stop']:.0f} s,",
      f"warm-up {t['warm-up']:.0f} s, measurement {t['measurement']:.0f} s; starts", [s[2] for s in t["each_start"]])
for test in doc["tests"]:
    for row in test.get("baseline_rows", []):
        if row["metric"] == "gpu_memory_peak_gib" and "paging" in test["test"]:
            print("  ", test["test"].split("::")[-1], row["label"], f"GiB {row['baseline']} -> {row['current']}", row["verdict"])
PY
  # the pool gave side by side up (a start failed beside the others, or NVML did not name their processes)
  grep -h -m1 "not started side by side" "$OUT/$label.log" || true
done
(cd "$OUT" && tar czf runs.tgz "${runs[@]}" $(printf '%s.log ' "${runs[@]}") && rm -rf "${runs[@]}" $(printf '%s.log ' "${runs[@]}"))
