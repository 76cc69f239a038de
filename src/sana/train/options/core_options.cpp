#include "sana/train/options/core_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <utility>
#include <filesystem>

#include "sana/config/encoder_source.h"
#include "sana/data/decode.h"
#include "sana/train/options/from_keys.h"
#include "sana/util/error.h"
#include "sana/train/test_hooks.h"

namespace sana::train {

namespace {

// A config enum's value as the component's enum, by the pairs listed (every enumerator of
// both); an enumerator added to the config without its pair here is a logic_error where used.
template <class To, class From, size_t N>
To mapped(From value, const std::array<std::pair<From, To>, N>& pairs) {
  for (const auto& [from, to] : pairs) {
    if (from == value) return to;
  }
  throw std::logic_error("train/options/core_options.cpp: an enumerator with no component counterpart");
}

}  // namespace

data::BucketOptions bucket_options_for(const config::Config& cfg) {
  data::BucketOptions o;
  o.base_sizes = {cfg.data.image_size};
  o.base_sizes.insert(o.base_sizes.end(), cfg.data.multi_scale_sizes.begin(), cfg.data.multi_scale_sizes.end());
  fill_from_keys(cfg, {
      {o.multi_scale, "model.multi_scale"},
      {o.aspect_ratio_type, "data.aspect_ratio_type"},
      {o.bucket_step, "data.bucket_step"},
      {o.scale_rule, "data.multi_scale_rule"},
  });
  return o;
}

data::BatchSpec batch_spec_for(const config::Config& cfg) {
  return {cfg.train.global_batch_size, cfg.train.batch_tokens};
}

data::DatasetOptions dataset_options_for(const config::Config& cfg) {
  data::DatasetOptions o;
  fill_from_keys(cfg, {
      {o.sources, "data.data_dir"},
      {o.seed, "train.seed"},
      {o.max_untrained_fraction, "data.max_untrained_fraction"},
      {o.exif_orientation, "data.exif_orientation"},
      {o.captions.caption_suffixes, "data.external_caption_suffixes"},
      {o.captions.clipscore_suffixes, "data.external_clipscore_suffixes"},
      {o.filter.hq_only, "data.hq_only"},
      {o.filter.min_clip_score, "data.del_img_clip_thr"},
  });
  o.index_dir = (std::filesystem::path(cfg.work_dir) / "index").string();
  o.buckets = bucket_options_for(cfg);
  o.batch = batch_spec_for(cfg);
  o.tail = mapped(cfg.data.tail, std::array{std::pair{config::Tail::drop, data::TailPolicy::drop},
                                            std::pair{config::Tail::pad, data::TailPolicy::pad}});
  o.distributed_sampler = cfg.data.sampler == config::DataSampler::distributed;
  if (cfg.data.caption_selection_type == "proportion") {
    for (const auto& [name, weight] : cfg.data.caption_proportion) o.captions.names.push_back(name);
  }
  if (cfg.train.eval.every_steps > 0) {  // train.eval.fraction: its share is left out of training
    o.filter.holdout = cfg.train.eval.fraction;
    o.filter.holdout_seed = static_cast<uint64_t>(cfg.train.seed);
  }
  return o;
}

data::CaptionChoice caption_choice_for(const config::Config& cfg) {
  data::CaptionChoice o;
  o.type = cfg.data.caption_selection_type == "proportion" ? data::CaptionSelection::proportion
                                                            : data::CaptionSelection::clipscore;
  fill_from_keys(cfg, {
      {o.clip_thr, "data.clip_thr"},
      {o.temperature, "data.clip_thr_temperature"},
      {o.proportion, "data.caption_proportion"},
  });
  o.scored = !cfg.data.external_clipscore_suffixes.empty();
  return o;
}

data::DecodeOptions decode_options_for(const config::Config& cfg) {
  data::DecodeOptions o;
  if (cfg.data.interpolation != "upstream") o.filter = data::parse_resample(cfg.data.interpolation);
  fill_from_keys(cfg, {
      {o.reduced_decode, "data.jpeg_reduced_decode"},
      {o.exif_orientation, "data.exif_orientation"},
  });
  return o;
}

data::LoaderOptions loader_options_for(const config::Config& cfg) {
  data::LoaderOptions o;
  o.workers = static_cast<int>(std::max<int64_t>(1, cfg.train.num_workers));
  o.prefetch = static_cast<int>(cfg.data.prefetch_batches) * o.workers;
  o.decode = decode_options_for(cfg);
  o.caption = caption_choice_for(cfg);
  fill_from_keys(cfg, {
      {o.seed, "train.seed"},
      {o.wait_timeout_s, "dist.timeout_s"},
      {o.load_latents, "data.load_vae_feat"},
      {o.latent_channels, "vae.vae_latent_dim"},
      {o.latent_downsample, "vae.vae_downsample_rate"},
      {o.load_text_feat, "data.load_text_feat"},
      {o.masks, "train.masked_loss"},
      {o.text_length, "text_encoder.model_max_length"},
      {o.text_channels, "text_encoder.caption_channels"},
  });
  o.alpha_masks = cfg.train.masked_loss && cfg.train.masked_loss_alpha;
  return o;
}

data::ControlMapOptions control_map_options_for(const config::Config& cfg) {
  const auto& c = cfg.controlnet;
  data::ControlMapOptions o;
  if (cfg.data.load_vae_feat) {  // the maps were made and encoded by prepare-features
    o.kind = data::ControlKind::latents;
    return o;
  }
  if (c.control_signal_type == config::ControlSignal::dataset) {
    o.kind = data::ControlKind::dataset;
    return o;
  }
  if (c.control_signal_type == config::ControlSignal::scribble || c.control_signal_type == config::ControlSignal::hed) {
    if (c.hed_model.empty()) {
      throw UsageError(fmt::format("controlnet.control_signal_type: {} maps need upstream's HED network: export "
                                   "lllyasviel's ControlNetHED.pth with scripts/export_hed.py and set "
                                   "controlnet.hed_model to it (or use canny, or dataset with maps made beforehand)",
                                   config::name_of(c.control_signal_type)),
                       "config error");
    }
    o.kind = c.control_signal_type == config::ControlSignal::hed ? data::ControlKind::hed : data::ControlKind::scribble;
    o.detect_resolution = static_cast<int>(c.detect_resolution);
    o.thickness = static_cast<int>(c.scribble_thickness);
    return o;  // the edge network itself: train::control_maps_for
  }
  if (c.canny_low_threshold > c.canny_high_threshold) {
    throw UsageError(fmt::format("controlnet.canny_low_threshold ({}) is above canny_high_threshold ({})",
                                 c.canny_low_threshold, c.canny_high_threshold),
                     "config error");
  }
  o.kind = data::ControlKind::canny;
  fill_from_keys(cfg, {
      {o.canny_low, "controlnet.canny_low_threshold"},
      {o.canny_high, "controlnet.canny_high_threshold"},
  });
  return o;
}

parallel::ReducerOptions reducer_options_for(const config::Config& cfg) {
  parallel::ReducerOptions o;
  fill_from_keys(cfg, {
      {o.bucket_cap_mb, "ddp.bucket_cap_mb"},
      {o.exact, "train.deterministic"},
      {o.gradients_on_host, "train.offload_optimizer"},
  });
  o.average = false;
  o.shard_gradients = cfg.train.zero_stage >= 2;
  return o;
}

data::DiskCacheOptions disk_cache_options_for(const config::Config& cfg) {
  data::DiskCacheOptions o;
  o.dir = cfg.data.cache_dir.empty() ? (std::filesystem::path(cfg.work_dir) / "sample_cache").string()
                                     : cfg.data.cache_dir;
  o.decode = decode_options_for(cfg);
  return o;
}

model::ModelSpec model_spec_for(const config::Config& cfg) {
  model::ModelSpec s = model::preset_spec(cfg.model.model);
  const bool latent = cfg.data.load_vae_feat || config::uses_vae(cfg.vae);
  s.in_channels = s.out_channels = latent ? cfg.vae.vae_latent_dim : 3;
  s.downsample = latent ? cfg.vae.vae_downsample_rate : 1;
  fill_from_keys(cfg, {
      {s.linear_head_dim, "model.linear_head_dim"},
      {s.mlp_ratio, "model.mlp_ratio"},
      {s.caption_channels, "text_encoder.caption_channels"},
      {s.caption_tokens, "text_encoder.model_max_length"},
      {s.num_classes, "model.num_classes"},
      {s.y_norm, "text_encoder.y_norm"},
      {s.y_norm_scale, "text_encoder.y_norm_scale_factor"},
      {s.qk_norm, "model.qk_norm"},
      {s.cross_norm, "model.cross_norm"},
      {s.use_pe, "model.use_pe"},
      {s.pe_interpolation, "model.pe_interpolation"},
      {s.fp32_attention, "model.fp32_attention"},
      {s.timestep_norm_scale, "scheduler.timestep_norm_scale_factor"},
      {s.class_dropout_prob, "model.class_dropout_prob"},
      {s.cfg_embed, "model.cfg_embed"},
      {s.cfg_embed_scale, "model.cfg_embed_scale"},
      {s.logvar, "model.logvar"},
  });
  if (cfg.data.load_text_feat || config::uses_text_encoder(cfg.text_encoder)) {
    s.conditioning = model::Conditioning::caption;
  } else if (cfg.model.num_classes > 0) {
    s.conditioning = model::Conditioning::class_label;
  } else {
    s.conditioning = model::Conditioning::none;
  }
  s.pe_base_size = std::max<int64_t>(1, cfg.model.image_size / (s.downsample * s.patch));
  s.integer_timesteps = cfg.scheduler.timestep_grid == config::TimestepGrid::integer;
  model::check_spec(s);
  return s;
}

model::ModelSpec teacher_spec_for(const config::Config& cfg) {
  auto c = cfg;
  if (!cfg.model.sprint.teacher.empty()) c.model.model = cfg.model.sprint.teacher;
  c.model.sprint.cfg_embed = c.model.sprint.logvar = false;
  return model_spec_for(c);
}

std::vector<int64_t> head_blocks_for(const config::Config& cfg) {
  const auto& m = cfg.model.sprint;
  if (!m.head_block_ids.empty()) return m.head_block_ids;
  // Upstream's SanaMSCMDiscriminator: {2, 8, 14, 20, 27} multi-scale, else the last block.
  if (m.ladd_multi_scale) return {2, 8, 14, 20, 27};
  return {teacher_spec_for(cfg).depth - 1};
}

model::VaeOptions vae_options_for(const config::Config& cfg) {
  model::VaeOptions o;
  // A folder or hub name resolves to the folder found (validation already said when none is).
  const auto source = config::vae_source(cfg.vae);
  o.vae_pretrained = source.path.empty() ? cfg.vae.vae_pretrained : source.path;
  o.dc_ae_folder = source.kind == config::VaeSource::Kind::dc_ae;
  o.efficientvit_name = source.kind == config::VaeSource::Kind::dc_ae_efficientvit ? source.name : "";
  fill_from_keys(cfg, {
      {o.scale_factor, "vae.scale_factor"},
      {o.vae_latent_dim, "vae.vae_latent_dim"},
      {o.vae_downsample_rate, "vae.vae_downsample_rate"},
      {o.tile_size, "vae.tile_size"},
      {o.tile_overlap, "vae.tile_overlap"},
  });
  return o;
}

model::TextEncoderOptions text_encoder_options_for(const config::Config& cfg) {
  const auto& t = cfg.text_encoder;
  model::TextEncoderOptions o;
  fill_from_keys(cfg, {
      {o.text_encoder_name, "text_encoder.text_encoder_name"},
      {o.caption_channels, "text_encoder.caption_channels"},
      {o.model_max_length, "text_encoder.model_max_length"},
      {o.chi_prompt, "text_encoder.chi_prompt"},
  });
  // A folder or hub name resolves to the folder found (validation already said when none is).
  const auto source = config::text_encoder_source(t);
  o.text_encoder_path = source.path.empty() ? t.text_encoder_path : source.path;
  o.tokenizer_path = source.path.empty() ? t.tokenizer_path : source.tokenizer;
  o.gemma2_folder = source.kind == config::TextEncoderSource::Kind::gemma2;
  o.caption_cache_bytes = static_cast<int64_t>(t.caption_cache_gib * static_cast<double>(int64_t{1} << 30));
  return o;
}

model::GrowthOptions growth_options_for(const config::Config& cfg) {
  using model::GrowthStrategy;
  const auto& g = cfg.model_growth;
  model::GrowthOptions o;
  fill_from_keys(cfg, {
      {o.source, "model_growth.pretrained_ckpt_path"},
      {o.source_layers, "model_growth.source_num_layers"},
      {o.target_layers, "model_growth.target_num_layers"},
      {o.expand_ratio, "model_growth.init_params.expand_ratio"},
      {o.noise_scale, "model_growth.init_params.noise_scale"},
      {o.zero_gate, "model_growth.init_params.zero_gate"},
      {o.scale_spec, "model_growth.init_params.scale_spec"},
      {o.scale_others, "model_growth.init_params.scale_others"},
      {o.seed, "train.seed"},
  });
  static const std::array<std::pair<const char*, GrowthStrategy>, 6> names{{
      {"cyclic", GrowthStrategy::cyclic},
      {"block_expand", GrowthStrategy::block_expand},
      {"progressive", GrowthStrategy::progressive},
      {"interpolation", GrowthStrategy::interpolation},
      {"random", GrowthStrategy::random},
      {"constant", GrowthStrategy::constant},
  }};
  const auto it = std::find_if(names.begin(), names.end(), [&](const auto& n) { return g.init_strategy == n.first; });
  if (it == names.end()) throw std::logic_error("model_growth.init_strategy outside its choices: " + g.init_strategy);
  o.strategy = it->second;
  return o;
}

diffusion::TimestepOptions timestep_options_for(const config::Config& cfg) {
  const auto& s = cfg.scheduler;
  diffusion::TimestepOptions o;
  // SANA-Sprint's TrigFlow times are its own draws (diffusion/scm.h); no flow step runs.
  if (s.weighting_scheme == config::Weighting::logit_normal_trigflow) return o;
  o.weighting = mapped(s.weighting_scheme,
                       std::array{std::pair{config::Weighting::logit_normal, diffusion::Weighting::logit_normal},
                                  std::pair{config::Weighting::sd3_mode, diffusion::Weighting::sd3_mode},
                                  std::pair{config::Weighting::uniform, diffusion::Weighting::uniform}});
  fill_from_keys(cfg, {
      {o.logit_mean, "scheduler.logit_mean"},
      {o.logit_std, "scheduler.logit_std"},
      {o.mode_scale, "scheduler.mode_scale"},
      {o.flow_shift, "scheduler.flow_shift"},
      {o.train_sampling_steps, "scheduler.train_sampling_steps"},
  });
  o.integer_grid = s.timestep_grid == config::TimestepGrid::integer;
  return o;
}

parallel::ZeroOptions zero_options_for(const config::Config& cfg) {
  parallel::ZeroOptions o;
  o.stage = static_cast<int>(cfg.train.zero_stage);
  return o;
}

dist::RuntimeOptions runtime_options_for(const config::Config& cfg, const TestHooks& hooks) {
  const auto& d = cfg.dist;
  dist::RuntimeOptions o;
  o.backend = mapped(d.backend, std::array{std::pair{config::Backend::automatic, dist::BackendChoice::automatic},
                                            std::pair{config::Backend::gloo, dist::BackendChoice::gloo},
                                            std::pair{config::Backend::nccl, dist::BackendChoice::nccl}});
  o.device = mapped(d.device, std::array{std::pair{config::DeviceKind::automatic, dist::DeviceChoice::automatic},
                                          std::pair{config::DeviceKind::cpu, dist::DeviceChoice::cpu},
                                          std::pair{config::DeviceKind::cuda, dist::DeviceChoice::cuda}});
  fill_from_keys(cfg, {
      {o.master_addr, "dist.master_addr"},
      {o.master_port, "dist.master_port"},
      {o.timeout_s, "dist.timeout_s"},
      {o.heartbeat_timeout_s, "dist.heartbeat_timeout_s"},
      {o.socket_ifname, "dist.socket_ifname"},
      {o.allow_shared_device, "dist.allow_shared_device"},
      {o.threads_per_process, "dist.threads_per_process"},
      {o.min_world_size, "dist.min_world_size"},
      {o.max_rejoin_wait_s, "dist.max_rejoin_wait_s"},
  });
  o.elastic_continue = d.elastic == config::Elastic::continue_on;
  o.inject_cuda_devices = hooks.inject_cuda_devices;
  o.injected_cuda_devices = hooks.cuda_devices;
  return o;
}

model::StorageDtype frozen_dtype_for(const config::TrainConfig& t) {
  switch (t.frozen_base_dtype) {
    case config::FrozenDtype::bf16: return model::StorageDtype::bf16;
    case config::FrozenDtype::fp16: return model::StorageDtype::fp16;
    case config::FrozenDtype::int8: return model::StorageDtype::int8;
    case config::FrozenDtype::fp8: return model::StorageDtype::fp8;
    case config::FrozenDtype::nf4: return t.frozen_base_double_quant ? model::StorageDtype::nf4_dq : model::StorageDtype::nf4;
    case config::FrozenDtype::fp32: break;
  }
  return model::StorageDtype::fp32;
}

model::LoraOptions lora_options_for(const config::Config& cfg) {
  const auto& c = cfg.train.lora;
  model::LoraOptions o;
  fill_from_keys(cfg, {
      {o.rank, "train.lora.rank"},
      {o.alpha, "train.lora.alpha"},
      {o.dropout, "train.lora.dropout"},
      {o.targets, "train.lora.target_modules"},
      {o.seed, "train.seed"},
  });
  o.gaussian = c.init == config::LoraInit::gaussian;
  return o;
}

LrScheduleOptions lr_schedule_options_for(const config::TrainConfig& t) {
  using Shape = LrScheduleOptions::Shape;
  using Scaling = LrScheduleOptions::BatchScaling;
  LrScheduleOptions o;
  o.lr = t.optimizer.lr;
  o.lr_schedule = t.lr_schedule == config::LrSchedule::cosine                     ? Shape::cosine
                  : t.lr_schedule == config::LrSchedule::cosine_decay_to_constant ? Shape::cosine_decay_to_constant
                                                                                  : Shape::constant;
  o.auto_lr = t.auto_lr == config::AutoLr::sqrt     ? Scaling::sqrt
              : t.auto_lr == config::AutoLr::linear ? Scaling::linear
                                                    : Scaling::none;
  o.global_batch_size = t.global_batch_size;
  o.num_warmup_steps = t.lr_schedule_args.num_warmup_steps;
  o.final_lr_ratio = t.lr_schedule_args.final_lr_ratio;
  o.num_decay = t.lr_schedule_args.num_decay;
  o.num_cycles = t.lr_schedule_args.num_cycles;
  return o;
}

}  // namespace sana::train
