#include "sana/train/trainer.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sana/ckpt/checkpoint.h"
#include "sana/ckpt/safetensors.h"
#include "sana/config/loader.h"
#include "sana/data/dataset.h"
#include "sana/data/loader.h"
#include "sana/diffusion/flow_matching.h"
#include "sana/diffusion/preview.h"
#include "sana/dist/runtime.h"
#include "sana/model/autocast.h"
#include "sana/train/device_feed.h"
#include "sana/model/encoders.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/train/data_guards.h"
#include "sana/train/grad_sync.h"
#include "sana/train/optim.h"
#include "sana/train/report.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace fs = std::filesystem;

namespace sana::train {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// A hash of every parameter's name, shape and bytes, in order: equal on every rank
// exactly when the weights are bitwise equal.
std::string weights_checksum(const torch::nn::Module& model) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const auto& p : model.named_parameters()) {
    XXH3_64bits_update(st, p.key().data(), p.key().size());
    const auto t = p.value().detach().to(torch::kCPU).contiguous();
    for (int64_t d : t.sizes()) XXH3_64bits_update(st, &d, sizeof d);
    XXH3_64bits_update(st, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return fmt::format("{:016x}", h);
}

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<int64_t>(s + 0.5);
  return total >= 3600 ? fmt::format("{}h{:02d}m", total / 3600, (total / 60) % 60)
                       : fmt::format("{}m{:02d}s", total / 60, total % 60);
}

struct Interval {
  double loss = 0, grad_norm = 0, samples = 0;
  int64_t steps = 0;
  double wait0 = 0;
  Clock::time_point start = Clock::now();
  void reset(double wait) {
    *this = Interval{};
    wait0 = wait;
  }
};

data::LoaderOptions loader_options(const config::Config& cfg, int rank, int world, bool pin_memory) {
  auto o = data::loader_options_for(cfg);
  o.rank = rank;
  o.world_size = world;
  o.pin_memory = pin_memory;
  o.micro_batch = cfg.train.micro_batch_size;
  o.random_flip = cfg.data.random_flip;
  return o;
}

}  // namespace

namespace {

int train_on(std::unique_ptr<dist::Runtime>& rt, const config::Config& cfg);

}  // namespace

int train(const config::Config& cfg, const dist::LaunchEnv& env) {
  auto rt = dist::Runtime::start(env, cfg.dist, {SANA_VERSION, config::config_fingerprint(cfg)});
  try {
    return train_on(rt, cfg);
  } catch (const dist::PeerFailure&) {
    throw;  // another rank failed first: it has told everyone
  } catch (const std::exception& e) {
    rt->fail(e.what());  // the others stop now instead of at their next collective's timeout
    throw;
  }
}

namespace {

int train_on(std::unique_ptr<dist::Runtime>& rt, const config::Config& cfg) {
  const auto& t = cfg.train;
  const int rank = rt->rank(), world = rt->world_size();
  const auto device = rt->device();
  DeviceFeed feed(device);
  const int64_t accumulation = config::accumulation_steps(t, world);
  const bool main_rank = rank == 0;

  // --- Data: the same index and plan on every rank --------------------------------------
  // Rank 0 builds the index first (reading every image header once, not once per rank);
  // the others wait for it, then open its cache when work_dir is shared, or build their own
  // when it is not. Waiting ranks time out only when rank 0 stops making progress.
  data::IndexBuildOptions index_options;
  if (main_rank) index_options.on_rows = [&](uint64_t rows) { rt->work_progress("index", static_cast<int64_t>(rows)); };
  const auto dataset = [&] {
    if (!main_rank) rt->wait_for_work("index", 0);
    auto d = data::Dataset::open(cfg, index_options);
    if (main_rank) rt->work_done("index");
    return d;
  }();
  rt->agree("dataset (index content and bucket rule)", dataset.fingerprint());

  // --- Model: rank 0's weights everywhere, checked ----------------------------------------
  const auto spec = model::spec_from_config(cfg);
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, static_cast<uint64_t>(t.seed)});
  if (!cfg.model.load_from.empty()) {
    const auto report = model::load_weights(*net, cfg.model.load_from, cfg.model.load_strict);
    if (report.clean()) {
      log::info("model.load_from: {} from {}", report.summary(), cfg.model.load_from);
    } else {
      log::warn("model.load_from (model.load_strict false): {} from {}", report.summary(), cfg.model.load_from);
    }
  }
  net->to(device);
  net->set_grad_checkpointing(t.grad_checkpointing);
  net->train();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) rt->broadcast(p);
    for (auto& b : net->buffers()) rt->broadcast(b);
  }
  rt->agree("model weights after the broadcast", weights_checksum(*net));

  const auto amp = model::autocast_for(device, cfg.model.mixed_precision);
  if (!device.is_cuda() && cfg.model.mixed_precision != "fp32") {
    log::info("model.mixed_precision {} applies on CUDA; this CPU run trains in fp32", cfg.model.mixed_precision);
  } else if (amp.enabled && cfg.model.mixed_precision == "fp16") {
    log::warn("model.mixed_precision fp16 runs without loss scaling; bf16 is the safe choice");
  }
  std::optional<model::FrozenVae> vae;
  if (cfg.vae.vae_type == "torchscript" && !cfg.data.load_vae_feat) vae = model::FrozenVae::load(cfg.vae, device);
  std::optional<model::FrozenTextEncoder> text;
  if (cfg.text_encoder.text_encoder_name == "torchscript" && !cfg.data.load_text_feat) {
    text = model::FrozenTextEncoder::load(cfg.text_encoder, device);
  }

  std::vector<std::pair<std::string, torch::Tensor>> named;
  std::vector<torch::Tensor> params;
  for (const auto& p : net->named_parameters()) {
    named.emplace_back(p.key(), p.value());
    params.push_back(p.value());
  }
  GradSync sync(*rt, named, cfg.ddp.bucket_cap_mb);
  auto optimizer = make_optimizer(t.optimizer, named);
  std::pair<int64_t, int64_t> guard_restore{0, 0};  // bad samples, reads (rank 0 carries the totals)
  std::vector<torch::Tensor> ema;
  if (t.ema_rate > 0) {
    for (const auto& p : params) ema.push_back(p.detach().clone());
  }

  // --- Resume: rank 0 picks the checkpoint, every rank loads that one ---------------------
  ckpt::TrainerState resume;
  if (!cfg.resume_from.empty()) {
    std::string chosen;
    if (main_rank) {
      if (cfg.resume_from == "latest") {
        const auto r = ckpt::resolve_latest(cfg.work_dir);
        for (const auto& w : r.warnings) log::warn("resume_from latest: {}", w);
        chosen = r.path;
        if (chosen.empty()) log::info("resume_from latest: no checkpoint in {}/checkpoints; starting fresh", cfg.work_dir);
      } else {
        chosen = cfg.resume_from;
      }
    }
    chosen = rt->broadcast_string(chosen);
    if (!chosen.empty()) {
      const auto start = Clock::now();
      auto snap = ckpt::read_checkpoint(chosen);
      resume = snap.state;
      if (resume.global_batch_size != t.global_batch_size || resume.seed != t.seed || resume.model != spec.name) {
        throw std::invalid_argument(fmt::format(
            "resume_from {}: the checkpoint was trained with train.global_batch_size {}, train.seed {} and {}; "
            "this run has {}, {} and {}. Keep them to continue the same sample stream (any world size that "
            "divides the global batch works)",
            chosen, resume.global_batch_size, resume.seed, resume.model, t.global_batch_size, t.seed, spec.name));
      }
      model::load_tensors(*net, {snap.model.begin(), snap.model.end()}, chosen, /*strict=*/true);
      torch::NoGradGuard no_grad;
      if (!ema.empty() && !snap.ema.empty()) {
        std::map<std::string, torch::Tensor> saved_ema(snap.ema.begin(), snap.ema.end());
        for (size_t i = 0; i < named.size(); ++i) {
          const auto it = saved_ema.find(named[i].first);
          if (it == saved_ema.end() || it->second.sizes() != ema[i].sizes()) {
            throw ckpt::CheckpointError(fmt::format("resume_from {}: EMA '{}' is missing or has another shape", chosen,
                                                    named[i].first));
          }
          ema[i].copy_(it->second);
        }
      } else if (!ema.empty()) {
        log::warn("resume_from {}: no EMA weights saved (ckpt.save_ema false); the EMA restarts from the weights", chosen);
      }
      if (snap.optimizer.empty() && resume.global_step > 0) {
        log::warn("resume_from {}: no optimizer state saved (ckpt.save_optimizer false); its moments restart", chosen);
      }
      optimizer->load_state(snap.optimizer);
      if (main_rank) guard_restore = {resume.bad_samples, resume.reads};
      log::info("resumed from {} (saved on {} process{}): epoch {} step {}, global step {}, in {:.2f} s", chosen,
                resume.world_size, resume.world_size == 1 ? "" : "es", resume.epoch + 1, resume.step_in_epoch,
                resume.global_step, std::chrono::duration<double>(Clock::now() - start).count());
      if (resume.config_hash != config::config_fingerprint(cfg)) {
        log::info("the config differs from the checkpoint's (allowed: e.g. a new learning rate or max_steps)");
      }
    }
  }

  // --- How long ------------------------------------------------------------------------
  const int64_t steps_per_epoch = dataset.plan(0).steps();
  int64_t total = steps_per_epoch * t.num_epochs;
  if (t.max_steps > 0) total = std::min(total, t.max_steps);
  log::info("{}: {} parameters ({} conditioning), {} on {}; {} process{}, global batch {} = micro {} x {} "
            "accumulation x {}; {} steps per epoch, {} steps; optimizer {}, {} gradient buckets",
            spec.name, net->parameter_count(), model::conditioning_name(spec.conditioning), spec.in_channels == 3 ? "pixels" : "latents",
            device.str(), world, world == 1 ? "" : "es", t.global_batch_size, t.micro_batch_size, accumulation, world,
            steps_per_epoch, total, optimizer->name(), sync.bucket_count());

  // --- Outputs (rank 0) ------------------------------------------------------------------
  std::ofstream metrics;
  if (main_rank) {
    // A resumed run continues the same file (steps after the checkpoint replace nothing:
    // the file may hold steps past the checkpoint from the interrupted run; report reads
    // the last line of each step).
    metrics.open(fs::path(cfg.work_dir) / "metrics.jsonl", resume.global_step > 0 ? std::ios::app : std::ios::trunc);
    if (!metrics) throw std::runtime_error(fmt::format("cannot write {}/metrics.jsonl", cfg.work_dir));
  }
  auto preview_opts = diffusion::preview_options_for(cfg);
  preview_opts.device = device;
  if (vae && vae->can_decode()) preview_opts.decode = [&](const torch::Tensor& z) { return vae->decode(z); };
  if (text && !t.validation_prompts.empty()) {
    std::tie(preview_opts.caption_features, preview_opts.caption_mask) = text->encode(t.validation_prompts);
  }
  const auto preview_buckets = diffusion::preview_buckets_for(cfg);
  // Previews are shared: rank r renders buckets r, r + W, ...; nobody waits long for anyone.
  // train.preview_on "rank0": rank 0 renders every bucket while the others wait on its
  // progress (a wait that cannot time out while rank 0 keeps sampling).
  const bool rank0_previews = t.preview_on == "rank0";
  auto render_previews = [&](int64_t step, const std::string& why) {
    const std::string work = fmt::format("previews of step {} ({})", step, why);
    std::vector<diffusion::PreviewBucket> mine;
    for (size_t b = 0; b < preview_buckets.size(); ++b) {
      const int owner = rank0_previews ? 0 : static_cast<int>(b % static_cast<size_t>(world));
      if (owner == rank) mine.push_back(preview_buckets[b]);
    }
    if (rank0_previews && !main_rank) {
      rt->wait_for_work(work, 0);
      return;
    }
    auto opts = preview_opts;
    int64_t evaluations = 0;
    if (rank0_previews) opts.on_step = [&] { rt->work_progress(work, ++evaluations); };
    if (!mine.empty()) {
      for (const auto& p : diffusion::render_previews(net, mine, opts, (fs::path(cfg.work_dir) / "previews").string(),
                                                      fmt::format("step{:06d}", step))) {
        log::info("preview: {}", p);
      }
    }
    if (rank0_previews) rt->work_done(work);
  };

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const bool tty = main_rank && isatty(STDERR_FILENO) && !std::getenv("SANA_NO_PROGRESS");

  // --- The loop --------------------------------------------------------------------------
  BadSampleGuard guard(cfg.data.max_bad_fraction);
  guard.restore(guard_restore.first, guard_restore.second);
  int64_t global_step = resume.global_step, skipped = resume.skipped_steps, consecutive_nonfinite = 0;
  double total_bad = static_cast<double>(resume.bad_samples), total_reads = static_cast<double>(resume.reads);
  std::unique_ptr<std::ofstream> ids_log;
  if (std::getenv("SANA_TEST_LOG_IDS")) {
    ids_log = std::make_unique<std::ofstream>(fs::path(cfg.work_dir) / fmt::format("ids.rank{}.w{}.log", rank, world),
                                              std::ios::app);
  }
  // Checkpoints: rank 0 snapshots the state and a background thread writes it.
  ckpt::AsyncSaver saver;
  int64_t last_saved = -1;
  auto save_checkpoint = [&](int64_t epoch_next, int64_t step_next, const char* why) {
    if (global_step == last_saved) return;
    last_saved = global_step;
    if (!main_rank) return;
    const auto start = Clock::now();
    ckpt::Snapshot snap;
    for (const auto& p : net->named_parameters()) snap.model.emplace_back(p.key(), p.value().detach().to(torch::kCPU).clone());
    for (const auto& b : net->named_buffers()) snap.model.emplace_back(b.key(), b.value().detach().to(torch::kCPU).clone());
    if (cfg.ckpt.save_ema) {
      for (size_t i = 0; i < ema.size(); ++i) snap.ema.emplace_back(named[i].first, ema[i].to(torch::kCPU).clone());
    }
    if (cfg.ckpt.save_optimizer) {
      for (const auto& [n, v] : optimizer->state()) snap.optimizer.emplace_back(n, v.to(torch::kCPU).clone());
    }
    auto& st = snap.state;
    st.epoch = epoch_next;
    st.step_in_epoch = step_next;
    st.global_step = global_step;
    st.consumed_samples = global_step * t.global_batch_size;
    st.global_batch_size = t.global_batch_size;
    st.seed = t.seed;
    st.world_size = world;
    st.model = spec.name;
    st.config_hash = config::config_fingerprint(cfg);
    st.bad_samples = static_cast<int64_t>(total_bad);
    st.reads = static_cast<int64_t>(total_reads);
    st.skipped_steps = skipped;
    const double previous = saver.last_write_seconds();
    saver.save(cfg.work_dir, std::move(snap), cfg.ckpt.keep_last_n);
    if (!cfg.ckpt.async_save) saver.wait();
    const double blocked = std::chrono::duration<double>(Clock::now() - start).count();
    log::info("checkpoint {} ({}): the loop waited {:.3f} s{}", ckpt::checkpoint_name(global_step), why, blocked,
              cfg.ckpt.async_save ? fmt::format(" (previous write took {:.3f} s in the background)", previous)
                                  : fmt::format(" (synchronous write {:.3f} s)", saver.last_write_seconds()));
  };
  double first_loss = NAN, last_loss = NAN;
  const auto run_start = Clock::now();
  Interval iv;
  bool stopped = false;
  int stop_signal_seen = 0;
  for (int64_t epoch = resume.epoch; epoch < t.num_epochs && global_step < total && !stopped; ++epoch) {
    const auto plan = dataset.plan(epoch);
    agree_on_epoch_plan(*rt, plan);
    const int64_t first_step = epoch == resume.epoch ? resume.step_in_epoch : 0;
    data::Loader loader(dataset, plan, loader_options(cfg, rank, world, feed.pinned()), first_step);
    iv.reset(loader.wait_seconds());
    for (int64_t step = first_step; step < plan.steps() && global_step < total; ++step) {
      if (cfg.ddp.broadcast_buffers) {
        torch::NoGradGuard no_grad;
        for (auto& b : net->buffers()) rt->broadcast(b);
      }
      const double lr = learning_rate(t, global_step, total);
      // The loss stays on the device until the step's agreement: a read per micro-batch
      // would make the host wait for the GPU and stop copies from overlapping compute.
      torch::Tensor loss_sum = torch::zeros({}, torch::dtype(torch::kFloat64).device(device));
      int64_t height = 0, width = 0;
      for (int64_t micro = 0; micro < accumulation; ++micro) {
        auto batch = loader.next();
        if (!batch) throw std::runtime_error(fmt::format("the loader ended before step {} of epoch {}", step, epoch));
        guard.add(*batch);
        if (ids_log) {  // tests only (SANA_TEST_LOG_IDS): the planned ids each rank trained on
          *ids_log << epoch << ' ' << step << ' ' << fmt::format("{}", fmt::join(batch->ids, " ")) << '\n';
        }
        height = batch->images.defined() ? batch->images.size(2) : batch->latents.size(2) * spec.downsample;
        width = batch->images.defined() ? batch->images.size(3) : batch->latents.size(3) * spec.downsample;
        const bool caption = spec.conditioning == model::Conditioning::caption;
        const bool copy_text = caption && !text;
        torch::Tensor labels;
        if (spec.conditioning == model::Conditioning::class_label) {
          labels = feed.host_tensor(
              torch::tensor(std::vector<int64_t>(batch->labels.begin(), batch->labels.end()), torch::kInt64));
        }
        const auto on_device = feed.to_device({cfg.data.load_vae_feat ? batch->latents : batch->images,
                                               copy_text ? batch->text_feat : torch::Tensor(),
                                               copy_text ? batch->text_mask : torch::Tensor(), labels});
        torch::Tensor x0 = on_device[0];
        if (vae) x0 = vae->encode(x0);
        std::vector<uint32_t> ids(batch->ids.begin(), batch->ids.end());
        const auto fb = diffusion::make_flow_batch(x0, ids, static_cast<uint64_t>(t.seed), epoch, cfg.scheduler,
                                                   spec.conditioning == model::Conditioning::none ? 0.0 : cfg.model.class_dropout_prob);
        model::Condition cond;
        if (caption) {
          if (text) {
            std::tie(cond.y, cond.mask) = text->encode(batch->captions);
          } else {
            cond.y = on_device[1];
            cond.mask = on_device[2];
          }
        } else if (spec.conditioning == model::Conditioning::class_label) {
          cond.y = on_device[3];
        }
        cond.drop = fb.dropped;
        sync.begin_backward(micro == accumulation - 1);
        torch::Tensor loss;
        {
          model::AutocastGuard autocast(amp);
          loss = diffusion::flow_loss(net->forward(fb.noisy, fb.timesteps, cond), fb.target) / static_cast<double>(accumulation);
        }
        loss.backward();
        loss_sum += loss.detach().to(torch::kFloat64);
      }
      sync.finish();

      // Gradients are now equal on every rank, so is their norm. One read from the device
      // (the squares summed on the host in parameter order, as a loop of reads would).
      std::vector<torch::Tensor> squares;
      squares.reserve(params.size() + 1);
      for (const auto& p : params) squares.push_back(p.grad().to(torch::kFloat64).pow(2).sum());
      squares.push_back(loss_sum);
      const auto host = torch::stack(squares).to(torch::kCPU);
      const auto h = host.accessor<double, 1>();
      double sq = 0;
      for (size_t i = 0; i < params.size(); ++i) sq += h[static_cast<int64_t>(i)];
      const double grad_norm = std::sqrt(sq);
      const double local_loss = h[static_cast<int64_t>(params.size())];
      // The step's agreement: one all-reduce of (non-finite, loss, bad, reads, and a
      // "stop requested" slot per rank, so every rank can name who asked).
      const auto [bad, reads] = guard.local();
      std::vector<double> mine = {std::isfinite(local_loss) && std::isfinite(grad_norm) ? 0.0 : 1.0, local_loss, bad,
                                  reads};
      mine.resize(4 + static_cast<size_t>(world), 0.0);
      if (g_stop_signal.load() != 0) mine[4 + static_cast<size_t>(rank)] = 1.0;
      auto flags = torch::tensor(mine, torch::dtype(torch::kFloat64)).to(device);
      rt->all_reduce(flags);
      flags = flags.to(torch::kCPU);
      const auto f = flags.accessor<double, 1>();
      const bool nonfinite = f[0] > 0;
      const double loss_mean = f[1] / world;
      std::vector<int> stop_ranks;
      for (int r = 0; r < world; ++r) {
        if (f[4 + r] > 0) stop_ranks.push_back(r);
      }
      const bool stop_requested = !stop_ranks.empty();
      guard.decide(f[2], f[3]);
      total_bad = f[2];
      total_reads = f[3];

      if (nonfinite) {
        ++skipped;
        ++consecutive_nonfinite;
        log::warn("step {}: non-finite loss or gradient on some rank; the step is skipped on all ranks "
                  "({} in a row, train.max_nonfinite {})",
                  global_step + 1, consecutive_nonfinite, t.max_nonfinite);
        if (consecutive_nonfinite > t.max_nonfinite) {
          throw std::runtime_error(fmt::format(
              "{} non-finite steps in a row (train.max_nonfinite {}): lower train.optimizer.lr or "
              "train.gradient_clip, or check the data",
              consecutive_nonfinite, t.max_nonfinite));
        }
      } else {
        consecutive_nonfinite = 0;
        if (t.gradient_clip > 0 && grad_norm > t.gradient_clip) {
          torch::NoGradGuard no_grad;
          const double scale = t.gradient_clip / (grad_norm + 1e-6);
          for (auto& p : params) p.mutable_grad().mul_(scale);
        }
        optimizer->step(lr);
        if (!ema.empty()) {
          torch::NoGradGuard no_grad;
          for (size_t i = 0; i < params.size(); ++i) ema[i].mul_(t.ema_rate).add_(params[i].detach(), 1 - t.ema_rate);
        }
      }
      for (auto& p : params) p.mutable_grad().zero_();
      ++global_step;

      // --- Reporting ---------------------------------------------------------------------
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      if (std::isfinite(loss_mean)) {
        if (std::isnan(first_loss)) first_loss = loss_mean;
        last_loss = loss_mean;
      }
      iv.loss += loss_mean;
      iv.grad_norm += grad_norm;
      iv.samples += static_cast<double>(t.global_batch_size);
      ++iv.steps;
      if (main_rank) {
        nlohmann::json m = {{"epoch", epoch + 1}, {"step", global_step}, {"epoch_step", step + 1},
                            {"loss", std::isfinite(loss_mean) ? nlohmann::json(loss_mean) : nlohmann::json(nullptr)},
                            {"grad_norm", std::isfinite(grad_norm) ? nlohmann::json(grad_norm) : nlohmann::json(nullptr)},
                            {"lr", lr}, {"height", height}, {"width", width}, {"time_s", elapsed},
                            {"samples_per_s", static_cast<double>(global_step * t.global_batch_size) / std::max(elapsed, 1e-9)},
                            {"skipped", nonfinite}};
        metrics << m.dump() << "\n" << std::flush;
      }
      if (tty) {
        const double eta = elapsed / static_cast<double>(global_step) * static_cast<double>(total - global_step);
        fmt::print(stderr, "\r[{:<30}] {}/{} loss {:.4f} ETA {}   ",
                   std::string(static_cast<size_t>(30 * global_step / total), '#'), global_step, total, loss_mean,
                   duration_text(eta));
      }
      if (global_step % t.log_interval == 0 || global_step == total || stop_requested) {
        const double secs = std::chrono::duration<double>(Clock::now() - iv.start).count();
        const double wait = loader.wait_seconds() - iv.wait0;
        const double eta = elapsed / static_cast<double>(global_step) * static_cast<double>(total - global_step);
        if (tty) fmt::print(stderr, "\n");
        log::info("epoch {} step {}/{} loss {:.4f} grad {:.3f} lr {:.2e} {:.1f} samples/s data wait {:.0f}% {}x{} ETA {}",
                  epoch + 1, global_step, total, iv.loss / static_cast<double>(iv.steps),
                  iv.grad_norm / static_cast<double>(iv.steps), lr, iv.samples / std::max(secs, 1e-9),
                  100.0 * wait / std::max(secs, 1e-9), height, width, duration_text(eta));
        iv.reset(loader.wait_seconds());
      }
      if (t.visualize && t.eval_sampling_steps > 0 && global_step % t.eval_sampling_steps == 0 && global_step != total) {
        render_previews(global_step, "train.eval_sampling_steps");
      } else if (t.visualize && t.preview_every_epochs > 0 && step + 1 == plan.steps() &&
                 (epoch + 1) % t.preview_every_epochs == 0 && global_step != total) {
        render_previews(global_step, fmt::format("end of epoch {}", epoch + 1));
      }
      if (const char* inject = std::getenv("SANA_TEST_FAIL_AT"); inject != nullptr &&
          std::string(inject) == fmt::format("{}:{}", rank, global_step)) {
        // Tests only: a data error on one rank in the middle of an epoch.
        throw data::LoaderError(fmt::format("injected data error at step {} (SANA_TEST_FAIL_AT)", global_step));
      }
      const bool epoch_end = step + 1 == plan.steps();
      const int64_t next_epoch = epoch_end ? epoch + 1 : epoch, next_step = epoch_end ? 0 : step + 1;
      if (t.save_model_steps > 0 && global_step % t.save_model_steps == 0) {
        save_checkpoint(next_epoch, next_step, "train.save_model_steps");
      } else if (epoch_end && t.save_model_epochs > 0 && (epoch + 1) % t.save_model_epochs == 0) {
        save_checkpoint(next_epoch, next_step, "train.save_model_epochs");
      } else if (stop_requested) {
        save_checkpoint(next_epoch, next_step, "stop request");
      } else if (global_step == total) {
        save_checkpoint(next_epoch, next_step, "end of training");
      }
      if (stop_requested) {
        stop_signal_seen = 1;
        log::info("stop requested (SIGINT/SIGTERM) on rank {}: every rank stops after step {}",
                  fmt::join(stop_ranks, ", "), global_step);
        stopped = true;
        break;
      }
    }
  }

  // --- The end ----------------------------------------------------------------------------
  if (t.visualize) render_previews(global_step, "end of training");
  const auto sums = rt->all_gather("final weights checksum", weights_checksum(*net));
  if (std::adjacent_find(sums.begin(), sums.end(), std::not_equal_to<>()) != sums.end()) {
    throw dist::Disagreement(fmt::format("parameters differ between ranks after step {}: checksums {}", global_step,
                                         fmt::join(sums, ", ")));
  }
  log::info("parameters identical on all {} rank{} (checksum {})", world, world == 1 ? "" : "s", sums.front());
  if (main_rank) {
    const auto path = (fs::path(cfg.work_dir) / "model.safetensors").string();
    model::save_weights(*net, path, {{"model", spec.name}, {"step", std::to_string(global_step)}});
    log::info("weights: {}", path);
    if (!ema.empty()) {
      ckpt::NamedTensors tensors;
      for (size_t i = 0; i < named.size(); ++i) tensors.emplace_back(named[i].first, ema[i]);
      ckpt::write_safetensors((fs::path(cfg.work_dir) / "ema.safetensors").string(), tensors,
                              {{"model", spec.name}, {"ema_rate", fmt::format("{}", t.ema_rate)}});
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  log::info("done: {} steps in {:.1f} s ({} skipped); loss {:.4f} (first step) -> {:.4f} (last step){}", global_step,
            seconds, skipped, first_loss, last_loss, stop_signal_seen ? "; stopped on request" : "");
  if (main_rank) {
    metrics.close();
    const auto rep = write_report(cfg.work_dir);
    if (!rep.error.empty()) log::warn("report: {}", rep.error);
    for (const auto& p : rep.plots) log::info("plot: {}", p);
  }
  saver.wait();
  if (main_rank && last_saved >= 0) log::info("checkpoint: {}", saver.last_path());
  rt->finish();
  return kExitOk;
}

}  // namespace

}  // namespace sana::train
