#!/usr/bin/env bash
# train.eval (docs/training_loop.md, "Held-out loss"): a held-out loss every 2 steps on the
# test photos' nature folder, at 3 timesteps, 6 steps with train.deterministic:
#  1. on 1, 2 and 3 processes the held-out losses (overall and per timestep, at steps 2, 4
#     and 6) are identical to the last bit;
#  2. they are the same samples, timesteps and noise every time: with a learning rate of 1e-30
#     (below every weight's last bit) the model does not move, and steps 2, 4 and 6 give the
#     same losses bitwise;
#  3. the report has the plot and the summary line; TensorBoard has eval/loss;
#  4. train.eval.fraction 0.25 instead of a folder: the held-out samples and the trained ones
#     are the test photos, each in one of the two sets, on 2 processes.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
photos=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$photos]" --train.visualize=false --train.log_interval=2
        --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0 --train.micro_batch_size=2
        --train.global_batch_size=6 --train.max_steps=6 --dist.threads_per_process=1 --train.deterministic=true
        "--train.eval.data_dir=[$photos/nature]" --train.eval.every_steps=2 "--train.eval.timesteps=[50, 500, 950]"
        "--work_dir=$SCRATCH/$TOKEN")
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
evals() {  # WORK_DIR: every evaluation's step, loss and per-timestep losses, one line each
  timeout 60 "$SANA_PYTHON" -c 'import json, sys
for l in open(sys.argv[1]):
    m = json.loads(l)
    if "eval_step" in m:
        print(m["eval_step"], repr(m["eval_loss"]), m["eval_samples"],
              " ".join(f"{t}:{v!r}" for t, v in sorted(m["eval_loss_by_timestep"].items())))' "$1/metrics.jsonl"
}
for w in 1 2 3; do
  run "w$w" "$w"; assert_code $? 0 "6 steps with a held-out loss every 2 on $w process(es)"
done
assert_contains "$SCRATCH/w1.log" "train.eval: " "the held-out set is announced"
assert_contains "$SCRATCH/w1.log" "eval at step 2: loss " "the log says each evaluation"
one=$(evals "$SCRATCH/w1")
[ "$(echo "$one" | wc -l)" = 3 ] && pass "3 evaluations (steps 2, 4, 6)" || fail "evaluations: '$one'"
for w in 2 3; do
  other=$(evals "$SCRATCH/w$w")
  if [ -n "$one" ] && [ "$one" = "$other" ]; then pass "$w processes: the held-out losses equal 1 process's bitwise"
  else fail "$w processes vs 1: '$other' vs '$one'"; fi
done
run frozen 2 --train.optimizer.lr=1e-30; assert_code $? 0 "the same with learning rate 1e-30"
distinct=$(evals "$SCRATCH/frozen" | cut -d' ' -f2- | sort -u | wc -l)
[ "$distinct" = 1 ] && pass "an unchanged model measures the same held-out losses at every evaluation" \
  || fail "an unchanged model measured $distinct different held-out results: $(evals "$SCRATCH/frozen")"
timeout 120 "$BIN" report "$SCRATCH/w2" > "$SCRATCH/report.log" 2>&1
assert_code $? 0 "sana-train report"
[ -s "$SCRATCH/w2/report/eval_loss.png" ] && pass "the report plots the held-out loss" || fail "no eval_loss.png"
assert_contains "$SCRATCH/w2/report/summary.txt" "held-out loss (train.eval): " "the summary has the held-out loss"
if grep -qa "eval/loss_t500" "$SCRATCH"/w2/tensorboard/events.out.tfevents.* 2>/dev/null; then
  pass "TensorBoard has eval/loss_t500"
else
  fail "no eval/loss_t500 in TensorBoard's events"
fi
photo_count=$(find "$photos" -type f \( -name '*.jpg' -o -name '*.png' \) | wc -l)
run frac 2 "--train.eval.data_dir=[]" --train.eval.fraction=0.25; assert_code $? 0 "a held-out quarter of the photos"
trained=$(grep -o "train.eval.fraction 0.25 seed [0-9]* trained): kept [0-9]* of [0-9]*" "$SCRATCH/frac.log" | head -1 |
  sed 's/.*kept \([0-9]*\) of \([0-9]*\)/\1 \2/')
held=$(grep -o "train.eval: [0-9]* held-out samples" "$SCRATCH/frac.log" | grep -o "[0-9]*" | head -1)
set -- $trained
if [ -n "$held" ] && [ "${1:-0}" -gt 0 ] && [ "$held" -gt 0 ] && [ $(( $1 + held )) = "$photo_count" ] && [ "${2:-}" = "$photo_count" ]; then
  pass "train.eval.fraction 0.25: $held held out, $1 trained, of $photo_count photos"
else
  fail "train.eval.fraction: trained '$trained', held out '$held', photos $photo_count"
fi
assert_contains "$SCRATCH/frac.log" "eval at step 6: loss " "the held-out quarter is measured"
assert_no_leftovers
finish
