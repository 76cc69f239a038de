// The typed run configuration: one struct per YAML section, with upstream Sana's key
// names where the concept is the same. Plain data only: loading, overrides and
// validation live in loader.h / schema.h. Never includes torch.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "sana/config/options_enums.h"

namespace sana::config {

// A YAML mapping of names to numbers, in the order written (data.caption_proportion).
using NamedWeights = std::vector<std::pair<std::string, double>>;

struct DataConfig {
  std::vector<std::string> data_dir;       // folders, metadata files or indexes
  int64_t image_size = 512;                // base resolution in pixels
  std::string aspect_ratio_type = "ASPECT_RATIO_512";
  std::vector<int64_t> multi_scale_sizes;  // extra base sizes for multi-scale runs
  int64_t bucket_step = 32;                // size step of generated bucket tables
  std::string multi_scale_rule = "largest_fitting";  // base size per sample
  Tail tail = Tail::drop;                  // last partial global batch of a bucket
  DataSampler sampler = DataSampler::bucket;  // or distributed (single resolution)
  std::string interpolation = "upstream";  // resize filter (PIL's); upstream: per bucket table
  bool jpeg_reduced_decode = false;        // JPEGs decoded at 1/2-1/8 scale when that still covers
  bool exif_orientation = false;           // turn images as their EXIF says (PIL does not)
  double max_bad_fraction = 0.01;          // bad samples tolerated before stopping
  double max_untrained_fraction = 0.05;    // samples in buckets that never train, before refusing
  int64_t prefetch_batches = 4;            // loader queue depth per process
  bool random_flip = false;
  SampleCacheMode cache = SampleCacheMode::none;  // decoded bucket images kept for later epochs
  double cache_max_gb = 16;                       // the most data.cache may take per node
  std::string cache_dir;                          // data.cache: disk: where (empty: work_dir/sample_cache)
  bool load_vae_feat = false;
  bool load_text_feat = false;
  // Upstream's sampler filters and caption choice (data/sample_meta.h).
  bool hq_only = false;                  // only samples whose .json says version "high_quality"
  double del_img_clip_thr = 0.0;         // drop samples whose prompt CLIP score is below it
  std::string caption_selection_type = "clipscore";  // or proportion
  NamedWeights caption_proportion = {{"prompt", 1.0}};
  std::vector<std::string> external_caption_suffixes;
  std::vector<std::string> external_clipscore_suffixes;
  double clip_thr = 0.0;
  double clip_thr_temperature = 1.0;
  // DreamBooth's prior preservation (diffusers' train_dreambooth_lora_sana.py): every
  // sample trains beside an image of its class (from class_data_dir, captioned class_prompt),
  // and the loss is the instance's + train.prior_loss_weight x the class image's. On when
  // class_data_dir is set; a folder holding fewer than num_class_images has the rest made
  // by the model being trained before the first step.
  std::string class_data_dir;
  std::string class_prompt;
  int64_t num_class_images = 100;
};

// SANA-Sprint (docs/sprint.md) at upstream's keys: the student's guidance embedding and
// log-variance head (model.*), and stage 2's teacher, discriminator heads and objective
// (model.*, scheduler.*, train.*). Defaults are upstream's config.py's.
struct SprintModelConfig {
  bool cfg_embed = false;        // model.cfg_embed
  double cfg_embed_scale = 1.0;  // model.cfg_embed_scale
  bool logvar = false;           // model.logvar
  std::string teacher;           // model.teacher: the teacher's preset ("": model.model's)
  std::string teacher_model;     // model.teacher_model: the teacher's weights
  bool ladd_multi_scale = true;  // model.ladd_multi_scale
  std::vector<int64_t> head_block_ids;  // model.head_block_ids ([]: upstream's default)
};
struct SprintSchedulerConfig {
  double sigma_data = 1.0;                 // scheduler.sigma_data
  double logit_mean_discriminator = 0.0;   // scheduler.logit_mean_discriminator
  double logit_std_discriminator = 1.0;    // scheduler.logit_std_discriminator
  Weighting weighting_scheme_discriminator = Weighting::logit_normal_trigflow;
};
struct SprintTrainConfig {
  int64_t tangent_warmup_steps = 10000;
  std::vector<double> scm_cfg_scale = {1.0};
  bool scm_loss = true;
  double scm_lambda = 1.0;
  double adv_lambda = 1.0;
  bool misaligned_pairs_D = false;
  std::string discriminator_loss = "cross entropy";
  bool train_largest_timestep = false;
  double largest_timestep = 1.5708;
  double largest_timestep_prob = 0.5;
  bool diff_timesteps_D = true;
};

struct ModelConfig {
  std::string model = "SanaMS_600M_P1_D28";
  int64_t image_size = 512;
  Precision mixed_precision = Precision::fp16;  // upstream's default; fp16 runs with loss scaling
  bool fp32_attention = true;
  Kernels kernels = Kernels::aten;  // fused: CUDA kernels where they apply (model/fused_kernels.h)
  std::string load_from;
  bool multi_scale = true;
  std::string attn_type = "linear";
  int64_t linear_head_dim = 32;
  std::string ffn_type = "glumbconv";
  double mlp_ratio = 2.5;
  bool qk_norm = false;
  bool cross_norm = false;      // RMSNorm on the cross-attention's q and k (Sana 1.5)
  bool use_pe = false;          // fixed 2-D sin-cos position embedding on the patch tokens
  double pe_interpolation = 1.0;  // its grid scale (upstream's lewei_scale)
  double class_dropout_prob = 0.0;
  int64_t num_classes = 0;  // >0 without captions: class-conditional (labels from the data)
  bool load_strict = true;  // load_from: every tensor must match (false: load what fits)
  SprintModelConfig sprint;
};

struct VaeConfig {
  // none: pixel space; torchscript or dc-ae (upstream's dc-ae and AutoencoderDC):
  // vae_pretrained is diffusers' AutoencoderDC folder or hub name, or a TorchScript export
  // (config/encoder_source.h).
  VaeType vae_type = VaeType::none;
  std::string vae_pretrained;
  double scale_factor = 0.41407;
  int64_t vae_latent_dim = 32;
  int64_t vae_downsample_rate = 32;
  // Tiled encoding (pixels, multiples of vae_downsample_rate; 0 = the whole image at once):
  // tiles of tile_size, neighbours overlapping by tile_overlap, blended there.
  int64_t tile_size = 0;
  int64_t tile_overlap = 0;
};

struct TextEncoderConfig {
  // none: class labels or unconditional; torchscript or one of upstream's encoder names
  // (gemma-2-2b-it, T5, ...; config/upstream.h): text_encoder_path is transformers' Gemma-2
  // folder or hub name, or a TorchScript export; empty with a gemma-2 name, upstream's repo
  // for it (config/encoder_source.h).
  std::string text_encoder_name = "none";
  std::string text_encoder_path;
  // A SentencePiece model (the encoder's tokenizer.model): captions are tokenized here, as
  // upstream's Hugging Face tokenizer does, and text_encoder_path takes (input_ids, mask).
  std::string tokenizer_path;
  // The empty prompt's features where no text encoder runs (data.load_text_feat): a file as
  // upstream's train.py writes it ({"uncond_prompt_embeds": (1, T, C)}, .pth or
  // .safetensors). "": upstream's file under train.null_embed_root when it exists.
  std::string null_embed_path;
  int64_t caption_channels = 2304;
  int64_t model_max_length = 300;
  bool y_norm = true;
  double y_norm_scale_factor = 1.0;
  std::vector<std::string> chi_prompt;  // lines put before every caption (joined by newlines)
  double caption_cache_gib = 2.0;       // host memory per process for captions already encoded
};

struct SchedulerConfig {
  int64_t train_sampling_steps = 1000;
  bool predict_flow_v = true;
  std::string noise_schedule = "linear_flow";
  double flow_shift = 1.0;
  Weighting weighting_scheme = Weighting::logit_normal;
  double logit_mean = 0.0;
  double logit_std = 1.0;
  double mode_scale = 1.29;
  // integer: upstream's grid (t = floor(1000 u), sigma from the shifted t/1000 table, the model
  // sees trunc(1000 sigma)); continuous: sigma = shift(u), the model sees 1000 sigma.
  TimestepGrid timestep_grid = TimestepGrid::integer;
  // The model divides its timestep input by it (upstream's SanaMS; SANA-Sprint's teacher: 1000).
  double timestep_norm_scale_factor = 1.0;
  std::string vis_sampler = "flow_dpm-solver";
  SprintSchedulerConfig sprint;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  double lr = 1e-4;
  double weight_decay = 0.03;
  // Empty means "the optimizer's own default" (AdamW: 2 betas, 1 eps; CAME: 3 and 2; Lion:
  // lion-pytorch's 2 betas (0.9, 0.99) and no eps; Adafactor: no beta1 and 2 eps; Prodigy:
  // 2 betas and 1 eps, a third beta its beta3; ScheduleFreeAdamW: 2 betas and 1 eps);
  // the loader fills them in so that --print-config shows what will run.
  std::vector<double> betas;
  std::vector<double> eps;
  // CAME8bit (upstream's CAME8BitWrapper): first moments of 2-D weights and 1x1
  // convolutions with more than min_8bit_size elements as uint8, per block_size rows.
  // AdamW8bit (bitsandbytes' AdamW8bit, upstream's AdamW8bitWrapper): both moments of
  // parameters with at least min_8bit_size elements as uint8. -1: the optimizer's default
  // (CAME8bit 16384, AdamW8bit 4096), filled in by the loader.
  int64_t block_size = 2048;
  int64_t min_8bit_size = -1;
  // Adafactor's own (transformers' names and defaults).
  double clip_threshold = 1.0;
  double decay_rate = -0.8;
  bool scale_parameter = true;
  bool relative_step = true;
  bool warmup_init = false;
  // Prodigy's own (prodigyopt's names and defaults); its lr defaults to 1 (the loader).
  double d0 = 1e-6;
  double d_coef = 1.0;
  double growth_rate = std::numeric_limits<double>::infinity();
  bool decouple = true;
  bool use_bias_correction = false;
  bool safeguard_warmup = false;
  int64_t slice_p = 1;
  // ScheduleFreeAdamW's own (schedulefree's names and defaults); its lr defaults to 0.0025
  // and train.lr_schedule's warmup to none (the loader): its warmup is warmup_steps.
  int64_t warmup_steps = 0;
  double r = 0.0;
  double weight_lr_power = 2.0;
};

struct LrScheduleArgs {
  int64_t num_warmup_steps = 500;
  // cosine_decay_to_constant: floor as a fraction of lr; 0 = upstream's 1 / the auto_lr scale
  double final_lr_ratio = 0.0;
  double num_decay = 0.667;  // cosine_decay_to_constant: decays over this fraction of the steps
  double num_cycles = 0.5;   // cosine: half-waves over the run (0.5 = one decay to 0)
};

// train.lora (model/lora.h): low-rank adapters on a frozen base, as PEFT's LoRA; rank 0 = off.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 0;  // the update is scaled by alpha / rank; 0: alpha = rank (scale 1)
  double dropout = 0;  // on the adapters' input while training (PEFT's lora_dropout)
  // diffusers' module names, matched as PEFT matches a list: the whole name or its last
  // dot-separated parts (to_q matches transformer_blocks.3.attn1.to_q and attn2.to_q).
  std::vector<std::string> target_modules = {"to_k", "to_q", "to_v"};  // diffusers' script's default
  LoraInit init = LoraInit::gaussian;  // B = 0; A normal(0, 1/rank) or PEFT's default uniform
};

// train.eval (train/previews/eval_loss.h): a held-out loss, every N steps, on the same samples at the
// same timesteps with the same noise each time.
struct EvalConfig {
  std::vector<std::string> data_dir;  // the held-out samples: folders, JSONL/CSV files or indexes
  int64_t every_steps = 0;            // 0: never
  std::vector<int64_t> timesteps = {100, 300, 500, 700, 900};  // of scheduler.train_sampling_steps
  int64_t max_samples = 0;            // 0: every sample of data_dir; else its first N
  double fraction = 0;                // instead of data_dir: this share of data.data_dir, left out of training
};

struct TrainConfig {
  int64_t seed = 42;
  // Where upstream's train.py keeps the empty prompt's features
  // (null_embed_diffusers_<encoder>_<T>token_<C>.pth): read, never written, here
  // (text_encoder.null_embed_path).
  std::string null_embed_root = "output/pretrained_models";
  int64_t num_epochs = 100;
  int64_t max_steps = 0;  // optimizer steps; 0 = bounded by num_epochs only
  double early_stop_hours = 100;  // stop, with a checkpoint, this long after start-up (upstream's); 0 = never
  int64_t global_batch_size = 32;  // samples per optimizer step (a resume may change it)
  int64_t micro_batch_size = 4;    // at most this many samples per process per forward
  // micro_batch_size: auto (not a key of its own): the training takes the micro-batch and the
  // gradient checkpointing `sana-train model --device-memory` suggests for this process's
  // device (train/report/micro_batch.h), and sets micro_batch_size, grad_checkpointing and
  // gc_step to them before the run builds anything.
  bool micro_batch_auto = false;
  // micro_batch_size auto: the memory it fits in, GiB; 0 = the device's (a GPU's memory, on
  // the CPU this host's available memory shared by its processes).
  double micro_batch_memory_gib = 0;
  // > 0: tokens per optimizer step instead of a fixed sample count; each bucket's global
  // batch is this / its tokens per sample (latent patches), rounded, at least 1.
  int64_t batch_tokens = 0;
  // Bitwise-identical parameters at any world size and accumulation split with the same
  // micro_batch_size (CPU, the same threads per process): integer gradient sums.
  bool deterministic = false;
  // Upstream's style (0 = unset): per-process batch and accumulation; when either is set the
  // global batch is train_batch_size x gradient_accumulation_steps x world size.
  int64_t train_batch_size = 0;
  int64_t gradient_accumulation_steps = 0;
  int64_t num_workers = 4;
  bool grad_checkpointing = false;
  int64_t gc_step = 1;  // grad_checkpointing: every gc_step-th block
  // CUDA autocast: trained weights' half copies kept a step (model/working_weights.h);
  // auto: on, but not under offload_optimizer, which chooses device memory over speed.
  WorkingWeights working_weights = WorkingWeights::automatic;
  // ZeRO (docs/memory.md): 0 every rank keeps everything (DDP); 1 optimizer state and EMA
  // sharded by whole parameters; 2 gradients too; 3 parameters too. Upstream's use_fsdp maps to 3.
  int64_t zero_stage = 0;
  double gradient_clip = 1.0;  // global-norm clip; 0 disables
  OptimizerConfig optimizer;
  LrSchedule lr_schedule = LrSchedule::constant;
  LrScheduleArgs lr_schedule_args;
  AutoLr auto_lr = AutoLr::sqrt;  // scale lr by sqrt (or linear) of global_batch_size / 256
  // Upstream's train.py: a resume from a named checkpoint (not latest) restarts the schedule
  // when false; resume_from latest that finds no checkpoint starts from model.load_from, and
  // these carry that checkpoint's optimizer state and schedule position over (a sana-train
  // checkpoint folder; train/optim/lr_scheduler.h).
  bool resume_lr_scheduler = true;
  bool load_from_optimizer = false;
  bool load_from_lr_scheduler = false;
  // OneTrainer's masked training: each sample's `mask` image (JSONL/CSV) weights its loss per
  // latent cell (the mask averaged over the cell), at least masked_loss_unmasked_weight.
  bool masked_loss = false;
  double masked_loss_unmasked_weight = 0.1;
  // A sample without a `mask` field takes its image's alpha channel as the mask. Off by
  // default: many wallpapers and exports carry alpha that is no mask.
  bool masked_loss_alpha = false;
  double prior_loss_weight = 1.0;  // data.class_data_dir: the class images' share of the loss
  bool ema_update = false;       // keep an EMA copy of the weights (upstream's default: off)
  double ema_rate = 0.9999;      // its decay; 0 turns it off too
  // SimpleTuner's --ema_device / --ema_update_interval: cpu keeps the average in host memory;
  // it moves every N-th step, by ema_rate^N (so it spans as many steps as with N = 1).
  StateDevice ema_device = StateDevice::device;
  int64_t ema_update_interval = 1;
  // ZeRO-Offload's design (train/optim/host_optimizer.h): this rank's share of the fp32 master
  // weights and the optimizer state live in host memory, where the update runs.
  bool offload_optimizer = false;
  // Block swapping (model/swapped_blocks.h): a frozen base's last N blocks (below 1: that fraction) on the host.
  double offload_blocks = 0;
  int64_t log_interval = 50;
  // Optimizer steps (counting from 1) rank 0 records with LibTorch's profiler into
  // work_dir/profile/ (train/report/step_profile.h).
  std::vector<int64_t> profile_steps;
  bool cudnn_benchmark = true;          // CUDA: cuDNN times its algorithms per shape once (train/loop/cuda_modes.h)
  std::string cuda_sync_debug = "off";  // CUDA: warn about (warn) or fail on (error) each host wait in a step
  std::string report_to = "tensorboard";  // or none: metrics.jsonl and report/ only
  double peak_tflops = 0;  // the device's peak for MFU; 0: from its name (CUDA), unknown: no MFU
  int64_t save_model_steps = 1000000;
  int64_t save_model_epochs = 1;
  bool visualize = false;
  int64_t eval_sampling_steps = 250;
  std::vector<std::string> validation_prompts = {  // upstream's five
      "dog", "portrait photo of a girl, photograph, highly detailed face, depth of field",
      "Self-portrait oil painting, a beautiful cyborg with golden hair, 8k",
      "Astronaut in a jungle, cold color palette, muted colors, detailed, 8k",
      "A photo of beautiful mountain with realistic sunset and blue lake, highly detailed, masterpiece"};
  int64_t preview_steps = 20;
  double preview_cfg_scale = 4.5;
  int64_t preview_images = 4;
  int64_t preview_every_epochs = 0;  // previews at the end of every N-th epoch too
  PreviewOn preview_on = PreviewOn::shared;  // shared: buckets spread over ranks; rank0: rank 0 alone
  int64_t max_nonfinite = 5;
  LoraConfig lora;
  // What a frozen base's Linear and Conv2d weights are kept in (model/frozen_storage.h):
  // fp32 as loaded, bf16 / fp16 casts, int8 or fp8 (e4m3) per output channel, or NF4 in
  // blocks of 64, its block scales quantised again when frozen_base_double_quant.
  FrozenDtype frozen_base_dtype = FrozenDtype::fp32;
  bool frozen_base_double_quant = false;
  EvalConfig eval;
  SprintTrainConfig sprint;  // SANA-Sprint stage 2 (SprintModelConfig says)
};
// train.working_weights resolved: auto keeps the copies unless the optimizer is offloaded.
inline bool working_weights_on(const TrainConfig& t) {
  if (t.working_weights == WorkingWeights::automatic) return !t.offload_optimizer;
  return t.working_weights == WorkingWeights::on;
}

// controlnet (upstream's ControlNetConfig; docs/controlnet.md): the control maps a ControlNet
// preset trains on, made by the loader from each sample's bucket image, and its previews.
struct ControlNetConfig {
  // canny: made from each image; scribble, hed: upstream's HED maps of it; dataset: each
  // sample's control image (its JSONL/CSV `control` field). Upstream's default: scribble.
  ControlSignal control_signal_type = ControlSignal::canny;
  int64_t canny_low_threshold = 100;   // cv::Canny's thresholds (ControlNet's canny annotator's)
  int64_t canny_high_threshold = 200;
  std::string hed_model;               // scribble, hed: upstream's HED network as TorchScript
  int64_t detect_resolution = 512;     // scribble, hed: the network's short side (upstream's)
  int64_t scribble_thickness = -1;     // 0-24; -1: drawn per sample and epoch (upstream's training)
  // Control images the previews use (upstream's name: any kind of map); empty: the control
  // maps of the dataset's first samples.
  std::vector<std::string> validation_scribble_maps;
  double conditioning_scale = 1.0;  // previews: the weight of the control's injection
};

struct DistConfig {
  Backend backend = Backend::automatic;  // auto | gloo | nccl
  DeviceKind device = DeviceKind::automatic;  // auto | cpu | cuda
  std::string master_addr;
  int64_t master_port = 0;       // 0: from the launcher's environment, else 29500
  double timeout_s = 300.0;
  double heartbeat_timeout_s = 30.0;  // a rank silent this long is declared dead
  std::string socket_ifname;
  bool allow_shared_device = false;   // debugging only: several ranks on one GPU (gloo)
  int64_t threads_per_process = 0;    // CPU threads; 0 = cores / processes on the host
  // A rank declared dead or hung: restart = every rank stops (the launcher restarts from the
  // last checkpoint); continue = the survivors re-form and go on from the last step.
  Elastic elastic = Elastic::restart;
  int64_t min_world_size = 1;  // continue: fewer survivors than this stop the run
  double max_rejoin_wait_s = 600;  // continue: how long a replacement waits to be taken in
};

struct DdpConfig {
  double bucket_cap_mb = 25.0;     // gradient bucket size for the overlapped all-reduce
  bool broadcast_buffers = false;  // rank 0's buffers to all ranks at each step start
};

struct CkptConfig {
  int64_t keep_last_n = 3;
  bool async_save = true;
  bool save_ema = true;
  bool save_optimizer = true;
  int64_t format = 3;  // 3: every rank writes its share (ckpt/shards.h); 2: rank 0 writes all
};

// SANA-1.5's model growth (upstream's ModelGrowthConfig): a deeper model's blocks
// initialised from a shallower checkpoint's, before step 1 (model/growth.h).
struct ModelGrowthConfig {
  std::string pretrained_ckpt_path;  // "" = no growth
  std::string init_strategy = "constant";
  int64_t source_num_layers = 20;
  int64_t target_num_layers = 30;
  struct InitParams {
    int64_t expand_ratio = 3;  // block_expand
    double noise_scale = 0.01;  // progressive
    bool zero_gate = false;     // cyclic, block_expand
    double scale_spec = 0.0;    // constant: the output projections' std
    double scale_others = 0.02;  // constant: the other new weights' std
  } init_params;
};

struct Config {
  // What loading said without failing: upstream keys accepted with no effect here, renamed
  // keys, derived values. Not a config key: never printed as one, never fingerprinted.
  std::vector<std::string> load_notes;
  std::string work_dir = "output/run";
  std::string resume_from;  // "", "latest" or a checkpoint directory
  std::string log_level = "info";
  std::string log_console = "rank0";  // rank0: other ranks' info lines go to their log files only; all
  DataConfig data;
  ModelConfig model;
  VaeConfig vae;
  TextEncoderConfig text_encoder;
  SchedulerConfig scheduler;
  TrainConfig train;
  DistConfig dist;
  DdpConfig ddp;
  CkptConfig ckpt;
  ModelGrowthConfig model_growth;
  ControlNetConfig controlnet;
};

// Micro-steps per optimizer step on `world_size` processes when the global batch splits
// evenly into micro-batches (upstream's batch style always does), or 0 (micro_batch_size
// auto too: the device decides).
int64_t accumulation_steps(const TrainConfig& train, int64_t world_size);

// Whether the global batch follows the world size (upstream's train_batch_size style).
inline bool upstream_batch_style(const TrainConfig& t) {
  return t.train_batch_size > 0 || t.gradient_accumulation_steps > 0;
}
inline bool uses_vae(const VaeConfig& v) { return v.vae_type != VaeType::none; }
inline bool uses_text_encoder(const TextEncoderConfig& t) { return t.text_encoder_name != "none"; }
// Where the empty prompt's features (the null caption) are read from without a text
// encoder: text_encoder.null_embed_path, else upstream's file names under
// train.null_embed_root, in the order tried.
std::vector<std::string> null_embed_candidates(const Config& cfg);
// The first candidate that exists, or "".
std::string null_embed_file(const Config& cfg);

// Whether the EMA copy is kept.
inline bool ema_enabled(const TrainConfig& t) { return t.ema_update && t.ema_rate > 0; }
inline bool prior_preservation(const DataConfig& d) { return !d.class_data_dir.empty(); }
// Whether the run trains LoRA adapters on a frozen base (train.lora.rank > 0).
inline bool lora_enabled(const TrainConfig& t) { return t.lora.rank > 0; }

}  // namespace sana::config
