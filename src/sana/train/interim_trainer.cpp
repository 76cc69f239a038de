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
// Model: a small timestep-conditioned convolutional denoiser (velocity prediction).

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(-std::log(10000.0) * torch::arange(half, torch::kFloat32) / half);
  auto args = t.unsqueeze(1) * 1000.0 * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

struct ResBlockImpl : torch::nn::Module {
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear ada{nullptr};

  explicit ResBlockImpl(int64_t c) {
    norm1 = register_module("norm1", torch::nn::GroupNorm(8, c));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)));
    norm2 = register_module("norm2", torch::nn::GroupNorm(8, c));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)));
    ada = register_module("ada", torch::nn::Linear(c, 2 * c));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& temb) {
    auto ss = ada->forward(temb).unsqueeze(-1).unsqueeze(-1).chunk(2, 1);
    auto h = norm1->forward(x) * (1 + ss[0]) + ss[1];
    h = conv1->forward(torch::silu(h));
    h = conv2->forward(torch::silu(norm2->forward(h)));
    return x + h;
  }
};
TORCH_MODULE(ResBlock);

struct DenoiserImpl : torch::nn::Module {
  static constexpr int64_t kTimeDim = 256;
  torch::nn::Conv2d in{nullptr}, out{nullptr};
  torch::nn::Sequential t_embedder{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::GroupNorm out_norm{nullptr};

  DenoiserImpl(int64_t channels, int64_t depth) {
    in = register_module("in", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, channels, 3).padding(1)));
    t_embedder = register_module(
        "t_embedder", torch::nn::Sequential(torch::nn::Linear(kTimeDim, channels), torch::nn::SiLU(),
                                            torch::nn::Linear(channels, channels)));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i) blocks->push_back(ResBlock(channels));
    out_norm = register_module("out_norm", torch::nn::GroupNorm(8, channels));
    out = register_module("out", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 3, 3).padding(1)));
    torch::NoGradGuard no_grad;
    out->weight.zero_();
    out->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t) {
    auto temb = t_embedder->forward(timestep_embedding(t, kTimeDim));
    auto h = in->forward(x);
    for (auto& block : *blocks) h = block->as<ResBlock>()->forward(h, temb);
    return out->forward(torch::silu(out_norm->forward(h)));
  }
};
TORCH_MODULE(Denoiser);

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

  Denoiser model(64, 4);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
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
  log::info("interim trainer: conv denoiser, {} parameters; {} images, {} steps/epoch, {} steps, "
            "global batch {} = micro batch {} x {} accumulation",
            params, n, steps_per_epoch, total, t.global_batch_size, t.micro_batch_size,
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
      auto loss = diffusion::flow_loss(model->forward(fb.noisy, fb.sigmas), fb.target) / accumulation;
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
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace sana::train
