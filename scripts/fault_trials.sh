#!/usr/bin/env bash
# Runs the fault-injection trials (tests/dist/faults.sh) for every fault, N trials each
# (default 30), and prints one table: trials, survived, the longest time from the fault
# until every process was gone, and the limit. Minutes per 10 trials: about 3 (sigstop),
# 2 (the others). Each fault's own output goes to DIR/<fault>.log (default a temp dir).
#   bash scripts/fault_trials.sh [TRIALS] [SEED]      (after scripts/build.sh)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
trials=${1:-30}
seed=${2:-$(( $(date +%s) % 32768 ))}
export SANA_TRAIN_BIN=${SANA_TRAIN_BIN:-$repo/build/apps/sana-train}
out=${SANA_FAULT_LOG_DIR:-$(mktemp -d /tmp/sana-faults-XXXXXX)}
mkdir -p "$out"
echo "fault trials: $trials per fault, seed $seed; logs in $out"
printf '| fault | trials | survived | longest exit (s) | limit (s) |\n|---|---|---|---|---|\n'
status=0
for fault in sigstop sigkill term_launcher ckpt_kill; do
  SANA_FAULT_TRIALS=$trials bash "$repo/tests/dist/faults.sh" "$fault" "$trials" "$seed" > "$out/$fault.log" 2>&1 || status=1
  # "faults summary: F: T trials, S survived, longest exit X s (limit L s, ...)"
  sed -n 's/^faults summary: [a-z_]*: \([0-9]*\) trials, \([0-9]*\) survived, longest exit \([0-9.]*\) s (limit \([0-9]*\) s.*/\1 \2 \3 \4/p' \
    "$out/$fault.log" | { read -r t s x l || { t=?; s=?; x=?; l=?; }; printf '| %s | %s | %s | %s | %s |\n' "$fault" "$t" "$s" "$x" "$l"; }
done
exit $status
