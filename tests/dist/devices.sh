#!/usr/bin/env bash
# The "Duplicate GPU detected" seed, without a GPU: SANA_TEST_CUDA_DEVICES stands in for
# the CUDA devices each process sees. A bad device map is a clear error on every rank,
# exit code 2, before any backend exists; sharing works only when asked for, with gloo.
. "$(dirname "$0")/lib.sh"

# Colab: one GPU, two processes.
out=$SCRATCH/colab.log
SANA_TEST_CUDA_DEVICES=GPU-colab timeout 60 "$BIN" launch --nproc-per-node 2 -- \
  check-dist --dist.timeout_s=30 --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1
assert_code $? 2 "two processes on one GPU"
for r in 0 1; do
  if of_rank "$r" "$out" | grep -qF "rank 1 (LOCAL_RANK 1) has no GPU of its own"; then
    pass "rank $r names rank 1 and the missing GPU"
  else
    fail "rank $r does not explain the missing GPU"
  fi
done
assert_contains "$out" "Start at most 1 process per node" "the fix is given"

# Two ranks whose visible devices map them onto the same GPU (e.g. CUDA_VISIBLE_DEVICES
# differing per process): rank 0 -> cuda:0 = GPU-x, rank 1 -> cuda:1 = GPU-x.
port=$(free_port)
SANA_TEST_CUDA_DEVICES=GPU-x,GPU-y start_rank 0 2 "$port" check-dist --dist.timeout_s=30
SANA_TEST_CUDA_DEVICES=GPU-y,GPU-x start_rank 1 2 "$port" check-dist --dist.timeout_s=30
for r in 0 1; do
  code_of "${PIDS[$r]}" 60; assert_code "$CODE" 2 "rank $r with a shared GPU"
  assert_contains "$SCRATCH/rank$r.log" "rank 0 (cuda:0) and rank 1 (cuda:1) are both on GPU GPU-x of host" "rank $r names both ranks and the device"
done

# Debugging on one GPU, explicitly allowed with gloo.
out=$SCRATCH/shared.log
SANA_TEST_CUDA_DEVICES=GPU-colab timeout 60 "$BIN" launch --nproc-per-node 2 -- \
  check-dist --dist.timeout_s=30 --dist.backend=gloo --dist.allow_shared_device=true \
  --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1
assert_code $? 0 "allow_shared_device with gloo"
assert_contains "$out" "cuda:0 GPU-colab" "the device map shows the shared GPU"
assert_no_leftovers
finish
