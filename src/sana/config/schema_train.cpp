// The `train` section of the schema (config/schema.h): batch, optimizer, schedule,
// checkpoints, reporting and fine-tuning keys.
#include <vector>

#include "sana/config/schema_section.h"

namespace sana::config {

namespace {

void describe_reporting(Section& s, TrainConfig& t) {
  s.add("log_interval", t.log_interval, "optimizer steps between log lines").at_least(1)
      .commonly_used();
  s.add("profile_steps", t.profile_steps,
        "optimizer steps (from 1) rank 0 records with LibTorch's profiler: work_dir/profile/step_<N>.trace.json "
        "(Chrome trace) and step_<N>.ops.tsv (op, calls, cpu_ms, device_ms, share)")
      .at_least(1);
  s.add("cudnn_benchmark", t.cudnn_benchmark,
        "CUDA: cuDNN times its convolution algorithms for each new shape once and keeps the fastest");
  s.add("cuda_sync_debug", t.cuda_sync_debug,
        "CUDA: off; warn: log every operation that makes the host wait for the GPU, with its call site; "
        "error: fail on it")
      .one_of({"off", "warn", "error"});
  s.add("report_to", t.report_to,
        "tensorboard: event files in work_dir/tensorboard (scalars every step, preview grids) besides "
        "metrics.jsonl; none: metrics.jsonl and report/ only")
      .one_of({"tensorboard", "none"})
      .commonly_used();
  s.add("peak_tflops", t.peak_tflops,
        "the accelerator's dense peak TFLOP/s per process for MFU; 0 = known NVIDIA GPUs by name (bf16/fp16 "
        "or TF32), none on CPUs")
      .at_least(0);
  s.add("visualize", t.visualize, "write preview images");
  s.add("eval_sampling_steps", t.eval_sampling_steps, "steps between previews").at_least(1);
  s.add("validation_prompts", t.validation_prompts, "captions of the preview images");
  s.add("preview_steps", t.preview_steps, "sampler steps per preview image").at_least(1);
  s.add("preview_cfg_scale", t.preview_cfg_scale, "classifier-free guidance scale of previews (1: none)")
      .at_least(0);
  s.add("preview_images", t.preview_images, "preview images per bucket").at_least(1);
  s.add("preview_every_epochs", t.preview_every_epochs,
        "also preview at the end of every N-th epoch (0: only every eval_sampling_steps)")
      .at_least(0);
  s.add("preview_on", t.preview_on,
        "shared: each rank renders some buckets; rank0: rank 0 renders all while the others wait");
}

// train.optimizer: which optimizer, its hyperparameters and its 8-bit state's layout.
void describe_optimizer(std::vector<Field>& f, OptimizerConfig& opt) {
  Section o(f, "train.optimizer");
  o.add("type", opt.type, "optimizer").commonly_used();
  o.add("lr", opt.lr, "peak learning rate").above(0).commonly_used();
  o.add("weight_decay", opt.weight_decay, "decoupled weight decay").at_least(0);
  o.add("betas", opt.betas,
        "AdamW, AdamW8bit, Lion, ScheduleFreeAdamW: 2 values; CAME, CAME8bit: 3; Adafactor: none or beta1; Prodigy: 2, or 3 with "
        "beta3 (default: the optimizer's)")
      .at_least(0)
      .at_most(0.999999999);
  o.add("eps", opt.eps,
        "AdamW, AdamW8bit, Prodigy, ScheduleFreeAdamW: 1 value; CAME, Adafactor: 2; Lion: none (default: the optimizer's)")
      .above(0);
  o.add("block_size", opt.block_size, "CAME8bit: rows per quantization block").at_least(1);
  o.add("min_8bit_size", opt.min_8bit_size,
        "CAME8bit: weights with more elements than this keep 8-bit first moments; AdamW8bit: "
        "parameters with at least this many keep 8-bit moments (default: the optimizer's, 16384 / 4096)")
      .at_least(0);
  o.add("clip_threshold", opt.clip_threshold, "Adafactor: the update's RMS is clipped to this").above(0);
  o.add("decay_rate", opt.decay_rate, "Adafactor: the second moment's rate is 1 - step^decay_rate").at_most(0);
  o.add("scale_parameter", opt.scale_parameter, "Adafactor: the step size is scaled by the parameter's RMS");
  o.add("relative_step", opt.relative_step,
        "Adafactor: its own step size min(1e-2, 1/sqrt(step)); lr and the schedule then do not apply");
  o.add("warmup_init", opt.warmup_init, "Adafactor, with relative_step: the step size grows as 1e-6 step");
  o.add("d0", opt.d0, "Prodigy: the first estimate of the step size d").above(0);
  o.add("d_coef", opt.d_coef, "Prodigy: d's estimate is scaled by this (the key to tune)").above(0);
  o.add("growth_rate", opt.growth_rate, "Prodigy: d grows by at most this factor per step (.inf: unbounded)")
      .at_least(1)
      .or_infinite();
  o.add("decouple", opt.decouple, "Prodigy: AdamW's decoupled weight decay (false: into the gradient)");
  o.add("use_bias_correction", opt.use_bias_correction, "Prodigy: Adam's bias correction in the step size");
  o.add("safeguard_warmup", opt.safeguard_warmup, "Prodigy: lr left out of d's denominator (for warmup)");
  o.add("slice_p", opt.slice_p, "Prodigy: d estimated from every slice_p-th element (saves memory)").at_least(1);
  o.add("warmup_steps", opt.warmup_steps,
        "ScheduleFreeAdamW: its linear warmup over this many steps (it takes no train.lr_schedule)")
      .at_least(0);
  o.add("r", opt.r, "ScheduleFreeAdamW: the average weighs step k by k^r");
  o.add("weight_lr_power", opt.weight_lr_power,
        "ScheduleFreeAdamW: the average weighs each step by the largest lr so far to this power");
}

void describe_lora(std::vector<Field>& f, LoraConfig& l) {
  Section s(f, "train.lora");
  s.add("rank", l.rank,
        "0 = off (every weight trains); else LoRA of this rank on a frozen base (docs/finetune.md)")
      .at_least(0)
      .at_most(4096);
  s.add("alpha", l.alpha, "the update is scaled by alpha / rank; 0 = rank (scale 1)").at_least(0);
  s.add("dropout", l.dropout, "dropout on the adapters' input while training (PEFT's lora_dropout)")
      .at_least(0)
      .at_most(0.99);
  s.add("target_modules", l.target_modules,
        "diffusers' module names adapted, matched as PEFT matches (to_q, attn2.to_v, ff.conv_inverted, "
        "to_out.0, proj_out, ...)");
  s.add("init", l.init, "B starts at 0; A from a normal(0, 1/rank) (gaussian) or PEFT's default (kaiming)");
}

// The learning-rate schedule, and what a resume or a start from model.load_from carries
// over of it and of the optimizer (upstream's train.py keys).
void describe_schedule(std::vector<Field>& f, Section& s, TrainConfig& t) {
  s.add("lr_schedule", t.lr_schedule, "learning-rate schedule after warmup");
  Section a(f, "train.lr_schedule_args");
  a.add("num_warmup_steps", t.lr_schedule_args.num_warmup_steps, "linear warmup steps")
      .at_least(0);
  a.add("final_lr_ratio", t.lr_schedule_args.final_lr_ratio,
        "cosine_decay_to_constant: final lr / lr; 0 = upstream's 1 / the auto_lr scale")
      .at_least(0)
      .at_most(1);
  a.add("num_decay", t.lr_schedule_args.num_decay,
        "cosine_decay_to_constant: fraction of the steps the decay takes")
      .above(0)
      .at_most(1);
  a.add("num_cycles", t.lr_schedule_args.num_cycles, "cosine: half-waves over the run").above(0);
  s.add("auto_lr", t.auto_lr, "scale lr by sqrt (or linear) of global_batch_size / 256");
  s.add("resume_lr_scheduler", t.resume_lr_scheduler,
        "false: a resume_from naming a checkpoint folder starts the learning-rate schedule again (warm-up "
        "included); resume_from latest always continues it (as upstream's train.py)");
  s.add("load_from_optimizer", t.load_from_optimizer,
        "resume_from latest with no checkpoint yet: take model.load_from's optimizer state too (a sana-train "
        "checkpoint folder)");
  s.add("load_from_lr_scheduler", t.load_from_lr_scheduler,
        "resume_from latest with no checkpoint yet: continue model.load_from's learning-rate schedule (a "
        "sana-train checkpoint folder)");
}

// What a process keeps where: recomputed activations, half copies, ZeRO's shares, the state
// and the blocks kept in host memory.
void describe_memory(Section& s, TrainConfig& t) {
  s.add("grad_checkpointing", t.grad_checkpointing, "recompute block activations in backward");
  s.add("gc_step", t.gc_step, "grad_checkpointing: every gc_step-th block (1: all; more keeps more memory)")
      .at_least(1);
  s.add("working_weights", t.working_weights,
        "CUDA under model.mixed_precision bf16/fp16: each trained weight's half copy is kept from one optimizer "
        "step to the next, cast once a step instead of at every micro-batch's forward and recompute (2 bytes "
        "per weight; none under zero_stage 3, whose gathers are half already); auto: true unless "
        "offload_optimizer, which puts device memory first");
  s.add("zero_stage", t.zero_stage,
        "0: DDP, every rank keeps all state; 1: optimizer state and EMA split over ranks; 2: gradients too; "
        "3: parameters too (gathered block by block)")
      .at_least(0)
      .at_most(3);
  s.add("offload_optimizer", t.offload_optimizer,
        "fp32 master weights and optimizer state of this rank's share in host memory; the update runs there");
  s.add("offload_blocks", t.offload_blocks,
        "block swapping: the last N blocks (below 1: that fraction of them) kept in host memory, each copied to "
        "the device one block ahead of its use: a frozen base's, or in a full fine-tune under "
        "train.offload_optimizer the trained blocks (docs/memory.md; sana-train model --gpu-memory suggests N)")
      .at_least(0);
}

// What fine-tuning adds: adapters on a frozen base, the base's storage, masks on the loss.
void describe_fine_tuning(std::vector<Field>& f, Section& s, TrainConfig& t) {
  describe_lora(f, t.lora);
  s.add("frozen_base_dtype", t.frozen_base_dtype,
        "what a frozen base (train.lora) keeps its layers' weights in: fp32, bf16, fp16, int8 or fp8 (e4m3, per "
        "output channel), or nf4 (bitsandbytes' NF4, blocks of 64); each layer computes in the training dtype "
        "(docs/finetune.md)");
  s.add("frozen_base_double_quant", t.frozen_base_double_quant,
        "frozen_base_dtype nf4: quantise the block scales again, to uint8 in blocks of 256 (bitsandbytes' "
        "bnb_4bit_use_double_quant: about 0.4 bit less per weight)");
  s.add("prior_loss_weight", t.prior_loss_weight,
        "data.class_data_dir: loss = the instance's + this x the class image's (diffusers' prior_loss_weight)")
      .at_least(0);
  s.add("masked_loss", t.masked_loss,
        "weight each sample's loss by its mask (the `mask` field of JSONL/CSV rows: an image, white = 1), "
        "averaged over each latent cell; a sample without one weighs 1 everywhere (docs/finetune.md)");
  s.add("masked_loss_alpha", t.masked_loss_alpha,
        "masked_loss: a sample without a mask field takes its image's alpha channel (PNG, WebP, TIFF) as the mask");
  s.add("masked_loss_unmasked_weight", t.masked_loss_unmasked_weight,
        "masked_loss: the least weight of a cell (OneTrainer's unmasked weight; 0 ignores what the mask leaves out)")
      .at_least(0)
      .at_most(1);
}

void describe_eval(std::vector<Field>& f, EvalConfig& e) {
  Section s(f, "train.eval");
  s.add("data_dir", e.data_dir,
        "held-out samples (folders, JSONL/CSV metadata or indexes) whose loss is measured every every_steps");
  s.add("every_steps", e.every_steps, "optimizer steps between held-out losses; 0 = none").at_least(0);
  s.add("timesteps", e.timesteps,
        "the timesteps (of scheduler.train_sampling_steps) each sample is measured at, with the same noise every time")
      .at_least(0);
  s.add("fraction", e.fraction,
        "instead of data_dir: hold this share of data.data_dir's samples out of training (drawn from train.seed "
        "and each sample's path) and measure them")
      .at_least(0)
      .at_most(0.5);
  s.add("max_samples", e.max_samples, "measure only the first N held-out samples; 0 = all").at_least(0);
}

}  // namespace

void describe_train(std::vector<Field>& f, TrainConfig& t) {
  Section s(f, "train");
  s.add("seed", t.seed, "seed of every random stream").at_least(0).commonly_used();
  s.add("null_embed_root", t.null_embed_root,
        "folder of upstream's null-embedding files, read when text_encoder.null_embed_path is ''");
  s.add("num_epochs", t.num_epochs, "epochs to train").at_least(1).commonly_used();
  s.add("early_stop_hours", t.early_stop_hours,
        "after the first step that ends this many hours after start-up, save a checkpoint and stop (as upstream; "
        "a resume starts the clock again); 0 = no limit")
      .at_least(0);
  s.add("max_steps", t.max_steps, "optimizer steps to train; 0 = all epochs").at_least(0)
      .commonly_used();
  s.add("global_batch_size", t.global_batch_size, "samples per optimizer step, all processes")
      .at_least(1)
      .commonly_used();
  s.add("micro_batch_size", t.micro_batch_size,
        "samples per process per forward; auto = the largest that fits the device, with the gradient checkpointing "
        "`sana-train model --device-memory` suggests (it sets grad_checkpointing and gc_step)")
      .at_least(1)
      .or_word("auto", t.micro_batch_auto)
      .commonly_used();
  s.add("micro_batch_memory_gib", t.micro_batch_memory_gib,
        "micro_batch_size auto: GiB of memory to fit the run's state and activations in, 2 GiB kept for the CUDA "
        "context; 0 = the device's (a GPU's memory; on the CPU this host's available memory over its processes)")
      .at_least(0);
  s.add("batch_tokens", t.batch_tokens,
        "0 = off; else tokens (latent patches) per optimizer step: each bucket's global batch is this / its "
        "tokens per sample, so large images come fewer to a step")
      .at_least(0);
  s.add("deterministic", t.deterministic,
        "bitwise-identical parameters at any process count and accumulation split with the same micro_batch_size "
        "(gradients summed as integers; ranks take whole micro-batches)");
  s.add("train_batch_size", t.train_batch_size,
        "upstream style, 0 = unset: per-process batch; global = it x accumulation x world size")
      .at_least(0)
      .at_most(1 << 20);
  s.add("gradient_accumulation_steps", t.gradient_accumulation_steps,
        "upstream style, 0 = unset: micro-steps per optimizer step (train_batch_size)")
      .at_least(0)
      .at_most(1 << 20);
  s.add("num_workers", t.num_workers, "data loading threads per process").at_least(0);
  describe_memory(s, t);
  s.add("gradient_clip", t.gradient_clip, "global gradient-norm clip; 0 disables").at_least(0);
  describe_optimizer(f, t.optimizer);
  describe_schedule(f, s, t);
  s.add("ema_update", t.ema_update, "keep an EMA copy of the weights (updated before each step)");
  s.add("ema_rate", t.ema_rate, "EMA decay of the weights; 0 disables").at_least(0).at_most(
      0.999999999);
  s.add("ema_device", t.ema_device, "where the EMA lives: device (the training device) or cpu (host memory)");
  s.add("ema_update_interval", t.ema_update_interval,
        "the EMA moves every N-th step, by ema_rate^N (the same span in steps as N = 1)")
      .at_least(1);
  s.add("save_model_steps", t.save_model_steps, "steps between checkpoints; 0 = none by step count")
      .at_least(0)
      .commonly_used();
  s.add("save_model_epochs", t.save_model_epochs, "epochs between checkpoints; 0 = none at epoch ends (the last and a stop still save)")
      .at_least(0);
  describe_reporting(s, t);
  s.add("max_nonfinite", t.max_nonfinite, "consecutive non-finite steps before aborting")
      .at_least(1);
  describe_fine_tuning(f, s, t);
  describe_eval(f, t.eval);
  describe_sprint_train(s, t.sprint);
}

}  // namespace sana::config
