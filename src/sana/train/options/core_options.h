// The one place that maps the run's config (config::Config, shaped like the YAML) onto the
// options each component takes. data/, model/, diffusion/ and distributed/ never see the
// config (scripts/check_layout.sh holds them to it): a component is built and tested from
// its own options, and a key that moves in the YAML moves here alone. No torch.
#pragma once

#include "sana/config/config.h"
#include "sana/data/dataset.h"
#include "sana/data/loader_options.h"
#include "sana/data/sample_cache.h"
#include "sana/diffusion/options.h"
#include "sana/distributed/options.h"
#include "sana/parallel/options.h"
#include "sana/train/optim/lr_curve.h"
#include "sana/train/test_hooks.h"
#include "sana/model/encoder_options.h"
#include "sana/model/growth_options.h"
#include "sana/model/lora_options.h"
#include "sana/model/spec.h"
#include "sana/model/storage_dtype.h"

namespace sana::train {

// data.image_size and multi_scale_sizes, aspect_ratio_type, bucket_step, multi_scale_rule,
// model.multi_scale.
data::BucketOptions bucket_options_for(const config::Config& cfg);
// train.global_batch_size and train.batch_tokens.
data::BatchSpec batch_spec_for(const config::Config& cfg);
// data.data_dir (indexed under work_dir/index), the buckets, the batch, train.seed,
// data.tail, data.sampler and data.max_untrained_fraction.
data::DatasetOptions dataset_options_for(const config::Config& cfg);
// data.interpolation, data.jpeg_reduced_decode, data.exif_orientation.
data::DecodeOptions decode_options_for(const config::Config& cfg);
// Workers, prefetch, decoding and features; rank, world size, micro-batch, flips, pinning
// and a ControlNet's control maps (train::control_maps_for) are the caller's.
data::LoaderOptions loader_options_for(const config::Config& cfg);
// The controlnet section for the loader, without the HED network (train::control_maps_for
// adds it); with data.load_vae_feat, the control latents prepare-features wrote. Throws
// UsageError (exit 2) for HED maps without controlnet.hed_model.
data::ControlMapOptions control_map_options_for(const config::Config& cfg);
// The trainer's gradient engine: gradients summed, not averaged (each micro-batch's loss
// is already weighted by its share of the global batch); ddp.bucket_cap_mb; exact with
// train.deterministic.
parallel::ReducerOptions reducer_options_for(const config::Config& cfg);
// data.caption_selection_type and its keys.
data::CaptionChoice caption_choice_for(const config::Config& cfg);
// data.cache_dir (empty: work_dir/sample_cache) and the decode settings.
data::DiskCacheOptions disk_cache_options_for(const config::Config& cfg);

// The spec the config asks for: the preset's shape (model.model), channels from the VAE or
// pixel space, conditioning from the text encoder / data.load_text_feat / model.num_classes.
// Throws model::SpecError naming the key when the combination cannot work.
model::ModelSpec model_spec_for(const config::Config& cfg);
// SANA-Sprint stage 2 (a SanaMSCM preset, docs/sprint.md): the teacher's spec (model.teacher's
// preset, else model.model's architecture, with the student's other keys and neither
// guidance embedding nor log-variance head), and the blocks its discriminator heads read
// (model.head_block_ids; []: upstream's default by model.ladd_multi_scale).
model::ModelSpec teacher_spec_for(const config::Config& cfg);
std::vector<int64_t> head_blocks_for(const config::Config& cfg);
model::VaeOptions vae_options_for(const config::Config& cfg);
model::TextEncoderOptions text_encoder_options_for(const config::Config& cfg);
// The model_growth section and train.seed (source "" when there is no growth).
model::GrowthOptions growth_options_for(const config::Config& cfg);
// train.lora and train.seed (the adapters' initial values).
model::LoraOptions lora_options_for(const config::Config& cfg);
// train.frozen_base_dtype.
model::StorageDtype frozen_dtype_for(const config::TrainConfig& t);

diffusion::TimestepOptions timestep_options_for(const config::Config& cfg);

// train.optimizer.lr, lr_schedule and its args, auto_lr, global_batch_size.
LrScheduleOptions lr_schedule_options_for(const config::TrainConfig& t);

// train.zero_stage.
parallel::ZeroOptions zero_options_for(const config::Config& cfg);
// dist.*; `hooks`: the tests' stand-in CUDA devices (TestHooks::cuda_devices), none in production.
dist::RuntimeOptions runtime_options_for(const config::Config& cfg, const TestHooks& hooks);

}  // namespace sana::train
