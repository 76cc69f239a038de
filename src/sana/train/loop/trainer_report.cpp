// What the run tells about itself: the start-up lines (the model, the batch, the parts),
// the device's peak for MFU, and after the first step what each rank holds (memory.json).
#include <fmt/format.h>

#include <filesystem>
#include <vector>

#include "sana/train/input/batching.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/report/device_peak.h"
#include "sana/train/loop/trainer.h"
#include "sana/util/log.h"

namespace sana::train {

// One device's peak FLOP/s for MFU: train.peak_tflops, else a known CUDA GPU's by name
// (bf16/fp16 under autocast, TF32 otherwise); 0 on CPUs and unknown GPUs (no MFU).
double Trainer::device_peak_flops() const {
  if (cfg_.train.peak_tflops > 0) return cfg_.train.peak_tflops * 1e12;
  if (!rt_.device().is_cuda()) return 0;
  const std::string name = cuda_device_name(rt_.device().index());
  const bool half = cfg_.model.mixed_precision != config::Precision::fp32;
  const double tflops = peak_tflops_for(name, half);
  if (tflops > 0) {
    log::info("MFU against {}'s {:.0f} TFLOP/s ({}, dense; train.peak_tflops overrides)", name, tflops,
              half ? "bf16/fp16" : "TF32; fp32 products that do not use TF32 reach less");
  } else {
    log::info("MFU: the peak of '{}' is not known here; set train.peak_tflops to see it", name);
  }
  return tflops * 1e12;
}

void Trainer::log_start() const {
  const int world = rt_.world_size();
  if (!rt_.device().is_cuda() && cfg_.model.mixed_precision != config::Precision::fp32) {
    log::info("model.mixed_precision {} applies on CUDA; this CPU run trains in fp32",
              config::name_of(cfg_.model.mixed_precision));
  } else if (update_.scaler->enabled()) {
    log::info("model.mixed_precision fp16: dynamic loss scaling from {:g} (as torch's GradScaler)",
              update_.scaler->scale());
  }
  const char* conditioning = model_.spec.conditioning == model::Conditioning::caption       ? "caption-conditioned"
                             : model_.spec.conditioning == model::Conditioning::class_label ? "class-conditioned"
                                                                                       : "unconditional";
  log::info("{}: {:.2f} M parameters, {}, {} on {}; {} process{}, {}; {} steps per epoch, {} steps; "
            "optimizer {}{}, {} gradient buckets{}{}",
            model_.spec.name, static_cast<double>(model_.net->parameter_count()) / 1e6, conditioning,
            model_.spec.in_channels == 3 ? "pixels" : "latents", rt_.device().str(), world, world == 1 ? "" : "es",
            batch_text(*input_.dataset, batch_options_for(cfg_), rt_.rank(), world), epoch_plan(0, true).steps(),
            run_.total_steps(),
            update_.optimizer->name(),
            update_.optimizer->on_host() ? " in host memory with fp32 master weights (train.offload_optimizer)" : "",
            update_.reducer->bucket_count(), update_.zero->describe(cfg_.train.deterministic),
            model_.trainable->describe());
  if (const auto kind = kind_->describe(); !kind.empty()) log::info("{}", kind);
  const auto& opt = cfg_.train.optimizer;
  if (opt.type == config::OptimizerType::Adafactor && opt.relative_step) {
    log::info("Adafactor with relative_step: its own step size min({}, 1/sqrt(step)){}; train.optimizer.lr and "
              "train.lr_schedule do not apply (relative_step false uses them)",
              opt.warmup_init ? "1e-6 step" : "1e-2", opt.scale_parameter ? " times each parameter's RMS" : "");
  }
  if (opt.type == config::OptimizerType::ScheduleFreeAdamW) {
    log::info("ScheduleFreeAdamW: lr {:g}, its own warmup over {} steps, no schedule; previews, the held-out loss and "
              "the final weights are its averaged x, checkpoints hold its y and z (export --from a checkpoint makes x)",
              opt.lr, opt.warmup_steps);
  }
}

void Trainer::report_memory(const PeakProbe& activations, const StepOutput& step) {
  report_.memory_reported = true;
  MemoryUse mine;
  mine.rank = rt_.rank();
  std::vector<torch::Tensor> params, state;
  for (const auto& t : model_.trainable->all_tensors()) {  // the base and its adapters; swapped blocks in host memory
    if (!model_.swapped || !model_.swapped->swapped(t)) params.push_back(t);
  }
  if (model_.swapped) mine.host_blocks = bytes_of(model_.swapped->parameters());  // a trained block's: its host buckets
  for (const auto& [name, t] : update_.optimizer->state()) state.push_back(t);
  mine.parameters = bytes_of(params);
  // Streamed to the host, the gradients are the optimizer's host gradients.
  if (!update_.reducer->gradients_on_host()) mine.gradients = bytes_of(update_.reducer->flat_gradients());
  (update_.optimizer->on_host() ? mine.host_optimizer : mine.optimizer) = bytes_of(state);
  mine.host_weights = bytes_of(update_.optimizer->host_weights());
  mine.host_gradients = bytes_of(update_.optimizer->host_gradients());
  (update_.ema->on_host() ? mine.host_ema : mine.ema) = bytes_of(update_.ema->averages());
  mine.gathered = update_.zero->peak_gathered();
  mine.working = model::working_weights_use(*model_.net).bytes;
  if (model_.encoders.vae) mine.encoders += model_.encoders.vae->bytes();
  if (model_.encoders.text) mine.encoders += model_.encoders.text->bytes();
  mine.activations_peak = activations.growth();
  mine.activations_source = activations.source();
  const int64_t cell = model_.spec.downsample * model_.spec.patch;
  mine.micro_batch = step.largest_micro_batch;
  mine.h_tokens = step.height / cell;
  mine.w_tokens = step.width / cell;
  log::info("{}", mine.line());
  const auto all = rt_.all_gather("memory", mine.json());  // collective
  if (!main_rank()) return;
  std::vector<MemoryUse> ranks;
  for (const auto& j : all) ranks.push_back(MemoryUse::from_json(j));
  write_memory_json((std::filesystem::path(cfg_.work_dir) / "memory.json").string(), ranks);
}

}  // namespace sana::train
