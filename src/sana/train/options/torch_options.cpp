#include "sana/train/options/torch_options.h"

#include <fmt/format.h>

#include "sana/data/buckets.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/from_keys.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

ContinuationOptions continuation_options_for(const config::Config& cfg) {
  return {cfg.dist.min_world_size, cfg.train.deterministic, cfg.dist.timeout_s, cfg.work_dir};
}

CheckpointOptions checkpoint_options_for(const config::Config& cfg, ckpt::StageHook before_stage) {
  CheckpointOptions o;
  fill_from_keys(cfg, {
      {o.work_dir, "work_dir"},
      {o.save_model_steps, "train.save_model_steps"},
      {o.save_model_epochs, "train.save_model_epochs"},
      {o.keep_last_n, "ckpt.keep_last_n"},
      {o.async_save, "ckpt.async_save"},
  });
  o.before_stage = std::move(before_stage);
  return o;
}

BatchOptions batch_options_for(const config::Config& cfg) {
  BatchOptions o;
  o.batch = batch_spec_for(cfg);
  fill_from_keys(cfg, {
      {o.micro_batch_size, "train.micro_batch_size"},
      {o.deterministic, "train.deterministic"},
  });
  return o;
}

SharedDatasetOptions shared_dataset_options_for(const config::Config& cfg) {
  SharedDatasetOptions o;
  o.dataset = dataset_options_for(cfg);
  const auto spec = model_spec_for(cfg);
  o.cell = spec.downsample * spec.patch;
  o.caption_features = cfg.data.load_text_feat;
  o.captions = caption_choice_for(cfg);
  return o;
}

SampleCacheOptions sample_cache_options_for(const config::Config& cfg) {
  using Mode = SampleCacheOptions::Mode;
  SampleCacheOptions o;
  o.cache = cfg.data.cache == config::SampleCacheMode::disk     ? Mode::disk
            : cfg.data.cache == config::SampleCacheMode::memory ? Mode::memory
                                                                : Mode::none;
  fill_from_keys(cfg, {
      {o.precomputed_latents, "data.load_vae_feat"},
      {o.cache_max_gb, "data.cache_max_gb"},
  });
  if (o.cache == Mode::disk) o.disk = disk_cache_options_for(cfg);
  return o;
}

InitialModelOptions initial_model_options_for(const config::Config& cfg) {
  InitialModelOptions o;
  fill_from_keys(cfg, {
      {o.seed, "train.seed"},
      {o.growth_strategy, "model_growth.init_strategy"},
      {o.load_from, "model.load_from"},
      {o.load_strict, "model.load_strict"},
      {o.grad_checkpointing, "train.grad_checkpointing"},
      {o.gc_step, "train.gc_step"},
      {o.offload_blocks, "train.offload_blocks"},
  });
  o.growth = growth_options_for(cfg);
  o.fused_kernels = cfg.model.kernels == config::Kernels::fused;
  o.frozen_base = config::lora_enabled(cfg.train);
  o.frozen_dtype = frozen_dtype_for(cfg.train);
  return o;
}

OptimizerOptions optimizer_options_for(const config::Config& cfg) {
  using Kind = OptimizerOptions::Kind;
  using config::OptimizerType;
  const OptimizerType t = cfg.train.optimizer.type;
  OptimizerOptions o;
  o.type = t == OptimizerType::CAME        ? Kind::CAME
           : t == OptimizerType::CAME8bit  ? Kind::CAME8bit
           : t == OptimizerType::AdamW8bit ? Kind::AdamW8bit
           : t == OptimizerType::Lion      ? Kind::Lion
           : t == OptimizerType::Adafactor ? Kind::Adafactor
           : t == OptimizerType::Prodigy   ? Kind::Prodigy
           : t == OptimizerType::ScheduleFreeAdamW ? Kind::ScheduleFreeAdamW
                                           : Kind::AdamW;
  fill_from_keys(cfg, {
      {o.betas, "train.optimizer.betas"},
      {o.eps, "train.optimizer.eps"},
      {o.weight_decay, "train.optimizer.weight_decay"},
      {o.block_size, "train.optimizer.block_size"},
      {o.min_8bit_size, "train.optimizer.min_8bit_size"},
      {o.clip_threshold, "train.optimizer.clip_threshold"},
      {o.decay_rate, "train.optimizer.decay_rate"},
      {o.scale_parameter, "train.optimizer.scale_parameter"},
      {o.relative_step, "train.optimizer.relative_step"},
      {o.warmup_init, "train.optimizer.warmup_init"},
      {o.d0, "train.optimizer.d0"},
      {o.d_coef, "train.optimizer.d_coef"},
      {o.growth_rate, "train.optimizer.growth_rate"},
      {o.decouple, "train.optimizer.decouple"},
      {o.use_bias_correction, "train.optimizer.use_bias_correction"},
      {o.safeguard_warmup, "train.optimizer.safeguard_warmup"},
      {o.slice_p, "train.optimizer.slice_p"},
      {o.warmup_steps, "train.optimizer.warmup_steps"},
      {o.r, "train.optimizer.r"},
      {o.weight_lr_power, "train.optimizer.weight_lr_power"},
  });
  return o;
}

MetricsOptions metrics_options_for(const config::Config& cfg) {
  MetricsOptions o;
  fill_from_keys(cfg, {
      {o.work_dir, "work_dir"},
      {o.log_interval, "train.log_interval"},
  });
  o.tensorboard = cfg.train.report_to == "tensorboard";
  return o;
}

at::ScalarType half_type(config::Precision mixed_precision) {
  switch (mixed_precision) {
    case config::Precision::fp16: return at::kHalf;
    case config::Precision::bf16: return at::kBFloat16;
    case config::Precision::fp32: break;
  }
  return at::kFloat;
}

StepOptions step_options_for(const config::Config& cfg, const TestHooks& hooks, int rank, int world_size,
                             bool forwards_collective) {
  StepOptions o;
  fill_from_keys(cfg, {
      {o.work_dir, "work_dir"},
      {o.micro_batch_size, "train.micro_batch_size"},
      {o.deterministic, "train.deterministic"},
      {o.precomputed_latents, "data.load_vae_feat"},
      {o.class_dropout_prob, "model.class_dropout_prob"},
      {o.seed, "train.seed"},
      {o.unmasked_weight, "train.masked_loss_unmasked_weight"},
      {o.class_prompt, "data.class_prompt"},
      {o.prior_loss_weight, "train.prior_loss_weight"},
  });
  o.half = half_type(cfg.model.mixed_precision);
  o.timesteps = timestep_options_for(cfg);
  o.rank = rank;
  o.world_size = world_size;
  o.forwards_collective = forwards_collective;
  o.log_ids = hooks.log_ids;
  o.dump_batches = hooks.dump_batches;
  return o;
}

std::optional<model::LoraOptions> lora_for(const config::Config& cfg) {
  if (!config::lora_enabled(cfg.train)) return std::nullopt;
  return lora_options_for(cfg);
}

EncoderOptions encoder_options_for(const config::Config& cfg) {
  EncoderOptions o;
  if (config::uses_vae(cfg.vae)) o.vae = vae_options_for(cfg);
  if (config::uses_text_encoder(cfg.text_encoder)) o.text = text_encoder_options_for(cfg);
  const auto signal = cfg.controlnet.control_signal_type;
  if ((signal == config::ControlSignal::scribble || signal == config::ControlSignal::hed) &&
      !cfg.controlnet.hed_model.empty() && model_spec_for(cfg).control_blocks > 0) {
    o.hed_model = cfg.controlnet.hed_model;
  }
  fill_from_keys(cfg, {
      {o.precomputed_latents, "data.load_vae_feat"},
      {o.precomputed_captions, "data.load_text_feat"},
  });
  o.validation_prompts = !cfg.train.validation_prompts.empty();
  return o;
}

PreviewSources preview_sources_for(const config::Config& cfg) {
  PreviewSources o;
  auto& s = o.sampling;
  fill_from_keys(cfg, {
      {s.steps, "train.preview_steps"},
      {s.cfg_scale, "train.preview_cfg_scale"},
      {s.images, "train.preview_images"},
      {s.seed, "train.seed"},
      {s.flow_shift, "scheduler.flow_shift"},
      {s.sampler, "scheduler.vis_sampler"},
      {s.sigma_data, "scheduler.sigma_data"},
      {o.validation_prompts, "train.validation_prompts"},
  });
  for (const auto& b : data::showcase_buckets(data::bucket_tables_for(bucket_options_for(cfg)).front())) {
    o.buckets.push_back({b.height, b.width});
  }
  o.vae_configured = config::uses_vae(cfg.vae);
  if (model_spec_for(cfg).control_blocks > 0) {
    o.control_scale = cfg.controlnet.conditioning_scale;
    o.control_decode = decode_options_for(cfg);
    o.validation_control_images = cfg.controlnet.validation_scribble_maps;
    if (o.validation_control_images.empty()) o.control_maps = control_map_options_for(cfg);
  }
  return o;
}

PreviewPolicy preview_policy_for(const config::Config& cfg) {
  PreviewPolicy o;
  fill_from_keys(cfg, {
      {o.visualize, "train.visualize"},
      {o.eval_sampling_steps, "train.eval_sampling_steps"},
      {o.preview_every_epochs, "train.preview_every_epochs"},
      {o.work_dir, "work_dir"},
  });
  o.rank0_renders_all = cfg.train.preview_on == config::PreviewOn::rank0;
  o.tensorboard = cfg.train.report_to == "tensorboard";
  return o;
}

ClassImageOptions class_image_options_for(const config::Config& cfg) {
  ClassImageOptions o;
  fill_from_keys(cfg, {
      {o.dir, "data.class_data_dir"},
      {o.prompt, "data.class_prompt"},
      {o.count, "data.num_class_images"},
  });
  o.sampling = preview_sources_for(cfg);
  o.dataset = shared_dataset_options_for(cfg);
  return o;
}

EmaPlacement ema_placement_for(const config::TrainConfig& t) {
  return {t.ema_device == config::StateDevice::cpu, t.ema_update_interval, std::nullopt};
}

MemoryEstimateOptions memory_estimate_options_for(const config::Config& cfg) {
  MemoryEstimateOptions o;
  o.spec = model_spec_for(cfg);
  o.lora = lora_for(cfg);
  o.optimizer = optimizer_options_for(cfg);
  o.ema = config::ema_enabled(cfg.train);
  o.ema_on_host = cfg.train.ema_device == config::StateDevice::cpu;
  fill_from_keys(cfg, {
      {o.offload_optimizer, "train.offload_optimizer"},
      {o.zero_stage, "train.zero_stage"},
      {o.deterministic, "train.deterministic"},
      {o.micro_batch_size, "train.micro_batch_size"},
      {o.global_batch_size, "train.global_batch_size"},
      {o.grad_checkpointing, "train.grad_checkpointing"},
      {o.gc_step, "train.gc_step"},
      {o.offload_blocks, "train.offload_blocks"},
  });
  o.mirror = cfg.dist.elastic == config::Elastic::continue_on;
  o.reducer = reducer_options_for(cfg);
  o.autocast = cfg.model.mixed_precision != config::Precision::fp32 && cfg.dist.device != config::DeviceKind::cpu;
  o.working_weights = config::working_weights_on(cfg.train);
  o.buckets = data::bucket_tables_for(bucket_options_for(cfg));
  o.frozen_dtype = frozen_dtype_for(cfg.train);
  if (o.spec.trigflow && !cfg.model.sprint.teacher_model.empty()) {
    o.sprint = MemoryEstimateOptions::Sprint{teacher_spec_for(cfg), static_cast<int64_t>(head_blocks_for(cfg).size()),
                                             sprint_options_for(cfg)};
  }
  return o;
}

ResumeOptions resume_options_for(const config::Config& cfg, const std::string& model) {
  ResumeOptions o;
  fill_from_keys(cfg, {
      {o.resume_from, "resume_from"},
      {o.work_dir, "work_dir"},
      {o.seed, "train.seed"},
  });
  o.model = model;
  return o;
}

SprintOptions sprint_options_for(const config::Config& cfg) {
  SprintOptions o;
  fill_from_keys(cfg, {
      {o.draws.logit_mean, "scheduler.logit_mean"},
      {o.draws.logit_std, "scheduler.logit_std"},
      {o.draws.logit_mean_d, "scheduler.logit_mean_discriminator"},
      {o.draws.logit_std_d, "scheduler.logit_std_discriminator"},
      {o.draws.cfg_scales, "train.scm_cfg_scale"},
      {o.draws.largest_timestep, "train.train_largest_timestep"},
      {o.draws.largest, "train.largest_timestep"},
      {o.draws.largest_prob, "train.largest_timestep_prob"},
      {o.draws.diff_timesteps_d, "train.diff_timesteps_D"},
      {o.sigma_data, "scheduler.sigma_data"},
      {o.tangent_warmup_steps, "train.tangent_warmup_steps"},
      {o.scm_lambda, "train.scm_lambda"},
      {o.adv_lambda, "train.adv_lambda"},
      {o.misaligned_pairs, "train.misaligned_pairs_D"},
      {o.seed, "train.seed"},
      {o.exact, "train.deterministic"},
  });
  o.head_blocks = head_blocks_for(cfg);
  return o;
}

SprintStepOptions sprint_step_options_for(const config::Config& cfg) {
  SprintStepOptions o;
  o.teacher = teacher_spec_for(cfg);
  fill_from_keys(cfg, {
      {o.teacher_model, "model.teacher_model"},
      {o.seed, "train.seed"},
      {o.micro_batch_size, "train.micro_batch_size"},
  });
  o.frozen_dtype = frozen_dtype_for(cfg.train);
  o.step = sprint_options_for(cfg);
  o.reducer = reducer_options_for(cfg);
  o.optimizer = optimizer_options_for(cfg);
  return o;
}

void check_training_kind(const config::Config& cfg) {
  if (model_spec_for(cfg).trigflow && cfg.model.sprint.teacher_model.empty()) {  // SANA-Sprint's stage 2
    throw UsageError(fmt::format("model.teacher_model: is empty, and {} is SANA-Sprint's stage-2 student: stage 2 "
                                 "distils a teacher; point it at the stage-1 fine-tune's weights (docs/sprint.md)",
                                 cfg.model.model),
                     "config error");
  }
}

std::unique_ptr<TrainingStep> training_step_for(const config::Config& cfg, StepParts parts) {
  std::string name;
  if (auto step = registered_training_step(parts, name)) {
    log::info("training step: {} (a registered kind)", name);
    return step;
  }
  if (model_spec_for(cfg).trigflow) return std::make_unique<SprintStep>(sprint_step_options_for(cfg), parts);
  return std::make_unique<FlowMatchingStep>();
}

}  // namespace sana::train
