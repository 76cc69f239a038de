#!/usr/bin/env bash
# check-dist with N processes started by LAUNCHER (launch | mpirun | torchrun | slurm):
# every rank meets, agrees, all-reduces, and rank 0 prints a healthy report.
. "$(dirname "$0")/lib.sh"
launcher=$1
n=$2
out=$SCRATCH/out.log
args=(check-dist --dist.timeout_s=60 --work_dir="$SCRATCH/$TOKEN")
port=$(free_port)
case "$launcher" in
  launch)
    timeout 120 "$BIN" launch --nproc-per-node "$n" -- "${args[@]}" > "$out" 2>&1
    code=$?
    expect_via="sana-launch"; expect_store="hosted by rank 0" ;;
  mpirun)
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$n" -x MASTER_PORT="$port" \
      "$BIN" "${args[@]}" > "$out" 2>&1
    code=$?
    expect_via="openmpi"; expect_store="store 127.0.0.1:$port hosted by rank 0" ;;
  torchrun)
    # Debian's torchrun (python3-torch 1.13) hosts the store in its agent. Trixie's 2.6
    # cannot start even /bin/true: its static rendezvous asks for a libuv TCPStore and
    # Debian builds torch without libuv. That is torchrun's fault, not ours: skip (77).
    if ! timeout 60 "$SANA_PYTHON" -m torch.distributed.run --nnodes 1 --nproc_per_node 1 \
        --master_port "$port" --redirects 2 --tee 2 --log_dir "$SCRATCH/probe" \
        --no_python /bin/true > "$SCRATCH/probe.log" 2>&1; then
      tail -3 "$SCRATCH/probe.log"
      skip "this torchrun cannot start /bin/true (above)"
    fi
    timeout 120 "$SANA_PYTHON" -m torch.distributed.run --nnodes 1 --nproc_per_node "$n" \
      --master_port "$port" --redirects 2 --tee 2 --log_dir "$SCRATCH/torchrun" \
      --no_python "$BIN" "${args[@]}" > "$out" 2>&1
    code=$?
    expect_via="torchrun"; expect_store="store 127.0.0.1:$port hosted by the torchrun agent" ;;
  slurm)
    # What srun sets for one step on one node; the port comes from the job id
    # (20000 + id % 20000), so pick an id whose port is free.
    job=$(( $(free_port) - 20000 ))
    while [ "$job" -lt 0 ] || [ "$job" -ge 20000 ]; do job=$(( $(free_port) - 20000 )); done
    pids=()
    for ((r = 0; r < n; r++)); do
      SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$r SLURM_NTASKS_PER_NODE="$n(x1)" \
        SLURM_STEP_ID=0 SLURM_JOB_ID=$job SLURM_STEP_NODELIST=localhost \
        timeout 120 "$BIN" "${args[@]}" > "$SCRATCH/rank$r.log" 2>&1 &
      pids+=($!)
    done
    code=0
    for p in "${pids[@]}"; do code_of "$p" 130; [ "$CODE" -eq 0 ] || code=$CODE; done
    cat "$SCRATCH"/rank*.log > "$out"
    expect_via="slurm"; expect_store="store localhost:$((20000 + job)) hosted by rank 0" ;;
  *) echo "unknown launcher $launcher"; exit 2 ;;
esac
assert_code "$code" 0 "check-dist via $launcher with $n processes"
assert_contains "$out" "check-dist: $n ranks via $expect_via" "rank 0 reports $n ranks via $expect_via"
assert_contains "$out" "$expect_store" "the store is where it should be"
assert_contains "$out" "agreement: world size, program version and config fingerprint match" "agreement"
assert_contains "$out" "64 MiB" "bandwidth table up to 64 MiB"
assert_contains "$out" "check-dist: healthy" "healthy"
assert_no_leftovers
finish
