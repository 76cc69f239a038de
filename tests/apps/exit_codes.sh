#!/usr/bin/env bash
# The exit-code table through the real binary (sana/util/error.h): the same error exits
# the same way, with the same kind of message, from every command that can meet it.
#   2  usage: unknown command or option, config error, data error (no usable index)
#   1  the run failed: a damaged checkpoint
#   0  done
# Each case runs in a folder of its own (its current directory, so the config's relative
# work_dir lands there too), with a hard timeout per invocation.
. "$(dirname "$0")/../dist/lib.sh"
TINY=$(cd "$(dirname "$0")/../.." && pwd)/configs/sana_tiny_cpu.yaml
IMAGES=/usr/share/backgrounds/mate  # 30 wallpapers (mate-backgrounds), as the other tests use

# expect CODE TEXT WHAT ARGS...: sana-train ARGS in a new folder; checks the exit code, that
# the output holds TEXT, and that nothing crashed. The folder is left in CASE_DIR.
expect() {
  local code=$1 text=$2 what=$3
  shift 3
  CASE_DIR=$(mktemp -d "$SCRATCH/$TOKEN-case-XXXXXX")
  local out=$CASE_DIR/output.log
  (cd "$CASE_DIR" && timeout 60 "$BIN" "$@" > "$out" 2>&1)
  local rc=$?
  assert_code "$rc" "$code" "$what"
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" "$out"; then
    [ "$rc" -eq "$code" ] && fail "$what: '$text' not in the output"
    echo "--- sana-train $*"; cat "$out"
  fi
  if grep -qE 'terminate called|Aborted|Segmentation|what\(\):' "$out"; then fail "$what: looks like a crash"; fi
}

# --- Usage: an unknown command or option --------------------------------------------------
expect 2 "--config FILE is required" "an unknown subcommand" nosuch
expect 2 "unexpected argument 'nosuch'" "an unknown subcommand after a config" --config "$TINY" nosuch
expect 2 "not expected: --bogus" "an unknown launch option" launch --nproc-per-node 1 --bogus
expect 2 "not expected: --bogus" "an unknown index option" index --input x --output y --bogus
expect 2 "--config is required" "plan without a config" plan
expect 2 "usage error: '--' separates worker arguments" "'--' outside launch" plan --config "$TINY" -- x
expect 2 "usage error: plan: --rank 3" "a rank outside the world" plan --config "$TINY" --rank 3

# --- A config error: an unknown key, from every command that reads a config ---------------
unknown="config error: train.no_such_key: unknown key"
expect 2 "$unknown" "config error: train" --config "$TINY" --train.no_such_key=1
expect 2 "$unknown" "config error: --print-config" --config "$TINY" --train.no_such_key=1 --print-config
for command in plan check-data model preview; do
  expect 2 "$unknown" "config error: $command" "$command" --config "$TINY" --train.no_such_key=1
done
expect 2 "$unknown" "config error: check-dist" check-dist --train.no_such_key=1

# --- A data error: a metadata file that cannot be indexed ---------------------------------
bad=$SCRATCH/bad.jsonl
printf 'not json\n' > "$bad"
expect 2 "data error: $bad:1: not a JSON object" "data error: index" index --input "$bad" --output index.sidx
for command in plan check-data; do
  expect 2 "data error: $bad:1: not a JSON object" "data error: $command" "$command" --config "$TINY" "--data.data_dir=[$bad]"
done
expect 2 "data error: $bad:1: not a JSON object" "data error: training" \
  --config "$TINY" "--data.data_dir=[$bad]" --train.max_steps=1

# --- Checkpoints: a short run, then a damaged copy and a resume with another seed ---------
expect 0 "checkpoint: " "2 training steps" \
  --config "$TINY" "--data.data_dir=[$IMAGES]" --train.max_steps=2 --train.visualize=false
run=$CASE_DIR/output/sana_tiny_cpu
expect 0 "checksums: index.json and all " "inspect of an intact checkpoint" inspect "$run"
damaged=$SCRATCH/$TOKEN-damaged
cp -r "$run/checkpoints/step_00000002" "$damaged"
shard=$damaged/model-00001-of-00001.safetensors
printf 'XXXX' | dd of="$shard" bs=1 seek=$(($(stat -c %s "$shard") - 100)) conv=notrunc status=none
expect 1 "checkpoint error: '$damaged': model-00001-of-00001.safetensors is damaged: tensor " \
  "inspect of a damaged checkpoint" inspect "$damaged"
expect 1 "checkpoint error:" "inspect of a folder without a checkpoint" inspect "$SCRATCH"
expect 2 "config error: resume_from" "a resume whose checkpoint has another train.seed" \
  --config "$TINY" "--data.data_dir=[$IMAGES]" "--work_dir=$run" --train.seed=2 --resume_from=latest
expect 2 "report: no " "report of a folder without metrics" report "$SCRATCH"

assert_no_leftovers
finish
