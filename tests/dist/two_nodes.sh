#!/usr/bin/env bash
# Two nodes on one machine: two network namespaces joined by a veth pair, with addresses
# of the test's own (198.18.0.1/30 and 198.18.0.2/30, the benchmarking range) and no route
# out of them. Each node runs `sana-train launch --nnodes 2` inside its namespace:
#   1. training over the link finishes on both nodes;
#   2. the link is cut mid-run: every process exits within dist.timeout_s + 10 s, each
#      node naming the peer it lost; with the link back, --resume_from latest finishes;
#   3. one node given a wrong --master-addr: both stop within the timeout, saying so;
#   4. a node that starts LATE_S (default 40: past the 30 s that connect timeouts often default to)
#      seconds after the other: the first waits,
#      bounded by dist.timeout_s, and the run finishes.
# Needs root (ip netns); where namespaces cannot be made it says so and exits 77 (Skipped).
. "$(dirname "$0")/lib.sh"
late_s=${LATE_S:-40}
ns0=sana$$a ns1=sana$$b veth0=sv$$a veth1=sv$$b
cleanup() {
  pkill -KILL -f "$TOKEN" 2>/dev/null
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
if ! ip netns add "$ns0" 2>/dev/null; then
  skip "cannot create network namespaces here (needs root and ip netns)"
fi
ip netns add "$ns1" && ip link add "$veth0" type veth peer name "$veth1" &&
  ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" &&
  ip -n "$ns0" addr add 198.18.0.1/30 dev "$veth0" && ip -n "$ns1" addr add 198.18.0.2/30 dev "$veth1" &&
  ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
  ip -n "$ns0" link set "$veth0" up && ip -n "$ns1" link set "$veth1" up ||
  { fail "could not set up the two namespaces"; finish; }
# Waits (bounded) until both ends of the link are up.
link_up() {
  local deadline=$(( $(date +%s) + 10 ))
  until ip -n "$ns0" -o link show "$veth0" | grep -q "state UP" && ip -n "$ns1" -o link show "$veth1" | grep -q "state UP"; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.1
  done
}
link_up || { fail "the veth link did not come up"; finish; }
pass "two namespaces joined by a veth link (198.18.0.1 <-> 198.18.0.2)"

timeout_s=8
config=$(cd "$(dirname "$0")/../../configs" && pwd)/sana_tiny_cpu.yaml
data=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
work=$SCRATCH/$TOKEN
common=(--config "$config" --data.data_dir="[$data]" --train.visualize=false --train.log_interval=1
        --dist.heartbeat_timeout_s=$timeout_s --train.save_model_steps=2 --train.save_model_epochs=0
        --data.tail=pad --train.global_batch_size=8 --train.micro_batch_size=2 --work_dir="$work")

# Starts node N (0 or 1) in its namespace; the launcher's pid goes to NODE[N].
declare -a NODE
start_node() {  # N MASTER_ADDR PORT ARGS...
  local n=$1 addr=$2 port=$3 ns
  shift 3
  ns=$([ "$n" = 0 ] && echo "$ns0" || echo "$ns1")
  timeout 300 ip netns exec "$ns" "$BIN" launch --nnodes 2 --node-rank "$n" --nproc-per-node 1 --master-addr "$addr" \
    --master-port "$port" -- "${common[@]}" "$@" > "$SCRATCH/node$n.log" 2>&1 &
  NODE[$n]=$!
}

wait_nodes() {  # SECONDS: waits for both launchers; CODES gets their exit codes
  local n
  CODES=()
  for n in 0 1; do
    wait_for_exit "${NODE[$n]}" "$1" || fail "node $n still runs after $1 s"
  done
  for n in 0 1; do kill -KILL "${NODE[$n]}" 2>/dev/null; code_of "${NODE[$n]}" 5; CODES[$n]=$CODE; done
}

# 1. Training over the link.
port=29611
start_node 0 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=4
start_node 1 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=4
wait_nodes 180
assert_code "${CODES[0]}" 0 "node 0 trains over the link"
assert_code "${CODES[1]}" 0 "node 1 trains over the link"
assert_contains "$SCRATCH/node0.log" "done: 4 steps" "the run reaches its last step"
assert_no_leftovers

# 2. The link cut mid-run, then restored for a resume.
rm -rf "$work"
start_node 0 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=200
start_node 1 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=200
wait_for_line "$work/metrics.jsonl" '"step":5,' 180 || fail "training did not reach step 5"
ip -n "$ns1" link set "$veth1" down
t0=$(now)
wait_nodes $((timeout_s + 30))
secs=$(elapsed_since "$t0")
echo "link cut -> both nodes gone after $secs s (codes ${CODES[0]}, ${CODES[1]})"
awk -v s="$secs" -v l="$((timeout_s + 10))" 'BEGIN { exit !(s <= l) }' && pass "every process exits within dist.timeout_s + 10 s of the cut" ||
  fail "processes ran $secs s after the cut (limit $((timeout_s + 10)) s)"
[ "${CODES[0]}" -ne 0 ] && [ "${CODES[1]}" -ne 0 ] && pass "both nodes fail" || fail "a node exited 0 after the cut"
if grep -qE "rank 1 (stopped responding|made no progress)|no word from rank 1\b|behind: (rank [0-9]+ at #[0-9]+, )*rank 1 at #" "$SCRATCH/node0.log"; then
  pass "node 0 names rank 1 as the peer it lost"
else
  fail "node 0 does not name rank 1"; tail -15 "$SCRATCH/node0.log"
fi
if grep -qE "(rank 0|sana-train launch on node 0) \(the store host at 198\.18\.0\.1:$port\)|rank 0 stopped responding" \
    "$SCRATCH/node1.log"; then
  pass "node 1 names node 0 (the store host at 198.18.0.1) or its rank 0 as the peer it lost"
else
  fail "node 1 does not name rank 0"; tail -15 "$SCRATCH/node1.log"
fi
assert_no_leftovers
ip -n "$ns1" link set "$veth1" up
link_up || fail "the link did not come back up"
if [ -f "$work/checkpoints/latest" ]; then
  start_node 0 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=10 --resume_from=latest
  start_node 1 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=10 --resume_from=latest
  wait_nodes 180
  assert_code "${CODES[0]}" 0 "node 0 resumes over the restored link"
  assert_code "${CODES[1]}" 0 "node 1 resumes over the restored link"
  assert_contains "$SCRATCH/node0.log" "resumed from" "the resume loaded the last checkpoint"
else
  fail "no checkpoint was saved before the cut"
fi
assert_no_leftovers

# 3. Node 1 told a wrong master address (nothing answers there).
rm -rf "$work"
t0=$(now)
start_node 0 198.18.0.1 $port --dist.timeout_s=$timeout_s --train.max_steps=4
start_node 1 198.18.0.3 $port --dist.timeout_s=$timeout_s --train.max_steps=4
wait_nodes $((timeout_s + 30))
secs=$(elapsed_since "$t0")
echo "wrong master address -> both nodes gone after $secs s"
[ "${CODES[0]}" -ne 0 ] && [ "${CODES[1]}" -ne 0 ] && pass "both nodes fail (codes ${CODES[0]}, ${CODES[1]})" || fail "a node exited 0"
assert_contains "$SCRATCH/node1.log" "could not reach the store of rank 0 at 198.18.0.3:$port" "node 1 names the address it could not reach"
assert_contains "$SCRATCH/node0.log" "no word from rank 1" "node 0 names the rank that never came"
assert_no_leftovers

# 4. Node 1 starts late_s seconds after node 0; dist.timeout_s covers it.
rm -rf "$work"
late_timeout=$((late_s + 30))
start_node 0 198.18.0.1 $port --dist.timeout_s=$late_timeout --train.max_steps=2
sleep "$late_s"  # the fault itself: a node that comes late
kill -0 "${NODE[0]}" 2>/dev/null && pass "node 0 still waits after $late_s s" || fail "node 0 gave up before its timeout"
start_node 1 198.18.0.1 $port --dist.timeout_s=$late_timeout --train.max_steps=2
wait_nodes 180
assert_code "${CODES[0]}" 0 "node 0 with a node $late_s s late"
assert_code "${CODES[1]}" 0 "the late node"
assert_no_leftovers
finish
