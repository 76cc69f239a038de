#!/usr/bin/env bash
# The GPU speed measurement: the first command a borrowed GPU machine runs while speed work
# is open (docs/testing.md, "On a borrowed GPU machine"), before scripts/gpu_check.sh. One
# call that fits one loan: every command runs under an overall deadline (SANA_PERF_DEADLINE
# seconds, default 540), the table comes last on stdout, and into the output folder as
# Markdown and JSON (perf.{md,json}).
#   bash scripts/gpu_perf.sh [OUT_DIR]          (default output/gpu_perf)
#   bash scripts/gpu_perf.sh --rehearse [OUT]   the same flow on this machine's CPU: the tiny
#                                               preset, small pieces (default output/gpu_perf_rehearsal;
#                                               deadline 3600 s: a build from nothing here takes ~20 min)
# The flow:
#   1. sana-train and sana_torch_tests build alone in the background (scripts/gpu_common.sh:
#      the same folder and kit as gpu_check.sh, so the check after it builds nothing), while
#      the machine's PyTorch measures the pieces (scripts/perf/pieces.py): the matmul and copy
#      ceilings, cross-attention eager against SDPA, the 11200-channel depthwise convolution
#      with cuDNN's benchmark mode off and on;
#   2. with the binary: torch's AdamW per tensor, multi-tensor and fused over the model's own
#      parameter shapes (`sana-train model --json`), the fused kernels' tests ([kernels]), and
#      the micro-batch `sana-train model` suggests for the GPU's memory;
#   3. the sweep, SanaMS_1600M_P1_D20 on synthetic 1024 px features (scripts/make_feature_set.py),
#      bf16, about 8 steps each: micro-batch 64 and 32 with gradient checkpointing, 16 without,
#      32 with train.gc_step 2; then at the fastest of those AdamW against the config's CAME,
#      and model.kernels fused against aten (skip where the key is not there yet). A run that
#      runs out of device memory is "oom", not a failure;
#   4. one profiled step at the fastest setting (train.profile_steps): its top 20 ops; and 3
#      steps with train.cuda_sync_debug warn: how many times a step made the host wait for
#      the GPU, and where (the GPU only).
# Figures: samples/s over the last two thirds of the steps (wall clock between steps,
# metrics.jsonl), MFU against the GPU's dense bf16 peak (SANA_CHECK_PEAK_FLOPS or by name),
# the run's device memory (memory.json). Environment as gpu_check.sh's (TORCH_PREFIX,
# SANA_KIT, SANA_CHECK_BUILD_DIR, SANA_CHECK_JOBS, SANA_CHECK_PEAK_FLOPS) and SANA_PERF_DEADLINE.
# Exit: 0 every row ok, skipped or oom; 1 a row failed; 2 no GPU (outside --rehearse).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
allow_cpu=0
if [ "${1:-}" = --rehearse ]; then
  shift
  allow_cpu=1
  set -- "${1:-$root/output/gpu_perf_rehearsal}"
  # A build from nothing on a small CPU machine takes far longer than a GPU machine's.
  : "${SANA_PERF_DEADLINE:=3600}"
  # The project's venv plays the GPU machine's python3 (pip's torch).
  [ -x "$root/.venv/bin/python3" ] && export PATH=$root/.venv/bin:$PATH
fi
allow_cpu_hint="--rehearse"
out=$(mkdir -p "${1:-$root/output/gpu_perf}" && cd "${1:-$root/output/gpu_perf}" && pwd)
kit=${SANA_KIT:-$root/.kit}
cd "$root" || exit 1
perf_start=$(date +%s)
deadline_at=$(( perf_start + ${SANA_PERF_DEADLINE:-540} ))
say() { printf 'gpu_perf: %s\n' "$*"; }
py=python3
table_name=perf

rows=(build pieces optimizer kernels suggest mb64-gc mb32-gc mb16 mb32-gc2 adamw fused profile syncs)
declare -A result seconds figures detail
for r in "${rows[@]}"; do result[$r]=skip seconds[$r]=0 figures[$r]="" detail[$r]="not run"; done
failed=0
. "$root/scripts/gpu_common.sh"
oom() { result[$1]=oom detail[$1]=$2; say "$1: out of memory: $2"; write_table; }

# ---- 1. the build in the background, the pieces meanwhile -----------------------------------
build_start=$(date +%s)
timeout --kill-after=20 $(( deadline_at - build_start )) "${build_cmd[@]}" > "$out/build.log" 2>&1 &
build_pid=$!
if [ "$mode" = cuda ]; then small=() micro=16; else small=(--small) micro=2; fi
if run_logged pieces 240 pieces "$py" scripts/perf/pieces.py "$out/pieces.json" --micro "$micro" "${small[@]}"; then
  figures[pieces]=$(sed -n 's/^pieces: //p' "$out/pieces.log" | paste -sd';' | sed 's/;/; /g')
  ok pieces "$(json_get "$out/pieces.json" 'd["device"] + ", torch " + d["torch"]')"
else fail pieces "see $out/pieces.log"; fi
wait "$build_pid"
build_rc=$?
seconds[build]=$(( $(date +%s) - build_start ))
if [ "$build_rc" != 0 ]; then
  fail build "$(grep -m1 -E 'error|Error' "$out/build.log" | cut -c1-200); see $out/build.log"
  cat "$out/perf.md"; exit 1
fi
ok build "sana-train and sana_torch_tests in $build_dir"

# ---- The sweep's settings ---------------------------------------------------------------------
if [ "$mode" = cuda ]; then
  feats=$out/features_1024 steps=8 sizes=(64 32 16 32)
  feat_args=(--count 256 --latent-files 64 --text-files 16 --latent-channels 32 --latent-size 32 --tokens 300
             --dim 2304 --base-config "$root/configs/Sana_1600M_img1024.yaml")
  run_args=(--model.mixed_precision=bf16 --dist.device=cuda --dist.backend=nccl --train.num_workers=8)
else  # the rehearsal: the tiny preset on small synthetic features, fp32 on the CPU
  feats=$out/features_tiny steps=6 sizes=(8 4 2 4)
  feat_args=(--count 32 --latent-channels 4 --latent-size 8 --downsample 8 --tokens 8 --dim 16
             --base-config "$root/configs/sana_tiny_cpu.yaml")
  run_args=(--model.model=SanaMS_tiny_P2_D4 --vae.vae_type=dc-ae --vae.vae_latent_dim=4 --vae.vae_downsample_rate=8
            --text_encoder.caption_channels=16 --text_encoder.model_max_length=8 --data.image_size=64
            --model.image_size=64 --dist.device=cpu --dist.backend=gloo --train.num_workers=2)
fi
[ -f "$feats/train.yaml" ] || "$py" scripts/make_feature_set.py "$feats" "${feat_args[@]}" > "$out/features.log" 2>&1 ||
  { fail mb64-gc "scripts/make_feature_set.py failed: see $out/features.log"; cat "$out/perf.md"; exit 1; }
common=(--config "$feats/train.yaml" "${run_args[@]}" --model.multi_scale=false --train.visualize=false
        --train.save_model_steps=0 --train.save_model_epochs=0 --ckpt.async_save=false --ckpt.save_optimizer=false
        --train.num_epochs=100000 --train.log_interval=1 --dist.timeout_s=300)
model_json perf-model "${common[@]}" --train.micro_batch_size=1 --train.global_batch_size=1 --no-memory
flops=$(json_get "$out/perf-model.json" 'd["flops"][0]["train"]')

# ---- 2. the optimizer over the model's shapes, and the fused kernels' tests --------------------
if [ ! -s "$out/perf-model.json" ]; then fail optimizer "sana-train model failed: see $out/perf-model.err"
elif run_logged optimizer 90 optimizer "$py" scripts/perf/pieces.py "$out/optimizer.json" --only adamw \
       --shapes "$out/perf-model.json" "${small[@]}"; then
  figures[optimizer]=$(sed -n 's/^pieces: //p' "$out/optimizer.log")
  ok optimizer "torch's AdamW: one tensor at a time, foreach, fused"
else fail optimizer "see $out/optimizer.log"; fi
kernel_cases=$("$tests_bin" "[kernels]" --list-test-names-only 2> /dev/null | grep -c .)
if [ "${kernel_cases:-0}" -eq 0 ]; then skip kernels "no [kernels] test cases in $tests_bin"
elif [ "$mode" != cuda ]; then skip kernels "$kernel_cases [kernels] cases need a GPU"
elif run_logged kernels 120 kernels "$tests_bin" "[kernels]"; then
  ok kernels "$(grep -E 'All tests passed|test cases' "$out/kernels.log" | tail -n 1)"
else fail kernels "see $out/kernels.log"; fi

# ---- what `sana-train model` suggests for this device (the sweep then measures it) ------------
suggest_args=()
[ "$mode" = cuda ] || suggest_args=(--device-memory 4)  # the rehearsal: no GPU to read it from
suggestion() {  # MODEL_JSON: each setting's largest micro-batch, and the pick
  "$py" - "$1" <<'PY' 2> /dev/null
import json, sys
s = json.load(open(sys.argv[1]))["micro_batch_suggestion"]
name = lambda c: "no checkpointing" if c["gc_step"] == 0 else f"gc_step {c['gc_step']}"
print("; ".join(f"{name(c)} up to {c['micro_batch']}" for c in s["largest"])
      + f"; pick micro-batch {s['pick']['micro_batch']}, {name(s['pick'])}")
PY
}
if run_logged suggest 120 suggest "$bin" model "${common[@]}" --train.micro_batch_size=1 --train.global_batch_size=64 \
     --json "${suggest_args[@]}" && sed -n '/^{/,$p' "$out/suggest.log" > "$out/suggest.json" &&
   line=$(suggestion "$out/suggest.json"); then
  figures[suggest]=$line
  ok suggest "sana-train model on this device (estimate at fp32: an upper bound under bf16)"
else fail suggest "see $out/suggest.log"; fi

# ---- 3. the sweep -----------------------------------------------------------------------------
# Runs ROW ARGS...: $steps steps into $out/ROW; the row's figures "samples/s MFU memory".
declare -A sps_of
sweep() {
  local row=$1 mb=$2
  shift 2
  rm -rf "${out:?}/$row"
  if run_logged "$row" 180 "$row" "$bin" launch --nproc-per-node 1 -- "${common[@]}" "--train.max_steps=$steps" \
       "--train.micro_batch_size=$mb" "--train.global_batch_size=$mb" "$@" "--work_dir=$out/$row"; then
    local sps mfu
    read -r sps mfu < <(throughput "$out/$row/metrics.jsonl" "$mb" "$flops" 1)
    sps_of[$row]=$sps
    figures[$row]="$sps samples/s, MFU $mfu, $(peak_memory "$out/$row/memory.json")$(device_shares "$out/$row/metrics.jsonl")"
    ok "$row" "micro-batch $mb $*"
  elif grep -qiE 'out of memory|OutOfMemory' "$out/$row.log"; then oom "$row" "micro-batch $mb $*"
  elif grep -q "unknown key" "$out/$row.log"; then skip "$row" "$(grep -m1 'unknown key' "$out/$row.log" | cut -c1-160)"
  else fail "$row" "micro-batch $mb $*: see $out/$row.log"; fi
}
device_shares() {  # METRICS: the later two thirds' device phases (metrics.jsonl's device_time), "" without
  "$py" - "$1" <<'PY' 2> /dev/null || true
import json, sys
rows = [json.loads(l)["device_time"] for l in open(sys.argv[1]) if '"device_time"' in l]
rows = rows[len(rows) // 3:]
total = sum(r["total"] for r in rows)
if total > 0:
    names = (("data", "data"), ("forward_backward", "fwd+bwd"), ("allreduce", "all-reduce"), ("optimizer", "optimizer"),
             ("other", "other"))
    print("; on the device: " + ", ".join(f"{n} {100 * sum(r[k] for r in rows) / total:.0f}%" for k, n in names))
PY
}
peak_memory() {  # MEMORY_JSON: rank 0's device memory (weights, gradients, optimizer, EMA, activations)
  "$py" - "$1" <<'PY' 2> /dev/null || echo "memory n/a"
import json, sys
r = json.load(open(sys.argv[1]))["ranks"][0]
keys = ("parameters", "gradients", "optimizer", "ema", "gathered", "working", "activations_peak")
print(f"{sum(r.get(k, 0) for k in keys) / 2**30:.2f} GiB of state and activations")
PY
}
# Each sweep setting once: micro-batch, then its checkpointing.
declare -A setting=([mb64-gc]="${sizes[0]} --train.grad_checkpointing=true"
                    [mb32-gc]="${sizes[1]} --train.grad_checkpointing=true"
                    [mb16]="${sizes[2]} --train.grad_checkpointing=false"
                    [mb32-gc2]="${sizes[3]} --train.grad_checkpointing=true --train.gc_step=2")
for r in mb64-gc mb32-gc mb16 mb32-gc2; do
  read -r -a args <<< "${setting[$r]}"
  sweep "$r" "${args[@]}"
done
# The fastest of the four, by samples/s.
best="" best_sps=0
for r in mb64-gc mb32-gc mb16 mb32-gc2; do
  [ -n "${sps_of[$r]:-}" ] && "$py" -c "import sys; sys.exit(0 if ${sps_of[$r]} > $best_sps else 1)" &&
    best=$r best_sps=${sps_of[$r]}
done
if [ -z "$best" ]; then
  for r in adamw fused profile syncs; do skip "$r" "no sweep run finished"; done
else
  read -r -a at_best <<< "${setting[$best]}"
  sweep adamw "${at_best[@]}" --train.optimizer.type=AdamW
  sweep fused "${at_best[@]}" --model.kernels=fused
  # ---- 4. one profiled step at the fastest setting ---------------------------------------------
  steps_kept=$steps steps=4
  sweep profile "${at_best[@]}" "--train.profile_steps=[3]"
  steps=$steps_kept
  tsv=$out/profile/profile/step_3.ops.tsv
  if [ "${result[profile]}" = ok ] && [ -f "$tsv" ]; then
    figures[profile]="step 3 of $best, by $( [ "$mode" = cuda ] && echo device || echo host) time: $(awk -F'\t' \
      'NR > 1 && NR <= 21 { printf "%s%s %.1f%%", (NR > 2 ? ", " : ""), $1, 100 * $5 }' "$tsv")"
    write_table
  elif [ "${result[profile]}" = ok ]; then fail profile "no $tsv"; fi
  # ---- the host waits left in a step (c10's sync-debug warnings) --------------------------------
  if [ "$mode" != cuda ]; then skip syncs "train.cuda_sync_debug is for CUDA"
  else
    steps=3
    sweep syncs "${at_best[@]}" --train.cuda_sync_debug=warn
    steps=$steps_kept
    if [ "${result[syncs]}" = ok ]; then
      waits=$(grep -c "the host waited for the GPU" "$out/syncs.log")
      # Each wait's first frame in sana-train itself, counted, named by addr2line where it is.
      sites=$(awk '/the host waited for the GPU/ { want = 1; next }
                   want && /sana-train\)/ { if (match($0, /\+ 0x[0-9a-f]+/)) print substr($0, RSTART + 2, RLENGTH - 2); want = 0 }' \
                "$out/syncs.log" | sort | uniq -c | sort -rn | head -n 5 |
              while read -r n off; do
                name=$(command -v addr2line > /dev/null && addr2line -f -C -e "$bin" "$off" 2> /dev/null | head -n 1)
                printf '%sx %s; ' "$n" "${name:-$off}"
              done)
      figures[syncs]="$waits host waits in 3 steps and the start-up; most from: ${sites:-none in sana-train}"
      write_table
    fi
  fi
fi

# ---- The table, last ---------------------------------------------------------------------------
write_table
say "done in $(( $(date +%s) - perf_start )) s (deadline ${SANA_PERF_DEADLINE:-540} s); fastest: ${best:-none}"
echo
echo "$environment"
cat "$out/perf.md"
[ -n "$peak" ] && echo "MFU: samples/s x training FLOPs per sample (sana-train model) / $peak FLOP/s"
exit "$failed"
