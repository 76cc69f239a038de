#!/usr/bin/env bash
# dist.elastic continue (issue 47): one of 4 ranks is killed (SIGKILL) or stopped (SIGSTOP)
# at a random step of a launcher run; the survivors re-form within dist.timeout_s + 5 s,
# without reading a checkpoint, and end on 3 ranks with the weights of a run that went
# from 4 to 3 ranks at that step by checkpoint and resume (1e-6), every sample once per
# epoch and the same samples in every step. The launcher kills a stopped rank once the
# others have left it, and exits 0. With --max-restarts 1 (JOIN) the launcher starts a
# replacement, which the group takes in at a step boundary: the run ends on 4 ranks with
# the weights of 4 -> 3 -> 4 ranks by checkpoint and resume at those steps. ZERO2 (SIGKILL)
# and ZERO3 (SIGSTOP; CAME and an EMA, compared too) do the same under train.zero_stage
# 2 and 3: the lost rank's share comes from its mirror on the next rank
# (train/elastic/share_mirror.h); JOIN2 is JOIN under stage 2, the shares gathered for the
# replacement. DET: SIGKILL under train.deterministic (its
# integer sums start anew with the trainers rebuilt from rank 0's state); the weights must
# be bitwise equal there. PAIR: two neighbouring ranks killed together under stage 2 leave
# no copy of the first one's share: the survivors stop saying so and the launcher restarts
# every rank from the last checkpoint. KILL0 (stage 0) and STOP0 (stage 2): rank 0 is the
# one lost; the launcher hosts the store, so the others go on, rank 1 taking over rank 0's
# duties (metrics, checkpoints, the end) in trainers rebuilt from the group's state.
# NODE: two launchers as two nodes of 2 ranks under stage 2; node 1 is killed whole (its
# launcher, its workers with it); the mirrors are across nodes, so node 0 goes on and ends
# with the weights of 4 ranks to that step, then 2 by resume. NODE0: node 0's workers are
# killed instead; its launcher keeps the store up while node 1 goes on to the end, and both
# lost ranks are cleared within one heartbeat timeout, not one each. STORE0: a config that names
# its own dist.master_port has rank 0 host the store there;
# rank 0 stopped (SIGSTOP): the others lose the store and stop; the launcher, told by
# nobody, kills rank 0 once it has been stopped past dist.heartbeat_timeout_s + 5 s and
# restarts every rank from the last checkpoint (before, it waited for rank 0 for ever).
# SURVIVOR_CASES picks cases.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
timeout_s=15
steps=14
common=(--config "$config" --data.data_dir="[$data]" --train.visualize=false --train.log_interval=1
        --dist.timeout_s=$timeout_s --dist.heartbeat_timeout_s=3 --train.save_model_steps=0
        --train.save_model_epochs=0 --train.micro_batch_size=2)
export SANA_TEST_LOG_IDS=1

run() {  # NAME NPROC ARGS...: a launcher run to its end (output in $SCRATCH/NAME.log)
  local name=$1 n=$2; shift 2
  timeout 300 "$BIN" launch --nproc-per-node "$n" -- "${common[@]}" "$@" > "$SCRATCH/$name.log" 2>&1
  local code=$?
  [ $code -eq 0 ] || tail -20 "$SCRATCH/$name.log"
  return $code
}

# The weights and the per-step samples of run A against the runs REF... that did the same
# by checkpoint and resume (the last one's weights): python3-torch reads them.
same_run() {  # A REF...
  timeout 120 "$SANA_PYTHON" - "$(dirname "$0")/../reference" "$@" <<'PY'
import glob, os, re, sys
sys.path.insert(0, sys.argv[1])
from sana_reference import read_safetensors
a, refs = sys.argv[2], sys.argv[3:]
wa, _ = read_safetensors(f"{a}/model.safetensors")
wb, _ = read_safetensors(f"{refs[-1]}/model.safetensors")
if os.path.exists(f"{refs[-1]}/ema.safetensors"):  # the EMA too, when the run keeps one
    for name, t in read_safetensors(f"{a}/ema.safetensors")[0].items(): wa["ema/" + name] = t
    for name, t in read_safetensors(f"{refs[-1]}/ema.safetensors")[0].items(): wb["ema/" + name] = t
worst = max((wa[k].double() - wb[k].double()).abs().max().item() for k in wb)
print(f"{len(wb)} tensors, same names {sorted(wa) == sorted(wb)}, largest difference {worst:.3g}")

def steps(dirs):
    # (epoch, step) -> sorted sample ids. The 3-rank files win over the 4-rank ones: a step
    # the loss interrupted is in both, and only its rerun trained.
    by_world = {}
    for d in dirs:
        for path in glob.glob(f"{d}/ids.rank*.w*.log"):
            w = int(re.search(r"\.w(\d+)\.log$", path).group(1))
            for line in open(path):
                e, s, *ids = map(int, line.split())
                by_world.setdefault(w, {}).setdefault((e, s), []).extend(ids)
    out = {}
    for w in sorted(by_world, reverse=True):  # 4 first, then 3 overwrites
        out.update({k: sorted(v) for k, v in by_world[w].items()})
    return out

sa, sb = steps([a]), steps(refs)
once = all(len(set(sum((v for (e, _), v in sa.items() if e == epoch), []))) ==
           sum(len(v) for (e, _), v in sa.items() if e == epoch) for epoch in {e for e, _ in sa})
print(f"steps {len(sa)} vs {len(sb)}, same samples per step {sa == sb}, every sample once per epoch {once}")
tol = float(os.environ.get("SAME_TOLERANCE", "1e-6"))
sys.exit(0 if sorted(wa) == sorted(wb) and worst <= tol and sa == sb and once else 1)
PY
}

# Asserts for case NAME that LOG says the survivors went on within dist.timeout_s + 5 s of
# T0 (WHO: what was lost, for the message).
expect_regroup() {  # NAME LOG T0 WHO; sets REGROUP_S (seconds from T0, "" if none)
  local name=$1 log=$2 t0=$3 who=$4 secs
  REGROUP_S=""
  if wait_for_line "$log" "left the run after step" $((timeout_s + 10)); then
    secs=$(elapsed_since "$t0")
    REGROUP_S=$secs
    echo "$who lost -> the survivors went on after ${secs} s (dist.timeout_s=$timeout_s)"
    awk -v s="$secs" -v t="$timeout_s" 'BEGIN { exit !(s < t + 5) }' &&
      pass "$name: the survivors re-formed within dist.timeout_s + 5 s" || fail "$name: re-forming took ${secs} s"
  else
    fail "$name: the survivors did not re-form within $((timeout_s + 10)) s"; tail -30 "$log"
  fi
}

# Asserts for case NAME that run DIR ended as the runs REF... resumed at the same steps
# (same_run, within TOLERANCE).
expect_same() {  # NAME TOLERANCE DIR REF...
  local name=$1 tolerance=$2 code
  shift 2
  SAME_TOLERANCE=$tolerance same_run "$@" > "$SCRATCH/same.log" 2>&1
  code=$?
  cat "$SCRATCH/same.log"
  assert_code $code 0 "$name: the weights (within $tolerance) and every step's samples equal the runs resumed at those steps"
}

# A reference leg: NPROC ranks resumed from FROM's checkpoint (none: a fresh start) to step
# STEPS in its own folder DIR (its ids logs its own).
leg() {  # DIR NPROC STEPS [FROM [ARGS...]]
  local dir=$1 n=$2 to=$3 from=${4:-}
  shift 4
  [ -d "$dir" ] && return 0
  if [ -n "$from" ]; then cp -r "$from" "$dir"; rm -f "$dir"/ids.*; fi
  run "$(basename "$dir")" "$n" --train.max_steps="$to" --resume_from=latest "--work_dir=$dir" "$@"
  assert_code $? 0 "$n ranks to step $to"
}

cases=" ${SURVIVOR_CASES:-KILL STOP JOIN ZERO2 ZERO3 JOIN2 DET PAIR KILL0 STOP0 NODE NODE0 STORE0} "
single=${cases/ PAIR / }
single=${single/ NODE / }
single=${single/ NODE0 / }
for case in ${single/ STORE0 / }; do
  sig=$case; restarts=0; zero=0; join=false; extra=()
  victim=$(( RANDOM % 3 + 1 ))
  [ "$case" = JOIN ] && { sig=KILL; restarts=1; join=true; }
  [ "$case" = JOIN2 ] && { sig=KILL; restarts=1; join=true; zero=2; }
  [ "$case" = ZERO1 ] && { sig=KILL; zero=1; }  # not in the default list: stage 2's path, gradients whole
  [ "$case" = ZERO2 ] && { sig=KILL; zero=2; }
  [ "$case" = ZERO3 ] && { sig=STOP; zero=3; extra=(--train.optimizer.type=CAME --train.ema_update=true); }
  [ "$case" = DET ] && { sig=KILL; extra=(--train.deterministic=true); }
  [ "$case" = KILL0 ] && { sig=KILL; victim=0; }
  [ "$case" = STOP0 ] && { sig=STOP; victim=0; zero=2; }
  at=$(( RANDOM % 6 + 3 ))
  name=$case
  dir=$SCRATCH/$TOKEN-$name
  start_bounded 300 "$SCRATCH/$name.log" "$BIN" launch --nproc-per-node 4 --max-restarts $restarts -- "${common[@]}" \
    --dist.elastic=continue --train.max_steps=$steps "--work_dir=$dir" --train.zero_stage=$zero "${extra[@]}"
  launcher=$BG
  if ! wait_for_line "$dir/metrics.jsonl" "\"step\":$at," 240; then
    fail "$name: the run did not reach step $at"; cat "$SCRATCH/$name.log"; finish
  fi
  kill "-$sig" "$(pid_of_rank "$victim" --dist.elastic=continue)"
  t0=$(now)
  echo "SIG$sig to rank $victim after step $at"
  expect_regroup "$name" "$SCRATCH/$name.log" "$t0" "SIG$sig: rank $victim"
  code_of "$launcher"
  world=3; $join && world=4
  assert_code "$CODE" 0 "$name: the launcher, the run having ended on $world ranks"
  assert_contains "$SCRATCH/$name.log" "parameters identical on all $world ranks" "$name: $world ranks finish the run"
  assert_contains "$SCRATCH/$name.log" "rank $victim left the run after step" "$name: the log names rank $victim"
  if grep -q "resume_from\|resumed from" "$SCRATCH/$name.log"; then fail "$name: a checkpoint was read"; else
    pass "$name: no checkpoint was read"; fi
  [ "$sig" = STOP ] && assert_contains "$SCRATCH/$name.log" "rank $victim was left out of the run (lost); killing it" \
    "STOP: the launcher kills the stopped rank"
  after=$(grep -o "left the run after step [0-9]*" "$SCRATCH/$name.log" | head -1 | grep -o "[0-9]*$")
  joined=$(grep -o "joined after step [0-9]*" "$SCRATCH/$name.log" | head -1 | grep -o "[0-9]*$")
  $join && { [ -n "$joined" ] && pass "$name: the replacement joined after step $joined" ||
              fail "$name: no replacement joined"; }
  timeout 30 "$SANA_PYTHON" - "$dir/metrics.jsonl" "$after" "$victim" "${joined:-}" <<'PY' || fail "$name: metrics.jsonl marks no regroup"
import json, sys
marks = [r["regroup"] for r in map(json.loads, open(sys.argv[1])) if "regroup" in r]
print("metrics.jsonl:", marks)
lost = marks[0]["after_step"] == int(sys.argv[2]) and marks[0]["world"] == 3 and marks[0]["lost"] == [int(sys.argv[3])]
joined = len(marks) == 1 if not sys.argv[4] else (len(marks) == 2 and marks[1]["after_step"] == int(sys.argv[4])
                                                   and marks[1]["world"] == 4 and len(marks[1]["joined"]) == 1)
sys.exit(0 if lost and joined else 1)
PY

  if [ "$case" = ZERO2 ]; then  # the mirrors' memory, as logged after the rebuild, against `sana-train model`
    timeout 120 "$BIN" model "${common[@]}" --train.zero_stage=2 --dist.elastic=continue --json --world-size 3 \
      > "$SCRATCH/estimate.json" 2> /dev/null
    cat "$SCRATCH/$name.log" "$dir"/train.rank*.log | timeout 30 "$SANA_PYTHON" -c '
import json, re, sys
est = [r["mirror"] for r in json.load(open(sys.argv[1]))["memory_per_process"]["ranks"]]
got = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"r(\d)/3 I\] this rank mirrors .*?: (\d+) bytes", sys.stdin.read())}
print("mirror bytes on 3 ranks, logged", [got.get(r) for r in range(3)], "estimated", est)
sys.exit(0 if len(got) == 3 and all(abs(got[r] - est[r]) <= 1e-3 * est[r] for r in range(3)) else 1)' "$SCRATCH/estimate.json"
    assert_code $? 0 "ZERO2: each mirror holds the bytes sana-train model estimates (0.1%)"
  fi

  # The same run by checkpoint and resume: 4 ranks to that step, then 3 to the end (JOIN:
  # 3 to the step the replacement joined after, then 4 to the end).
  z=(--train.zero_stage=$zero "${extra[@]}")
  tag=z$zero; [ "$case" = DET ] && tag=det
  base=$SCRATCH/${tag}w4to$after
  leg "$base" 4 "$after" "" "${z[@]}"
  if $join; then
    leg "${base}w3to$joined" 3 "$joined" "$base" "${z[@]}"
    leg "${base}w3to${joined}w4" 4 $steps "${base}w3to$joined" "${z[@]}"
    refs=("$base" "${base}w3to$joined" "${base}w3to${joined}w4")
  else
    leg "${base}w3" 3 $steps "$base" "${z[@]}"
    refs=("$base" "${base}w3")
  fi
  tolerance=1e-6; [ "$case" = DET ] && tolerance=0
  expect_same "$name" $tolerance "$dir" "${refs[@]}"
  assert_no_leftovers
done

if [[ "$cases" == *" PAIR "* ]]; then
  name=PAIR
  dir=$SCRATCH/$TOKEN-$name
  first=$(( RANDOM % 2 + 1 )); second=$((first + 1)); at=$(( RANDOM % 4 + 4 ))
  start_bounded 300 "$SCRATCH/$name.log" "$BIN" launch --nproc-per-node 4 --max-restarts 3 -- "${common[@]}" \
    --dist.elastic=continue --train.max_steps=$steps "--work_dir=$dir" --train.zero_stage=2 \
    --train.save_model_steps=2 --resume_from=latest
  launcher=$BG
  if ! wait_for_line "$dir/metrics.jsonl" "\"step\":$at," 240; then
    fail "$name: the run did not reach step $at"; cat "$SCRATCH/$name.log"; finish
  fi
  kill -KILL "$(pid_of_rank "$first" --dist.elastic=continue)" "$(pid_of_rank "$second" --dist.elastic=continue)"
  echo "SIGKILL to ranks $first and $second after step $at"
  code_of "$launcher"
  assert_code "$CODE" 0 "PAIR: the launcher, the run having restarted from its checkpoint"
  assert_contains "$SCRATCH/$name.log" "rank $first and rank $second, which kept the mirror of its share" \
    "PAIR: the survivors name the share no rank keeps"
  assert_contains "$SCRATCH/$name.log" "resumed from" "PAIR: every rank restarted from the last checkpoint"
  assert_contains "$SCRATCH/$name.log" "parameters identical on all 4 ranks" "PAIR: 4 ranks finish the run"
  assert_no_leftovers
fi

for name in NODE NODE0; do
  [[ "$cases" == *" $name "* ]] || continue
  # Two launchers on this host as two nodes of 2 (node 1's ranks are 2 and 3) under ZeRO
  # stage 2. NODE: node 1's launcher is killed, its workers with it; NODE0: node 0's two
  # workers are killed, its launcher (the store's host) stays. The mirror stride is 2, so
  # each lost share has its mirror on the other node, which goes on alone.
  dir=$SCRATCH/$TOKEN-$name
  at=$(( RANDOM % 6 + 3 ))
  port=$(free_port)
  launchers=()
  for node in 0 1; do
    start_bounded 300 "$SCRATCH/$name$node.log" "$BIN" launch --nnodes 2 --node-rank $node --nproc-per-node 2 \
      --master-addr 127.0.0.2 --master-port "$port" -- "${common[@]}" --dist.elastic=continue \
      --train.max_steps=$steps "--work_dir=$dir" --train.zero_stage=2
    launchers+=("$BG")
  done
  if ! wait_for_line "$dir/metrics.jsonl" "\"step\":$at," 240; then
    fail "$name: the run did not reach step $at"; cat "$SCRATCH/$name"[01].log; finish
  fi
  going=0; lost=1; lost_ranks="2, 3"
  if [ "$name" = NODE ]; then
    kill -KILL "${launchers[1]}"
  else
    going=1; lost=0; lost_ranks="0, 1"
    kill -KILL "$(pid_of_rank 0 --dist.elastic=continue)" "$(pid_of_rank 1 --dist.elastic=continue)"
  fi
  t0=$(now)
  echo "$name: node $lost killed after step $at"
  log=$SCRATCH/$name$going.log
  expect_regroup "$name" "$log" "$t0" "node $lost"
  if [ "$name" = NODE0 ] && [ -n "$REGROUP_S" ]; then
    # Rank 1 went silent with rank 0: found from the store's record of its last beat as soon
    # as rank 0 is declared, not one more heartbeat timeout later (3 s each).
    awk -v s="$REGROUP_S" 'BEGIN { exit !(s < 2 * 3) }' &&
      pass "NODE0: both of node 0's ranks cleared within one heartbeat timeout (${REGROUP_S} s)" ||
      fail "NODE0: clearing node 0's ranks took ${REGROUP_S} s, a heartbeat timeout (3 s) per rank"
  fi
  code_of "${launchers[$going]}"
  assert_code "$CODE" 0 "$name: node $going's launcher, the run having ended on its 2 ranks"
  code_of "${launchers[$lost]}" 30
  if [ "$name" = NODE0 ]; then  # node 0's launcher kept the store up until node 1 was done
    assert_code "$CODE" 137 "NODE0: node 0's launcher, its workers lost (the first one's code)"
    assert_contains "$SCRATCH/NODE00.log" "the run's store stays up for the other nodes' workers" \
      "NODE0: node 0's launcher serves the store for node 1"
  fi
  assert_contains "$log" "ranks $lost_ranks left the run after step" "$name: the log names node $lost's ranks"
  assert_contains "$log" "parameters identical on all 2 ranks" "$name: 2 ranks finish the run"
  assert_contains "$SCRATCH/${name}0.log" "rank 2's share (2 ranks before it)" "$name: rank 0 mirrored rank 2's share"
  if grep -q "resume_from\|resumed from" "$log"; then fail "$name: a checkpoint was read"; else
    pass "$name: no checkpoint was read"; fi
  after=$(grep -o "left the run after step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")
  base=$SCRATCH/z2w4to$after
  leg "$base" 4 "$after" "" --train.zero_stage=2
  leg "${base}w2" 2 $steps "$base" --train.zero_stage=2
  expect_same "$name" 1e-6 "$dir" "$base" "${base}w2"  # 4 ranks to that step, then 2
  assert_no_leftovers
done

if [[ "$cases" == *" STORE0 "* ]]; then
  name=STORE0
  dir=$SCRATCH/$TOKEN-$name
  at=$(( RANDOM % 4 + 4 ))
  port=$(free_port)
  start_bounded 300 "$SCRATCH/$name.log" "$BIN" launch --nproc-per-node 4 --max-restarts 1 -- "${common[@]}" \
    --dist.elastic=continue --train.max_steps=$steps "--work_dir=$dir" --train.save_model_steps=2 --resume_from=latest \
    --dist.master_port="$port"
  launcher=$BG
  if ! wait_for_line "$dir/metrics.jsonl" "\"step\":$at," 240; then
    fail "$name: the run did not reach step $at"; cat "$SCRATCH/$name.log"; finish
  fi
  kill -STOP "$(pid_of_rank 0 --dist.elastic=continue)"
  t0=$(now)
  echo "SIGSTOP to rank 0 after step $at"
  if wait_for_line "$SCRATCH/$name.log" "rank 0 has been stopped for over" 60; then
    secs=$(elapsed_since "$t0")
    echo "the launcher killed the stopped rank 0 after ${secs} s (heartbeat timeout 3 s)"
    awk -v s="$secs" 'BEGIN { exit !(s < 3 + 5 + 3) }' &&
      pass "STORE0: the launcher kills rank 0 within dist.heartbeat_timeout_s + 8 s" || fail "STORE0: it took ${secs} s"
  else
    fail "STORE0: the launcher did not kill the stopped rank 0"
  fi
  code_of "$launcher"
  assert_code "$CODE" 0 "STORE0: the launcher, the run having restarted from its checkpoint"
  assert_contains "$SCRATCH/$name.log" "resumed from" "STORE0: every rank restarted from the last checkpoint"
  assert_contains "$SCRATCH/$name.log" "parameters identical on all 4 ranks" "STORE0: 4 ranks finish the run"
  assert_no_leftovers
fi
finish
