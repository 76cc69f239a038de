# Sourced by the tests and benchmarks that look at bucket images through
# `sana-train check-data` (tests/apps/pil_pixels.sh, tests/apps/upstream_captions.sh,
# scripts/bench/reduced_decode_psnr.sh).

# pixel_config WORK_DIR DATA_DIR SIZE [DATA_YAML [WORKERS]]: prints a pixel-space config:
# the tiny preset at base size SIZE with upstream's table for it, fp32, no VAE or text
# encoder, one sample per step; DATA_YAML: more data keys (lines indented by two).
pixel_config() {
  cat <<EOF
work_dir: $1
data:
  data_dir: [$2]
  image_size: $3
  aspect_ratio_type: ASPECT_RATIO_$3
${4:-}
model:
  model: SanaMS_tiny_P2_D4
  image_size: $3
  mixed_precision: fp32
vae:
  vae_type: none
text_encoder:
  text_encoder_name: none
train:
  num_workers: ${5:-2}
  global_batch_size: 1
EOF
}
