#include "sana/train/step/train_step.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <optional>

#include "sana/data/epoch_plan.h"
#include "sana/diffusion/flow_matching.h"
#include "sana/util/error.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace sana::train {

TrainStep::TrainStep(StepOptions options, model::SanaMS& model, const Encoders& encoders,
                     parallel::Reducer& reducer)
    : o_(std::move(options)),
      model_(model),
      encoders_(encoders),
      reducer_(reducer),
      feed_(model->parameters().front().device()),
      amp_(model::autocast_for(model->parameters().front().device(), o_.half)) {
  if (o_.log_ids) {
    const auto path = std::filesystem::path(o_.work_dir) / fmt::format("ids.rank{}.w{}.log", o_.rank, o_.world_size);
    ids_log_ = std::make_unique<std::ofstream>(path, std::ios::app);
  }
  if (o_.dump_batches) {
    dump_dir_ = (std::filesystem::path(o_.work_dir) / "batches").string();
    std::filesystem::create_directories(dump_dir_);
  }
}

StepOutput TrainStep::run(data::Loader& loader, int64_t epoch, int64_t step, BadSampleGuard& guard,
                          double loss_scale) {
  // The loss stays on the device until the step's agreement: a read per micro-batch
  // would make the host wait for the GPU and stop copies from overlapping compute.
  const auto device = model_->parameters().front().device();
  StepOutput out;
  dump_epoch_ = epoch;
  dump_step_ = step;
  out.loss_sum = torch::zeros({}, torch::dtype(torch::kFloat64).device(device));
  std::vector<data::Batch> kept;  // train.deterministic: for a run again after an overflow
  int64_t count = 1;  // this rank's micro-batches in the step: known from the first
  int64_t runs = 1;   // and how many it runs (runs_for)
  std::optional<data::Batch> last;  // for the padding
  for (int64_t micro = 0; micro < count; ++micro) {
    std::optional<data::Batch> batch = next_batch(loader, epoch, step, micro, guard, out);
    count = batch->micro_count;
    runs = runs_for(*batch);
    forward_backward(*batch, epoch, micro == runs - 1, loss_scale, out);
    if (runs > count && micro == count - 1) last = *batch;
    if (o_.deterministic) kept.push_back(std::move(*batch));
  }
  for (int64_t micro = count; micro < runs; ++micro) forward_backward(*last, epoch, micro == runs - 1, loss_scale, out, true);
  finalize(out.times);
  // train.deterministic: a gradient too large for the integer sums on some rank; every rank
  // runs the step's micro-batches again at the smaller scale the reducer chose.
  for (int again = 1; reducer_.overflowed(); ++again) {
    if (again > 8) {
      throw RunError(fmt::format("train.deterministic: step {} of epoch {}: the gradients overflow the fixed-point "
                                 "sums even at a 2^-96 smaller scale; check the learning rate and the data",
                                 step + 1, epoch + 1));
    }
    log::info("train.deterministic: step {} of epoch {}: a gradient overflowed the integer sums; its micro-batches "
              "run again at a smaller scale ({})",
              step + 1, epoch + 1, again);
    out.loss_sum.zero_();
    for (int64_t micro = 0; micro < runs; ++micro) {
      const bool pad = micro >= static_cast<int64_t>(kept.size());
      forward_backward(pad ? kept.back() : kept[static_cast<size_t>(micro)], epoch, micro == runs - 1, loss_scale, out, pad);
    }
    finalize(out.times);
  }
  return out;
}

data::Batch TrainStep::next_batch(data::Loader& loader, int64_t epoch, int64_t step, int64_t micro,
                                  BadSampleGuard& guard, StepOutput& out) {
  std::optional<data::Batch> batch;
  {
    PhaseTimer waiting(out.times, &StepTimes::data);
    batch = loader.next();
  }
  if (!batch) throw RunError(fmt::format("the loader ended before step {} of epoch {}", step + 1, epoch + 1));
  if (batch->step != step || batch->micro_step != micro) {
    throw RunError(fmt::format("the loader gave micro-batch {} of step {} for micro-batch {} of step {}",
                               batch->micro_step, batch->step, micro, step));
  }
  out.largest_micro_batch = std::max<int64_t>(out.largest_micro_batch, static_cast<int64_t>(batch->ids.size()));
  out.samples = batch->global_batch;
  guard.add(*batch);
  if (ids_log_) *ids_log_ << epoch << ' ' << step << ' ' << fmt::format("{}", fmt::join(batch->ids, " ")) << std::endl;
  const int64_t downsample = model_->spec().downsample;
  out.height = batch->images.defined() ? batch->images.size(2) : batch->latents.size(2) * downsample;
  out.width = batch->images.defined() ? batch->images.size(3) : batch->latents.size(3) * downsample;
  return std::move(*batch);
}

std::vector<TrainStep::Prepared> TrainStep::prepare(data::Loader& loader, int64_t epoch, int64_t step,
                                                    BadSampleGuard& guard, StepOutput& out) {
  std::vector<Prepared> micro;
  PhaseTimer compute(out.times, &StepTimes::forward_backward);  // the encoders' time goes to out.times.encoders
  for (int64_t i = 0, count = 1; i < count; ++i) {
    compute.pause();
    const auto batch = next_batch(loader, epoch, step, i, guard, out);
    compute.resume();
    count = batch.micro_count;
    auto in = inputs(batch, compute, out.times);
    micro.push_back({in.x0, in.cond, batch.ids});
  }
  return micro;
}

void TrainStep::finalize(StepTimes& times) {
  PhaseTimer waiting(times, &StepTimes::allreduce);
  reducer_.finalize();
}

int64_t TrainStep::runs_for(const data::Batch& batch) const {
  if (!o_.forwards_collective) return batch.micro_count;
  return std::max(batch.micro_count, data::most_micro_batches(batch.global_batch, o_.micro_batch_size,
                                                              o_.world_size, o_.deterministic));
}

void TrainStep::forward_backward(const data::Batch& batch, int64_t epoch, bool last, double loss_scale, StepOutput& out,
                                 bool padding) {
  PhaseTimer compute(out.times, &StepTimes::forward_backward);
  reducer_.begin_backward(last);
  // Each sample's loss / the global batch: summed over micro-batches and ranks (the
  // reducer sums), the gradient is the whole batch's mean, however it was split.
  const double weight =
      padding ? 0.0 : static_cast<double>(batch.ids.size()) / static_cast<double>(batch.global_batch);
  const auto loss = micro_loss(batch, epoch, weight, compute, out.times);
  (loss_scale == 1.0 ? loss : loss * loss_scale).backward();
  if (!padding) out.loss_sum += loss.detach().to(torch::kFloat64);
}

TrainStep::Inputs TrainStep::inputs(const data::Batch& batch, PhaseTimer& compute, StepTimes& times) {
  const auto& spec = model_->spec();
  const bool copy_text = spec.conditioning == model::Conditioning::caption && !encoders_.text;
  torch::Tensor labels;
  if (spec.conditioning == model::Conditioning::class_label) {
    labels = feed_.host_tensor(torch::tensor(std::vector<int64_t>(batch.labels.begin(), batch.labels.end()), torch::kInt64));
  }
  const auto on_device = feed_.to_device({o_.precomputed_latents ? batch.latents : batch.images,
                                          copy_text ? batch.text_feat : torch::Tensor(),
                                          copy_text ? batch.text_mask : torch::Tensor(), labels, batch.control,
                                          batch.masks, batch.prior_images});
  Inputs in;
  in.x0 = on_device[0];
  if (on_device[6].defined()) {  // data.class_data_dir: the class images' rows after the samples'
    in.prior_rows = on_device[6].size(0);
    in.x0 = torch::cat({in.x0, on_device[6]});
  }
  // ControlNet: the control maps enter the model as the images do (upstream's pipeline
  // VAE-encodes the control image with the run's autoencoder and scale factor).
  in.control = on_device[4];
  compute.pause();
  if (encoders_.vae) {
    PhaseTimer encoding(times, &StepTimes::encoders);
    in.x0 = encoders_.vae->encode(in.x0);
    if (in.control.defined()) in.control = encoders_.vae->encode(in.control);
  }
  {
    PhaseTimer encoding(times, &StepTimes::encoders);  // the text encoder, when the run has one
    in.cond = condition(batch, on_device);
  }
  compute.resume();
  // train.masked_loss: the masks averaged over each cell of x0's grid (latent or pixel); the
  // class images' rows are unmasked.
  if (on_device[5].defined()) {
    in.loss_weights = diffusion::cell_weights(on_device[5], in.x0.size(2), in.x0.size(3), o_.unmasked_weight);
    if (in.prior_rows > 0) in.loss_weights = torch::cat({in.loss_weights, torch::ones_like(in.loss_weights)});
  }
  return in;
}

torch::Tensor TrainStep::micro_loss(const data::Batch& batch, int64_t epoch, double weight, PhaseTimer& compute,
                                    StepTimes& times) {
  auto in = inputs(batch, compute, times);
  const auto& spec = model_->spec();
  std::vector<uint32_t> ids(batch.ids.begin(), batch.ids.end());
  // A class image's noise, timestep and dropout are drawn for the sample it trains beside,
  // from a stream of their own (the id's top bit).
  for (int64_t i = 0; i < in.prior_rows; ++i) ids.push_back(batch.ids[static_cast<size_t>(i)] | 0x80000000u);
  const double drop = spec.conditioning == model::Conditioning::none ? 0.0 : o_.class_dropout_prob;
  const auto fb = diffusion::make_flow_batch(in.x0, ids, o_.seed, epoch, o_.timesteps, drop);
  in.cond.drop = fb.dropped;
  in.cond.control = in.control;
  if (!dump_dir_.empty() && weight > 0) dump(fb, in, weight);
  model::AutocastGuard autocast(amp_);
  const auto prediction = model_->forward(fb.noisy, fb.timesteps, in.cond);
  return loss_of(prediction, fb.target, in) * weight;
}

torch::Tensor TrainStep::loss_of(const torch::Tensor& prediction, const torch::Tensor& target, const Inputs& in) const {
  const auto loss = [&](int64_t first, int64_t rows, bool masked) {
    const auto p = prediction.narrow(0, first, rows), t = target.narrow(0, first, rows);
    return masked ? diffusion::masked_flow_loss(p, t, in.loss_weights.narrow(0, first, rows))
                  : diffusion::flow_loss(p, t);
  };
  const int64_t samples = prediction.size(0) - in.prior_rows;
  const bool masked = in.loss_weights.defined();
  if (in.prior_rows == 0) return loss(0, samples, masked);
  return loss(0, samples, masked) + o_.prior_loss_weight * loss(samples, in.prior_rows, false);
}

std::vector<double> TrainStep::eval_losses(const data::Batch& batch, const std::vector<int64_t>& timesteps) {
  torch::NoGradGuard no_grad;
  StepTimes times;
  const NoPhaseMarks unmarked;  // inside the step's checkpoint_preview phase on the device too
  PhaseTimer compute(times, &StepTimes::forward_backward);
  auto in = inputs(batch, compute, times);
  TORCH_CHECK(in.x0.size(0) == 1, "eval_losses takes one sample");
  const auto rows = static_cast<int64_t>(timesteps.size());
  // The sample once per timestep: its condition, control and mask repeated alike.
  const auto repeat = [&](const torch::Tensor& t) {
    return t.defined() ? t.index_select(0, torch::zeros({rows}, torch::dtype(torch::kInt64).device(t.device())))
                       : t;
  };
  const auto fb = diffusion::make_eval_batch(repeat(in.x0), batch.ids.at(0), o_.seed, timesteps, o_.timesteps);
  in.cond.y = repeat(in.cond.y);
  in.cond.mask = repeat(in.cond.mask);
  in.cond.drop = fb.dropped;
  in.cond.control = repeat(in.control);
  model::AutocastGuard autocast(amp_);
  const auto prediction = model_->forward(fb.noisy, fb.timesteps, in.cond).to(torch::kFloat32);
  auto squares = (prediction - fb.target.to(torch::kFloat32)).pow(2);
  if (in.loss_weights.defined()) squares = squares * repeat(in.loss_weights);
  const auto per_row = squares.flatten(1).mean(1).to(torch::kFloat64).cpu().contiguous();
  return std::vector<double>(per_row.data_ptr<double>(), per_row.data_ptr<double>() + rows);
}

void TrainStep::dump(const diffusion::FlowBatch& fb, const Inputs& in, double weight) {
  NamedTensors tensors{{"noisy", fb.noisy}, {"timesteps", fb.timesteps}, {"target", fb.target},
                       {"weight", torch::tensor({weight}, torch::kFloat64)}};
  if (in.control.defined()) tensors.emplace_back("control", in.control);
  if (in.loss_weights.defined()) tensors.emplace_back("loss_weights", in.loss_weights.to(torch::kCPU));
  if (in.prior_rows > 0) {  // the last prior_rows rows are class images, weighted prior_loss_weight
    tensors.emplace_back("prior_rows", torch::tensor({in.prior_rows}, torch::kInt64));
    tensors.emplace_back("prior_loss_weight", torch::tensor({o_.prior_loss_weight}, torch::kFloat64));
  }
  write_safetensors(fmt::format("{}/r{}.{:06d}.safetensors", dump_dir_, o_.rank, dumped_++), tensors,
                    {{"epoch", std::to_string(dump_epoch_)}, {"step", std::to_string(dump_step_)}});
}

model::Condition TrainStep::condition(const data::Batch& batch, const std::vector<torch::Tensor>& on_device) {
  model::Condition cond;
  const auto conditioning = model_->spec().conditioning;
  if (conditioning == model::Conditioning::caption && encoders_.text) {
    auto captions = batch.captions;
    if (batch.prior_images.defined()) captions.resize(2 * batch.captions.size(), o_.class_prompt);
    std::tie(cond.y, cond.mask) = encoders_.text->encode(captions);
  } else if (conditioning == model::Conditioning::caption) {
    cond.y = on_device[1];
    cond.mask = on_device[2];
  } else if (conditioning == model::Conditioning::class_label) {
    cond.y = on_device[3];
  }
  return cond;
}

torch::Tensor grad_square_and_loss(const std::vector<torch::Tensor>& grads, const torch::Tensor& loss_sum) {
  torch::Tensor square;  // summed one bucket after another, as the host summed them before
  for (const auto& g : grads) {
    // Each bucket's norm accumulated in float64 as ATen's reduction reads the float32
    // elements: no float64 copy of every gradient on the CPU. Float64 accumulation keeps the
    // norm the same, to 1e-11, however the elements are split into buckets or ZeRO segments
    // (a float32 sum differs by 1e-7 between splits, enough to move CAME8bit's codes).
    const auto f = g.scalar_type() == torch::kFloat32 ? g : g.to(torch::kFloat32);
    const auto norm = at::linalg_vector_norm(f, 2, {}, false, torch::kFloat64);
    square = square.defined() ? square + norm * norm : norm * norm;
  }
  const auto loss = loss_sum.to(torch::kFloat64);
  if (!square.defined()) square = torch::zeros_like(loss);
  return torch::stack({square, loss});
}

void unscale_and_clip(const std::vector<torch::Tensor>& grads, double grad_norm, double loss_scale, double clip) {
  double factor = 1.0 / loss_scale;
  if (clip > 0 && grad_norm > clip) factor *= clip / (grad_norm + 1e-6);
  if (factor == 1.0) return;
  torch::NoGradGuard no_grad;
  for (const auto& g : grads) g.mul_(factor);
}

bool loss_scaling(const torch::Device& device, at::ScalarType half) {
  const auto amp = model::autocast_for(device, half);
  return amp.enabled && amp.dtype == at::kHalf;
}

at::ScalarType compute_type(const torch::Device& device, at::ScalarType half) {
  const auto amp = model::autocast_for(device, half);
  return amp.enabled ? amp.dtype : at::kFloat;
}


}  // namespace sana::train
