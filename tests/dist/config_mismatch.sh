#!/usr/bin/env bash
# Ranks started with different configs: every rank reports the difference, exit code 2.
. "$(dirname "$0")/lib.sh"
port=$(free_port)
start_rank 0 2 "$port" check-dist --dist.timeout_s=30 --train.seed=1
start_rank 1 2 "$port" check-dist --dist.timeout_s=30 --train.seed=2
for r in 0 1; do
  code_of "${PIDS[$r]}" 50; assert_code "$CODE" 2 "rank $r"
  assert_contains "$SCRATCH/rank$r.log" "ranks disagree on the config (fingerprint of the resolved config): rank 0 " "rank $r reports the mismatch"
  assert_contains "$SCRATCH/rank$r.log" "; rank 1 " "rank $r lists both ranks"
done
# Keys that may differ per rank do not count.
port=$(free_port)
start_rank 0 2 "$port" check-dist --dist.timeout_s=30 --log_level=debug
start_rank 1 2 "$port" check-dist --dist.timeout_s=30 --dist.threads_per_process=1
for r in 0 1; do code_of "${PIDS[$r]}" 50; assert_code "$CODE" 0 "rank $r with per-rank keys differing"; done
assert_no_leftovers
finish
