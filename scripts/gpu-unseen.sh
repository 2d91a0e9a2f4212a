#!/usr/bin/env bash
# The tests no one here had seen (benchmarks/unseen_suite) in the gate's own flow on the lent GPU, as
# benchmarks/unseen_gate.py runs them on the CPU: `scripts/gpu-unseen.sh LABEL TOTAL_S [pytest options]`
# records their baselines with `update` in one pytest process (LABEL0, into /tmp: none ship), then runs
# `require` in fresh processes (LABEL1, LABEL2, ...) while one still fits in TOTAL_S seconds
# (scripts/gpu-gate-runs.sh). The pytest options go to the compares only: a change the gate must flag
# (a slowed engine, other scheduler limits) is given there, never recorded. REUSE_BASE=1 keeps the
# baselines an earlier call recorded on this warm machine. Brings back the recording's log and
# results.json, the baselines ($OUT/unseen-base.tgz) and the compares' kept results ($OUT/runs.tgz).
set -o pipefail
label=$1 total=$2
shift 2
start=$(date +%s)
export GATE_TESTS=benchmarks/unseen_suite KEEP_TESTS=benchmarks/unseen_suite/test_unseen.py
nvidia-smi -L
if [ "${REUSE_BASE:-0}" = 1 ] && [ -d /tmp/unseen-base ]; then
  echo "the baselines recorded earlier on this machine: $(find /tmp/unseen-base -name '*.json' | wc -l) files"
else
  rm -rf /tmp/unseen-base  # a warm machine keeps /tmp: no baseline of an earlier call may mix in
  BUDGET_S=$(( total < 400 ? total : 400 )) scripts/gpu-gate.sh update "${label}0" --llmperf-baseline-dir=/tmp/unseen-base
  rc=$?
  if [ "$rc" -gt 1 ] || [ ! -f "$OUT/${label}0/results.json" ]; then
    echo "the recording did not finish (rc=$rc): no compare runs"; exit 1  # rc 1: a test failed, its baselines are still written
  fi
  tar czf "$OUT/unseen-base.tgz" -C /tmp unseen-base
  rm -f "$OUT/${label}0/summary.md" "$OUT"/baselines-*.tgz  # the shipped baselines, unchanged: not needed back
  grep -h "^time to verdict" "$OUT/${label}0.log"
fi
scripts/gpu-gate-runs.sh "$label" $(( total - ($(date +%s) - start) )) --llmperf-baseline-dir=/tmp/unseen-base "$@"
cat "$OUT/kept/time_to_verdict.txt" 2>/dev/null || tar xzOf "$OUT/runs.tgz" kept/time_to_verdict.txt 2>/dev/null
