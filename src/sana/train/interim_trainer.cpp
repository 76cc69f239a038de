#include "sana/train/interim_trainer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "sana/diffusion/flow_matching.h"
#include "sana/diffusion/preview.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/util/log.h"

namespace fs = std::filesystem;

namespace sana::train {

namespace {

// ---------------------------------------------------------------------------------------
// Data: every image under the data folders, center-cropped to a square, in memory.

bool is_image(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".webp" || ext == ".bmp";
}

std::vector<fs::path> list_images(const std::vector<std::string>& sources) {
  std::vector<fs::path> files;
  for (const auto& src : sources) {
    if (!fs::is_directory(src)) {
      throw UnsupportedByInterimTrainer(fmt::format(
          "data.data_dir '{}' is not a folder; the interim trainer reads image folders only", src));
    }
    for (const auto& entry : fs::recursive_directory_iterator(src)) {
      if (entry.is_regular_file() && is_image(entry.path())) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Decodes at a reduced scale when the file is much larger than `size` (JPEG decodes
// 2-8x faster that way), then crops the center square and resizes to size x size.
torch::Tensor load_square(const fs::path& file, int64_t size) {
  cv::Mat img = cv::imread(file.string(), cv::IMREAD_COLOR);
  if (img.empty()) throw std::runtime_error(fmt::format("cannot decode image '{}'", file.string()));
  const int side = std::min(img.rows, img.cols);
  cv::Mat square = img(cv::Rect((img.cols - side) / 2, (img.rows - side) / 2, side, side));
  cv::Mat resized, rgb;
  cv::resize(square, resized, cv::Size(static_cast<int>(size), static_cast<int>(size)), 0, 0,
             cv::INTER_AREA);
  cv::cvtColor(resized, rgb, cv::COLOR_BGR2RGB);
  torch::Tensor t = torch::from_blob(rgb.data, {size, size, 3}, torch::kUInt8).clone();
  return t.permute({2, 0, 1}).to(torch::kFloat32).div(127.5).sub(1.0);
}

// ---------------------------------------------------------------------------------------
// Learning rate: warmup, then constant or cosine.

double learning_rate(const config::TrainConfig& t, int64_t step, int64_t total_steps) {
  const double peak = t.optimizer.lr;
  const int64_t warmup = t.lr_schedule_args.num_warmup_steps;
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (t.lr_schedule == "constant") return peak;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / std::max<int64_t>(1, total_steps - warmup));
  const double floor = t.lr_schedule == "cosine" ? 0.0 : t.lr_schedule_args.final_lr_ratio * peak;
  return floor + (peak - floor) * 0.5 * (1 + std::cos(M_PI * progress));
}

}  // namespace

InterimResult run_interim_training(const config::Config& cfg) {
  const auto& t = cfg.train;
  if (t.optimizer.type != "AdamW") {
    throw UnsupportedByInterimTrainer(fmt::format(
        "train.optimizer.type {}: the interim trainer has AdamW only", t.optimizer.type));
  }
  const auto start = std::chrono::steady_clock::now();
  torch::manual_seed(static_cast<uint64_t>(t.seed));

  const auto files = list_images(cfg.data.data_dir);
  if (static_cast<int64_t>(files.size()) < t.global_batch_size) {
    throw UnsupportedByInterimTrainer(
        fmt::format("data.data_dir holds {} images, fewer than train.global_batch_size {}",
                    files.size(), t.global_batch_size));
  }
  log::info("decoding {} images at {}x{}", files.size(), cfg.data.image_size, cfg.data.image_size);
  std::vector<torch::Tensor> images;
  for (const auto& f : files) images.push_back(load_square(f, cfg.data.image_size));
  const torch::Tensor data = torch::stack(images);
  const int64_t n = data.size(0);

  const auto spec = model::spec_from_config(cfg);
  if (spec.conditioning != model::Conditioning::none || spec.in_channels != 3) {
    throw UnsupportedByInterimTrainer(fmt::format(
        "{} is {}-conditioned with {} input channels; the interim trainer trains unconditional "
        "pixel-space models only (no captions, latents or classes)",
        spec.name, model::conditioning_name(spec.conditioning), spec.in_channels));
  }
  model::SanaMS model(spec, model::BuildOptions{torch::kFloat32, false, static_cast<uint64_t>(t.seed)});
  model->set_grad_checkpointing(t.grad_checkpointing);
  const int64_t params = model->parameter_count();
  const auto& o = t.optimizer;
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(o.lr)
                                    .betas({o.betas.at(0), o.betas.at(1)})
                                    .eps(o.eps.at(0))
                                    .weight_decay(o.weight_decay));

  const int64_t accumulation = t.global_batch_size / t.micro_batch_size;
  const int64_t steps_per_epoch = n / t.global_batch_size;
  int64_t total = steps_per_epoch * t.num_epochs;
  if (t.max_steps > 0) total = std::min(total, t.max_steps);
  log::info("interim trainer: {}, {} parameters; {} images, {} steps/epoch, {} steps, "
            "global batch {} = micro batch {} x {} accumulation",
            spec.name, params, n, steps_per_epoch, total, t.global_batch_size, t.micro_batch_size,
            accumulation);

  InterimResult result;
  result.images = n;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  auto interval_start = std::chrono::steady_clock::now();
  torch::Tensor order;  // this epoch's sample order
  for (int64_t step = 0; step < total; ++step) {
    const int64_t epoch = step / steps_per_epoch;
    if (step % steps_per_epoch == 0) {
      torch::manual_seed(static_cast<uint64_t>(t.seed) * 1000003ULL + static_cast<uint64_t>(epoch));
      order = torch::randperm(n, torch::kLong);
    }
    const double lr = learning_rate(t, step, total);
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    optimizer.zero_grad();
    double step_loss = 0;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const int64_t first = (step % steps_per_epoch) * t.global_batch_size + micro * t.micro_batch_size;
      const auto picked = order.slice(0, first, first + t.micro_batch_size);
      auto x0 = data.index_select(0, picked);
      std::vector<uint32_t> ids;
      for (int64_t k = 0; k < picked.size(0); ++k) ids.push_back(static_cast<uint32_t>(picked[k].item<int64_t>()));
      // Noise and sigma per sample from (seed, epoch, id): the objective the real trainer uses.
      const auto fb = diffusion::make_flow_batch(x0, ids, static_cast<uint64_t>(t.seed), epoch,
                                                 cfg.scheduler);
      auto loss = diffusion::flow_loss(model->forward(fb.noisy, fb.timesteps), fb.target) / accumulation;
      loss.backward();
      step_loss += loss.item<double>();
    }
    if (t.gradient_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), t.gradient_clip);
    optimizer.step();
    if (!std::isfinite(step_loss)) throw std::runtime_error(fmt::format("loss is {} at step {}", step_loss, step + 1));

    interval_loss += step_loss;
    ++interval_steps;
    if ((step + 1) % t.log_interval == 0 || step + 1 == total) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - interval_start).count();
      const double mean = interval_loss / interval_steps;
      if (result.steps == 0) result.first_loss = mean;
      result.last_loss = mean;
      log::info("epoch {} step {}/{} loss {:.4f} lr {:.2e} {:.2f} s/step {:.1f} img/s", epoch + 1,
                step + 1, total, mean, lr, secs / interval_steps,
                interval_steps * t.global_batch_size / secs);
      result.steps = step + 1;
      interval_loss = 0;
      interval_steps = 0;
      interval_start = std::chrono::steady_clock::now();
    }
  }
  result.steps = total;
  // The final weights (upstream's names, safetensors) and, when asked, preview grids.
  const auto weights = fs::path(cfg.work_dir) / "model.safetensors";
  model::save_weights(*model, weights.string(), {{"model", spec.name}, {"steps", std::to_string(total)}});
  result.weights = weights.string();
  if (t.visualize) {
    const auto o = diffusion::preview_options_for(cfg);
    const auto buckets = diffusion::preview_buckets_for(cfg);
    result.previews = diffusion::render_previews(model, buckets, o, (fs::path(cfg.work_dir) / "previews").string(),
                                                 fmt::format("step{:06d}", total));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace sana::train
