#!/usr/bin/env bash
# The tests no one here had seen (benchmarks/unseen_suite) in the gate's own flow on the lent GPU, as
# benchmarks/unseen_gate.py runs them on the CPU: `scripts/gpu-unseen.sh LABEL TOTAL_S [pytest options]`
# records their baselines with `update` in one pytest process (LABEL0, into /tmp: none ship), then runs
# `require` in fresh processes (LABEL1, LABEL2, ...) while one still fits in TOTAL_S seconds
# (scripts/gpu-gate-runs.sh). The pytest options go to the compares only: a change the gate must flag
# (a slowed engine, other scheduler limits) is given there, never recorded. REUSE_BASE=1 keeps the
# baselines an earlier call recorded whole on this warm machine. RECORD_S: the recording's limit (default 400 s, enough
# with a compile cache carried; a fresh H100 without one needed more than 460 s); KEEP_CACHE=1 packs the compile
# cache after it (scripts/gpu-gate.sh). Brings back the recording's log and
# results.json, the baselines ($OUT/unseen-base.tgz) and the compares' kept results ($OUT/runs.tgz).
set -o pipefail
label=$1 total=$2
shift 2
start=$(date +%s)
export GATE_TESTS=benchmarks/unseen_suite KEEP_TESTS=benchmarks/unseen_suite/test_unseen.py
nvidia-smi -L
if [ "${REUSE_BASE:-0}" = 1 ] && [ -f /tmp/unseen-base/.complete ]; then
  echo "the baselines recorded earlier on this machine: $(find /tmp/unseen-base -name '*.json' | wc -l) files"
else
  rm -rf /tmp/unseen-base  # a warm machine keeps /tmp: no baseline of an earlier call may mix in
  cap=${RECORD_S:-400}
  BUDGET_S=$(( total < cap ? total : cap )) scripts/gpu-gate.sh update "${label}0" --llmperf-baseline-dir=/tmp/unseen-base
  rc=$?
  # what was recorded comes back even from a stopped recording (an update writes a file only when whole)
  [ -d /tmp/unseen-base ] && tar czf "$OUT/unseen-base.tgz" -C /tmp unseen-base
  # pytest's last line ("== 9 passed in 518.35s ==") comes after every baseline was written: a limit that
  # stopped only the exit after it (engines stopping; 2026-12-06, rc 124 at 523 s) stopped no recording. A
  # stopped session prints that line too, but after "!!! ... Exit ..." and with a test failed or in error
  if [ "$rc" = 124 ] && grep -qE '^=+ [0-9]+ passed.* in [0-9.]+s' "$OUT/${label}0.log" \
     && ! grep -qE '^!!!|^=+ .*(failed|error)' "$OUT/${label}0.log"; then rc=0; fi
  if [ "$rc" -gt 1 ] || [ ! -f "$OUT/${label}0/results.json" ]; then
    echo "the recording did not finish (rc=$rc): no compare runs"; exit 1  # rc 1: a test failed, its baselines are still written
  fi
  touch /tmp/unseen-base/.complete  # REUSE_BASE takes only a recording that finished
  rm -f "$OUT/${label}0/summary.md" "$OUT"/baselines-*.tgz  # the shipped baselines, unchanged: not needed back
  grep -h "^time to verdict" "$OUT/${label}0.log"
fi
KEEP_CACHE=0 FIRST_RUN_S= scripts/gpu-gate-runs.sh "$label" $(( total - ($(date +%s) - start) )) --llmperf-baseline-dir=/tmp/unseen-base "$@"
cat "$OUT/kept/time_to_verdict.txt" 2>/dev/null || tar xzOf "$OUT/runs.tgz" kept/time_to_verdict.txt 2>/dev/null
