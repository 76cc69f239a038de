#!/usr/bin/env bash
# The README's "Train Sana at 512 px on your own images": every command of its block
# (between <!-- walkthrough:begin --> and <!-- walkthrough:end -->) runs as written, in
# order, with `sana-train` on PATH and a tiny stand-in my_sana.yaml (the README's keys, the
# tiny preset at 32 px). No TorchScript and no Python at run time: both encoders are read from
# Hugging Face folders in the HF cache under upstream's names, as `huggingface-cli download`
# leaves them (a small random Gemma-2 written by transformers, tokenizer.model included, and a
# small random AutoencoderDC written by diffusers; hf_encoders). The training launch is stopped as
# a user would, with Ctrl-C (SIGINT to its process group) once it has taken 10 steps; the
# resume must pick up there on 2 processes and reach max_steps. `tensorboard` is not
# installable here: its line is checked by reading the event files instead.
. "$(dirname "$0")/../dist/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
as_a_user hub
cat > my_sana.yaml <<EOF
base: $root/configs/sana_tiny_cpu.yaml
work_dir: output/my_sana
data:
  data_dir: [my_images]
  random_flip: false
vae: {vae_type: dc-ae, vae_pretrained: mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers, vae_latent_dim: 4, vae_downsample_rate: 4}
text_encoder: {text_encoder_name: gemma-2-2b-it, caption_channels: 32, model_max_length: 6}
train: {max_steps: 40, log_interval: 5, save_model_steps: 1000, eval_sampling_steps: 20, preview_steps: 2,
        validation_prompts: [a red flower, a stormy sea]}
dist: {timeout_s: 60}
EOF

readme_commands walkthrough 6

i=0
while IFS= read -r cmd <&3; do
  i=$((i + 1))
  log=$SCRATCH/cmd$i.log
  case "$cmd" in
    tensorboard\ *)
      dir=$(echo "$cmd" | sed -E 's/.*--logdir +([^ ]+).*/\1/')
      if ls "$dir"/events.out.tfevents.* > /dev/null 2>&1; then pass "[$i] $cmd: event files are there"; else fail "[$i] no event files in $dir"; fi
      ;;
    *--resume_from*|*prepare-features*|*check-data*|*plan*|*--print-config*)
      timeout 300 bash -c "$cmd" > "$log" 2>&1
      assert_code $? 0 "[$i] $cmd"
      ;;
    *launch*)
      # The training run: Ctrl-C once 10 steps are done.
      stop_at_step "$cmd" output/my_sana/metrics.jsonl 10 "$log" "[$i] $cmd"
      stopped_log=$log
      ;;
    *)
      fail "[$i] a command this test does not know how to check: $cmd"
      ;;
  esac
done 3< commands.txt

# What the user would look at along the way.
assert_contains cmd2.log "prepare-features: 30 samples: 30 written now, 0 there before, 0 bad" "prepare-features wrote 30 samples"
assert_contains cmd3.log "check-data: ok" "check-data read every feature file"
# The encoders came from the Hugging Face cache's snapshots, natively; no export exists.
assert_contains cmd2.log "VAE: DC-AE (diffusers' AutoencoderDC folder) from $SCRATCH/hf/hub/models--mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers/snapshots/$HF_REV" \
  "prepare-features read the DC-AE from the cache"
assert_contains cmd2.log "text encoder: Gemma-2 (transformers' folder) from $SCRATCH/hf/hub/models--Efficient-Large-Model--gemma-2-2b-it/snapshots/$HF_REV" \
  "prepare-features read Gemma-2 from the cache"
exports=$(find "$SCRATCH" -name '*.pt' -o -name '*.pth' | head -3)
if [ -z "$exports" ]; then pass "no TorchScript file anywhere"; else fail "TorchScript files: $exports"; fi
assert_contains "${stopped_log:-/dev/null}" "stop requested (SIGINT/SIGTERM)" "Ctrl-C stopped the run"
if ls output/my_sana/checkpoints/step_* > /dev/null 2>&1; then pass "the stopped run saved $(ls -d output/my_sana/checkpoints/step_* | xargs -n1 basename | tr '\n' ' ')"; else fail "no checkpoint after Ctrl-C"; fi
last=$(grep -o '"step":[0-9]*' output/my_sana/metrics.jsonl | tail -1 | grep -o '[0-9]*$')
resume_log=cmd$n.log  # the block ends with the resume
assert_contains "$resume_log" "resumed from" "the last command resumed"
assert_contains "$resume_log" "(saved on 4 processes)" "from the 4-process run"
if [ "$last" = 40 ]; then pass "training reached max_steps 40 after the resume"; else fail "last step $last"; fi
steps=$(grep -o '"step":[0-9]*' output/my_sana/metrics.jsonl | sort -u | wc -l)
if [ "$steps" -eq 40 ]; then pass "every step 1..40 is in metrics.jsonl once"; else fail "$steps distinct steps"; fi
assert_no_leftovers
finish
