#!/usr/bin/env bash
# The README's "Fine-tune released Sana weights with LoRA": every command of its block
# (between <!-- lora-walkthrough:begin --> and <!-- lora-walkthrough:end -->) runs as written,
# in order, with `sana-train` on PATH and a tiny stand-in my_lora.yaml (the tiny preset with
# captions from the small TorchScript text encoder, LoRA on the README's targets). The
# download is replaced by a tiny caption model's initial weights exported as a diffusers
# pipeline folder (`sana-train export --format diffusers` to its transformer/). The training
# launch is stopped with Ctrl-C once it has taken 10 steps; the resume must pick up there on
# 1 process and reach max_steps. Then, in torch: pytorch_lora_weights.safetensors fits the diffusers
# transformer module by module as PEFT needs (lora_A [r, in], lora_B [out, r]) with its
# settings in the metadata, and the merged export's weights are the base's plus
# B A alpha / r exactly where adapted and the base's elsewhere; and diffusers with peft load
# the trained and the EMA adapters cleanly, the adapted model computing what the merged export
# computes (tests/apps/peft_lora_check.py).
. "$(dirname "$0")/../dist/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
as_a_user
cat > my_lora.yaml <<EOF
base: $root/configs/sana_tiny_cpu.yaml
work_dir: output/my_lora
data: {data_dir: [my_images], random_flip: false}
model: {load_from: output/pretrained_models/Sana_1600M_1024px_diffusers}
text_encoder: {text_encoder_name: torchscript, text_encoder_path: exports/text.pt, caption_channels: 8, model_max_length: 6}
train: {max_steps: 30, log_interval: 5, save_model_steps: 1000, visualize: false, ema_update: true, optimizer: {lr: 3.0e-3},
        lora: {rank: 4, alpha: 8, target_modules: [to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]}}
dist: {timeout_s: 60}
EOF

readme_commands lora-walkthrough 5

walkthrough_commands output/my_lora/metrics.jsonl my_lora.yaml
base=$download_dir/transformer

assert_contains cmd2.log "trainable parameters (the adapters" "sana-train model tells the adapters' share"
assert_contains cmd3.log "model.load_from:" "the run loaded the diffusers folder"
assert_contains cmd4.log "resumed from" "the 1-process run resumed"
assert_contains cmd4.log "(saved on 2 processes)" "from the 2-process run"
assert_contains cmd4.log "the base weights are unchanged" "the base did not move"
steps=$(grep -o '"step":[0-9]*' output/my_lora/metrics.jsonl | sort -u | wc -l)
if [ "$steps" -eq 30 ]; then pass "every step 1..30 is in metrics.jsonl once"; else fail "$steps distinct steps"; fi
if "$SANA_PYTHON" - "${base:-none}" output/my_lora/pytorch_lora_weights.safetensors output/my_lora/merged "$root/tests/reference" \
     > check.txt 2>&1 <<'PY'; then
import json, sys
import torch
sys.path.insert(0, sys.argv[4])
from sana_reference import read_safetensors as read  # (tensors, metadata)
base, _ = read(sys.argv[1] + "/diffusion_pytorch_model.safetensors")
lora, meta = read(sys.argv[2])
merged, _ = read(sys.argv[3] + "/diffusion_pytorch_model.safetensors")
config = json.loads(meta["lora_adapter_metadata"])
r, alpha = config["transformer.r"], config["transformer.lora_alpha"]
bad, modules, worst = [], 0, 0.0
adapted = set()
for key in sorted(lora):
    if not key.endswith(".lora_A.weight"):
        continue
    module = key[len("transformer."):-len(".lora_A.weight")]
    adapted.add(module + ".weight")
    a, b = lora[key], lora[key.replace("lora_A", "lora_B")]
    w = base.get(module + ".weight")
    if w is None or a.shape[0] != r or a.shape[1:] != w.shape[1:] or b.shape[0] != w.shape[0] or b.shape[1] != r:
        bad.append(f"{module}: A {list(a.shape)}, B {list(b.shape)}, weight {None if w is None else list(w.shape)}")
        continue
    modules += 1
    delta = (b.flatten(1).double() @ a.flatten(1).double()).reshape(w.shape) * alpha / r
    want = w.double() + delta
    worst = max(worst, ((merged[module + ".weight"].double() - want).abs().max() / want.abs().max()).item())
untouched = [k for k in base if k not in adapted]
same = sorted(base) == sorted(merged) and all(torch.equal(base[k], merged[k]) for k in untouched)
print(f"{modules} adapters fit the diffusers transformer (r {r}, lora_alpha {alpha}); merged = base + B A alpha/r "
      f"within {worst:.2g}; the {len(untouched)} other tensors {'unchanged' if same else 'CHANGED'}")
for x in bad[:5]:
    print(x)
sys.exit(0 if not bad and modules == 40 and worst <= 1e-6 and same and r == 4 and alpha == 8 else 1)
PY
  pass "$(cat check.txt)"
else
  fail "the LoRA file or the merged export: $(cat check.txt)"
fi
# diffusers and peft themselves: SanaPipeline's LoRA loading takes both adapter files (the
# trained and the EMA ones) with no missing or unexpected key, and the adapted transformer
# computes what the merged export computes.
ema=()
[ -f output/my_lora/ema.safetensors ] && ema=(output/my_lora/ema.safetensors)
if timeout 300 "$SANA_PYTHON" "$root/tests/apps/peft_lora_check.py" "${base:-none}" output/my_lora/merged \
     output/my_lora/pytorch_lora_weights.safetensors "${ema[@]}" > peft.txt 2>&1; then
  pass "$(grep -v -i "kernels" peft.txt | tr '\n' ' ')"
else
  fail "diffusers/peft on the LoRA files: $(tail -20 peft.txt)"
fi
[ "${#ema[@]}" -eq 1 ] && pass "the run wrote the EMA adapters" || fail "no output/my_lora/ema.safetensors"
assert_no_leftovers
finish
