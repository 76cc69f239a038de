#!/usr/bin/env bash
# The README's "Distil SANA-Sprint": every command of its block (between
# <!-- sprint-walkthrough:begin --> and <!-- sprint-walkthrough:end -->) runs as written, in
# order, with `sana-train` on PATH, upstream's two Sprint YAMLs as the bases of a tiny stand-in
# my_teacher.yaml and my_sprint.yaml (the tiny presets, the small TorchScript text encoder,
# pixels). The download is replaced by the tiny flow model without q/k norms (as the release
# has none) at its initial weights, exported as a diffusers pipeline folder. Stage 1 runs to
# its end; stage 2's first launch is stopped with Ctrl-C once it has taken 10 steps, and the
# resume must pick up there on 1 process and reach max_steps. Then: the teacher kept the
# download's weights where it had them and added q/k norms; stage 2 read the teacher and
# started from it; both phases ran, every step once; the previews are there; the export is a
# diffusers Sprint transformer (guidance embedder, normT's timestep_scale) holding the run's
# student.
. "$(dirname "$0")/../dist/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
upstream=$root/tests/configs/upstream/sana_sprint_1024ms
as_a_user
# The stand-ins: upstream's YAMLs with the tiny presets, pixels, the stand-in text encoder and
# short runs; everything the README's text asks a user to set is set as it says.
tiny=(
  "vae: {vae_type: none, vae_latent_dim: 3, vae_downsample_rate: 1, scale_factor: 1.0}"
  "text_encoder: {text_encoder_name: torchscript, text_encoder_path: exports/text.pt, caption_channels: 8, model_max_length: 6, chi_prompt: []}"
  "dist: {timeout_s: 60}")
{
  echo "base: $upstream/SanaSprint_1600M_img1024_bf16_normT_allqknorm_teacher_ft.yaml"
  echo "work_dir: output/my_teacher"
  echo "data: {data_dir: [my_images], image_size: 32, aspect_ratio_type: generated, bucket_step: 8, load_vae_feat: false, type: SanaImgDataset}"
  echo "model: {model: SanaMS_tiny_P2_D4, image_size: 32, mixed_precision: fp32, aspect_ratio_type: generated,"
  echo "        load_from: output/pretrained_models/Sana_1600M_1024px_diffusers, load_strict: false}"
  printf '%s\n' "${tiny[@]}"
  echo "train: {max_steps: 30, train_batch_size: 4, num_workers: 1, log_interval: 5, save_model_steps: 1000,"
  echo "        save_model_epochs: 0, visualize: false, grad_checkpointing: false, optimizer: {lr: 2.0e-3}, lr_schedule_args: {num_warmup_steps: 5}}"
} > my_teacher.yaml
{
  echo "base: $upstream/SanaSprint_1600M_1024px_allqknorm_bf16_scm_ladd.yaml"
  echo "work_dir: output/my_sprint"
  echo "data: {data_dir: [my_images], image_size: 32, aspect_ratio_type: generated, bucket_step: 8, load_vae_feat: false, type: SanaImgDataset}"
  echo "model: {model: SanaMSCM_tiny_P2_D4, teacher: SanaMS_tiny_P2_D4, image_size: 32, mixed_precision: fp32,"
  echo "        aspect_ratio_type: generated, head_block_ids: [1, 3], teacher_model: output/my_teacher/model.safetensors,"
  echo "        load_from: output/my_teacher/model.safetensors, load_strict: false}"
  printf '%s\n' "${tiny[@]}"
  echo "train: {max_steps: 20, train_batch_size: 4, num_workers: 1, log_interval: 5, save_model_steps: 1000,"
  echo "        save_model_epochs: 0, visualize: false, grad_checkpointing: false, tangent_warmup_steps: 10,"
  echo "        optimizer: {lr: 1.0e-4}, optimizer_D: {lr: 1.0e-4}, lr_schedule_args: {num_warmup_steps: 5}}"
} > my_sprint.yaml

readme_commands sprint-walkthrough 7

i=0
while IFS= read -r cmd <&3; do
  i=$((i + 1))
  case "$cmd" in
    huggingface-cli\ download\ *)
      download_dir=$(echo "$cmd" | sed -E 's/.*--local-dir +([^ ]+).*/\1/')
      timeout 120 sana-train export --config my_teacher.yaml --model.qk_norm=false --model.cross_norm=false \
        --model.load_from= --format diffusers --out "$download_dir/transformer" > "$SCRATCH/cmd$i.log" 2>&1
      assert_code $? 0 "[$i] the download's stand-in: the tiny flow model without q/k norms at $download_dir"
      ;;
    *my_teacher.yaml*launch*|*launch*my_teacher.yaml*)
      timeout 300 bash -c "$cmd" > "$SCRATCH/cmd$i.log" 2>&1
      assert_code $? 0 "[$i] stage 1 to its end: $cmd"
      ;;
    *sana-train\ preview\ *)
      timeout 300 bash -c "$cmd" > "$SCRATCH/cmd$i.log" 2>&1
      assert_code $? 0 "[$i] $cmd"
      ;;
    *)
      walkthrough_command "$i" "$cmd" output/my_sprint/metrics.jsonl
      ;;
  esac
done 3< commands.txt

assert_contains cmd2.log "q_norm" "stage 1 said which weights the download lacked (the q/k norms)"
assert_contains cmd3.log "teacher" "sana-train model counts the teacher"
assert_contains cmd3.log "discriminator heads" "and the discriminator heads"
assert_contains cmd3.log "stage 2's generator step" "and the activations of a generator step"
assert_contains cmd5.log "resumed from" "the 1-process run resumed"
assert_contains cmd5.log "(saved on 2 processes)" "from the 2-process run"
if "$SANA_PYTHON" - output/my_sprint/metrics.jsonl > check.txt 2>&1 <<'PY'; then
import json, sys
steps = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    if "step" in m:
        steps.setdefault(m["step"], []).append(m)
once = sorted(steps) == list(range(1, 21)) and all(len(v) == 1 for v in steps.values())
g = [s for s, v in steps.items() if "loss_G" in v[0]]
d = [s for s, v in steps.items() if "loss_D" in v[0]]
print(f"steps {min(steps)}..{max(steps)}, {'each once' if once else 'NOT each once'}; "
      f"{len(g)} generator steps (odd), {len(d)} discriminator steps (even)")
sys.exit(0 if once and g == list(range(1, 21, 2)) and d == list(range(2, 21, 2)) else 1)
PY
  pass "$(cat check.txt)"
else
  fail "metrics.jsonl: $(cat check.txt)"
fi
for n in 1 2 4; do
  [ -f "output/my_sprint/steps$n/preview_32x32.png" ] && pass "the student's $n-step previews" ||
    fail "no $n-step previews in output/my_sprint/steps$n: $(ls output/my_sprint/steps$n 2>&1)"
done
# The download in upstream's names (what stage 1 read), for the check below.
timeout 120 sana-train export --config my_teacher.yaml --model.qk_norm=false --model.cross_norm=false --model.load_from= \
  --from "$download_dir" --format upstream --out download.pth > "$SCRATCH/download.log" 2>&1
assert_code $? 0 "the download exported in upstream's names"
if "$SANA_PYTHON" - download.pth output/my_teacher/model.safetensors output/my_sprint \
     "$root/tests/reference" > check.txt 2>&1 <<'PY'; then
import glob, json, sys
import torch
sys.path.insert(0, sys.argv[4])
from sana_reference import read_safetensors as read  # (tensors, metadata)
def folder(path):
    out = {}
    for f in glob.glob(path + "/*.safetensors"):
        out.update(read(f)[0])
    return out
download = torch.load(sys.argv[1], map_location="cpu")["state_dict"]
(teacher, _), (student, _) = read(sys.argv[2]), read(sys.argv[3] + "/model.safetensors")
path = sys.argv[3] + "/transformer"
config, exported = json.load(open(path + "/config.json")), folder(path)
norms = [k for k in teacher if ".q_norm." in k or ".k_norm." in k]
# Stage 1 trained the download's weights (30 steps at lr 2e-3) and added the q/k norms.
moved = sum(not torch.equal(v, teacher[k]) for k, v in download.items() if k in teacher)
pairs = [("time_embed.guidance_embedder.linear_1.weight", "cfg_embedder.mlp.0.weight"),
         ("time_embed.guidance_embedder.linear_2.weight", "cfg_embedder.mlp.2.weight")]
same = all(a in exported and b in student and torch.equal(exported[a], student[b]) for a, b in pairs)
ok = (norms and not any(k in download for k in norms) and moved > 0 and same
      and config.get("guidance_embeds") is True and abs(config.get("timestep_scale", 0) - 1e-3) < 1e-12)
print(f"the teacher: {len(norms)} q/k norm tensors added, {moved} of the download's tensors trained; the export: "
      f"guidance_embeds {config.get('guidance_embeds')}, timestep_scale {config.get('timestep_scale')}, its "
      f"guidance embedder {'the' if same else 'NOT the'} student's")
sys.exit(0 if ok else 1)
PY
  pass "$(cat check.txt)"
else
  fail "the teacher or the export: $(cat check.txt)"
fi
assert_no_leftovers
finish
