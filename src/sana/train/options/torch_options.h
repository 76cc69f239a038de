// The torch side of train/options/core_options.h: the config (config::Config) mapped onto the
// options each training part takes (checkpointer, batching, shared dataset, sample cache).
// With core_options.h, the one place that reads the config for the parts; the parts
// never include config/ (build.layout holds them to it).
#pragma once

#include <optional>

#include "sana/config/config.h"
#include "sana/model/lora_options.h"
#include "sana/train/input/batching.h"
#include "sana/train/checkpoint/checkpointer.h"
#include "sana/train/elastic/continuation.h"
#include "sana/train/input/class_images.h"
#include "sana/train/input/data_cache.h"
#include "sana/train/optim/ema.h"
#include "sana/train/trainable/initial_model.h"
#include "sana/train/optim/optimizer.h"
#include "sana/train/previews/previews.h"
#include "sana/train/report/memory_estimate.h"
#include "sana/train/report/metrics.h"
#include "sana/train/checkpoint/resume.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/input/shared_dataset.h"
#include "sana/train/sprint/objective.h"
#include "sana/train/sprint/sprint_step.h"
#include "sana/train/step/train_step.h"
#include "sana/train/test_hooks.h"

namespace sana::train {

// train.save_model_steps / save_model_epochs, ckpt.keep_last_n / async_save, work_dir;
// `before_stage` is the fault injection's (TestHooks::checkpoint_stage_delay), empty in
// production runs.
CheckpointOptions checkpoint_options_for(const config::Config& cfg, ckpt::StageHook before_stage = {});
ContinuationOptions continuation_options_for(const config::Config& cfg);
// train.global_batch_size / batch_tokens, micro_batch_size, deterministic.
BatchOptions batch_options_for(const config::Config& cfg);
// The dataset's options, the model's cell and how captions come (data.load_text_feat,
// data.caption_selection_type).
SharedDatasetOptions shared_dataset_options_for(const config::Config& cfg);
// data.cache, cache_max_gb, cache_dir, load_vae_feat.
SampleCacheOptions sample_cache_options_for(const config::Config& cfg);
// train.seed, model_growth, model.load_from / load_strict, train.grad_checkpointing / gc_step, model.kernels.
InitialModelOptions initial_model_options_for(const config::Config& cfg);
// train.optimizer (its defaults filled in by the loader).
OptimizerOptions optimizer_options_for(const config::Config& cfg);
// data.class_data_dir, class_prompt, num_class_images; the preview sampler's keys; the
// training set's indexing.
ClassImageOptions class_image_options_for(const config::Config& cfg);
// train.ema_device and ema_update_interval.
EmaPlacement ema_placement_for(const config::TrainConfig& t);
// work_dir, train.log_interval, train.report_to.
MetricsOptions metrics_options_for(const config::Config& cfg);
// The half type model.mixed_precision names (kHalf, kBFloat16), or kFloat for fp32.
at::ScalarType half_type(config::Precision mixed_precision);
// What the step reads of the config; rank, world size and whether forwards are collective
// are the caller's (the runtime's and parallel::Zero's), the id log and batch dumps the
// tests' `hooks`.
StepOptions step_options_for(const config::Config& cfg, const TestHooks& hooks, int rank, int world_size,
                             bool forwards_collective);
// SANA-Sprint stage 2's objective (a SanaMSCM preset, docs/sprint.md): scheduler.* and
// train.* Sprint keys, the heads' blocks (core_options.h's head_blocks_for), train.seed.
SprintOptions sprint_options_for(const config::Config& cfg);
// Stage 2's parts in a run: the teacher (model.teacher, model.teacher_model,
// train.frozen_base_dtype), the heads' seed, reducer (ddp.*) and optimizer (train.optimizer).
SprintStepOptions sprint_step_options_for(const config::Config& cfg);
// What a kind of training needs before the run starts (exit 2 otherwise): SANA-Sprint's
// stage 2 a model.teacher_model.
void check_training_kind(const config::Config& cfg);
// The run's kind of training (step/training_step.h): a registered kind that claims it,
// else SANA-Sprint's stage 2 for a SanaMSCM student, else flow matching over the Trainable.
// Collective for stage 2 (the teacher's weights agreed).
std::unique_ptr<TrainingStep> training_step_for(const config::Config& cfg, StepParts parts);
// train.lora when it is on (lora_enabled), else nothing: what Trainable adapts.
std::optional<model::LoraOptions> lora_for(const config::Config& cfg);
// vae.*, text_encoder.*, controlnet.hed_model (for a ControlNet preset on scribble or HED
// maps), data.load_vae_feat / load_text_feat, train.validation_prompts.
EncoderOptions encoder_options_for(const config::Config& cfg);
// What previews sample and show: train.preview_* and validation_prompts, scheduler.vis_sampler /
// flow_shift, train.seed, the base size's showcase buckets, the VAE, and a ControlNet's
// conditioning scale, validation maps and control maps (exit 2 for HED maps without
// controlnet.hed_model).
PreviewSources preview_sources_for(const config::Config& cfg);
// train.visualize, eval_sampling_steps, preview_every_epochs, preview_on, report_to, work_dir.
PreviewPolicy preview_policy_for(const config::Config& cfg);
// What the memory estimate reads: the model, train.lora, the optimizer and EMA, the bucket
// caps, train.zero_stage / deterministic, autocast on CUDA, the buckets, the micro-batch and
// gradient checkpointing. Throws SpecError / UsageError for a model that cannot be built.
MemoryEstimateOptions memory_estimate_options_for(const config::Config& cfg);
// resume_from, work_dir, train.seed; `model` is the model's name (the spec's).
ResumeOptions resume_options_for(const config::Config& cfg, const std::string& model);

}  // namespace sana::train
