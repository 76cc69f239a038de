// `sana-train prepare-features`: the config's TorchScript VAE and text encoder run once
// over the dataset, on every rank of a launch (rank r takes the samples whose id is r
// modulo the world size), and their outputs are kept in a folder that training reads with
// data.load_vae_feat / data.load_text_feat (docs/features.md):
//   <out>/features.json       the settings the features were made with (checked on a rerun)
//   <out>/latents/NNN/ID.npy   (C, h/f, w/f) of the sample's bucket, scaled as training scales
//   <out>/text/NNN/ID.npz      caption_feature (1, L, D), attention_mask (1, L), upstream's layout
//   <out>/null_embed.safetensors  the empty prompt's features (upstream's uncond_prompt_embeds)
//   <out>/meta.jsonl           one row per sample with features: image path, caption, size,
//                              latent and text_feat paths; written last, by rank 0
//   <out>/train.yaml           the config (as `base:`) switched to these features
// Every file is written under a temporary name and renamed: a killed run leaves whole
// files only, and a rerun skips every sample whose files exist. Bad images are counted by
// reason and left out of meta.jsonl.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sana/config/config.h"
#include "sana/distributed/launch_env.h"
#include "sana/train/test_hooks.h"

namespace sana::train {

struct PrepareOptions {
  std::string out;         // the folder; "" = work_dir/features
  int64_t batch_size = 8;  // samples per encoder call
  std::string config_file;             // the --config file, the base of <out>/train.yaml
  std::vector<std::string> overrides;  // command-line overrides (noted in train.yaml)
};

struct PrepareResult {
  int64_t samples = 0;   // in the dataset
  int64_t written = 0;   // samples whose features this run wrote (all ranks)
  int64_t existing = 0;  // samples whose features were there before (all ranks)
  int64_t bad = 0;       // samples left out (all ranks)
  std::string out, meta;  // the folder and its meta.jsonl
  bool latents = false, text = false;
  std::string null_embed;  // "" without a text encoder
  std::string train_config;  // <out>/train.yaml
};

// Runs on every rank of the launch; rank 0's result holds every rank's counts. Throws
// UsageError for a config that names no encoder or a folder made with other settings.
// `hooks`: the tests' fault injection (off in production: TestHooks{}).
PrepareResult prepare_features(const config::Config& cfg, const dist::LaunchEnv& env, const PrepareOptions& opts,
                               const TestHooks& hooks);

}  // namespace sana::train
