#include "sana/train/features/prepare_features.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "sana/config/loader.h"
#include "sana/data/array_writer.h"
#include "sana/data/loader.h"
#include "sana/distributed/failure_watch.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/runtime.h"
#include "sana/model/spec.h"
#include "sana/train/options/core_options.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/report/metrics.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/input/shared_dataset.h"
#include "sana/train/test_hooks.h"
#include "sana/util/error.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace fs = std::filesystem;

namespace sana::train {

namespace {

using Clock = std::chrono::steady_clock;
using data::SampleId;

// Where a sample's files go: a thousand samples per folder.
struct Layout {
  fs::path out;
  bool latents = false, text = false;
  bool control = false;  // a ControlNet's control latents (its control maps through the VAE)

  static std::string latent_rel(uint64_t id) { return fmt::format("latents/{:05d}/{:010d}.npy", id / 1000, id); }
  static std::string control_rel(uint64_t id) { return fmt::format("control/{:05d}/{:010d}.npy", id / 1000, id); }
  static std::string text_rel(uint64_t id) { return fmt::format("text/{:05d}/{:010d}.npz", id / 1000, id); }
  static bool exists(const fs::path& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
  }
  // Whether every file this run makes for `id` is there (complete: files are renamed into place).
  bool done(uint64_t id) const {
    return (!latents || exists(out / latent_rel(id))) && (!text || exists(out / text_rel(id))) &&
           (!control || exists(out / control_rel(id)));
  }
};

// What a file's identity is for the settings check: its absolute path and size (a folder's:
// the sizes of the files in it, a Hugging Face snapshot's through its links).
nlohmann::ordered_json file_identity(const std::string& path) {
  std::error_code ec;
  int64_t bytes = -1;
  if (fs::is_directory(path, ec)) {
    bytes = 0;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      const auto size = fs::file_size(entry.path(), ec);  // follows a snapshot's links
      if (!ec) bytes += static_cast<int64_t>(size);
    }
  } else {
    const auto size = fs::file_size(path, ec);
    if (!ec) bytes = static_cast<int64_t>(size);
  }
  return {{"file", fs::absolute(path).lexically_normal().string()}, {"bytes", bytes}};
}

// Everything the features depend on: a rerun into the same folder must have the same.
nlohmann::ordered_json settings_of(const config::Config& cfg, const data::Dataset& ds, const Layout& layout) {
  nlohmann::ordered_json s;
  s["format"] = "sana-train features 2";  // 2: PIL's pixels (data/resample.h)
  s["samples"] = ds.index().size();
  s["dataset"] = ds.fingerprint();  // the index's content and the bucket rule
  s["decode"] = decode_options_for(cfg).describe();
  if (layout.latents) {
    s["vae"] = file_identity(vae_options_for(cfg).vae_pretrained);  // a hub name's folder
    s["vae"]["scale_factor"] = cfg.vae.scale_factor;
    s["vae"]["latent_dim"] = cfg.vae.vae_latent_dim;
    s["vae"]["downsample"] = cfg.vae.vae_downsample_rate;
    if (cfg.vae.tile_size > 0) s["vae"]["tiles"] = {cfg.vae.tile_size, cfg.vae.tile_overlap};
  }
  if (layout.control) {
    const auto& c = cfg.controlnet;
    config::Config images = cfg;  // the maps are made from the images, whatever the config trains on
    images.data.load_vae_feat = false;
    s["control"] = control_map_options_for(images).describe();
    if (!c.hed_model.empty()) s["control_hed"] = file_identity(c.hed_model);
  }
  if (layout.text) {
    const auto& t = cfg.text_encoder;
    const auto resolved = text_encoder_options_for(cfg);  // a hub name's folder
    s["text_encoder"] = file_identity(resolved.text_encoder_path);
    s["text_encoder"]["name"] = t.text_encoder_name;
    s["text_encoder"]["tokenizer"] = resolved.tokenizer_path.empty() ? "" : fs::absolute(resolved.tokenizer_path).string();
    s["text_encoder"]["model_max_length"] = t.model_max_length;
    s["text_encoder"]["caption_channels"] = t.caption_channels;
    s["text_encoder"]["chi_prompt"] = t.chi_prompt;
  }
  return s;
}

// Rank 0: the folder's settings file is written, or checked against this run's.
void claim_folder(const Layout& layout, const nlohmann::ordered_json& mine) {
  const fs::path file = layout.out / "features.json";
  if (Layout::exists(file)) {
    std::ifstream in(file);
    nlohmann::json theirs;
    try {
      theirs = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw UsageError(fmt::format("prepare-features: '{}' is not readable JSON ({}); remove the folder or choose "
                                   "another with --out", file.string(), e.what()), "config error");
    }
    std::vector<std::string> differ;
    for (const auto& [key, value] : mine.items()) {
      if (!theirs.contains(key) || theirs[key] != nlohmann::json(value)) {
        differ.push_back(fmt::format("{}: {} -> {}", key, theirs.contains(key) ? theirs[key].dump() : "none",
                                     value.dump()));
      }
    }
    if (!differ.empty()) {
      throw UsageError(fmt::format("prepare-features: '{}' holds features made with other settings ({}); use another "
                                   "--out, or remove the folder to start over",
                                   layout.out.string(), fmt::join(differ, "; ")), "config error");
    }
    return;
  }
  fs::create_directories(layout.out);
  data::write_file_atomically(file.string(), mine.dump(2) + "\n");
}

// Tests only (TestHooks::kill_after_features, "rank:N"): that rank kills itself after
// writing N samples' files, as a process that dies mid-run.
void kill_for_tests(const std::string& kill_after, int rank, int64_t written) {
  if (TestHooks::matches(kill_after, rank, written)) std::raise(SIGKILL);
}

// One rank's pass: encodes its pending samples in groups of one bucket and writes them.
class FeatureWriter {
 public:
  // `kill_after`: the tests' TestHooks::kill_after_features ("" in production).
  FeatureWriter(const Layout& layout, Encoders enc, torch::Device device, int64_t batch, int rank,
                std::string kill_after)
      : layout_(layout), enc_(std::move(enc)), device_(device), batch_(batch), rank_(rank),
        kill_after_(std::move(kill_after)) {}

  // One sample for the current group; a sample of another bucket ends the group first.
  void add(SampleId id, int bucket, torch::Tensor image, std::string caption, torch::Tensor control = {}) {
    if (!ids_.empty() && bucket != bucket_) flush();
    bucket_ = bucket;
    ids_.push_back(id);
    if (image.defined()) images_.push_back(std::move(image));
    if (control.defined()) controls_.push_back(std::move(control));
    captions_.push_back(std::move(caption));
    if (static_cast<int64_t>(ids_.size()) >= batch_) flush();
  }

  void flush() {
    if (ids_.empty()) return;
    torch::NoGradGuard no_grad;
    torch::Tensor latents, controls, features, mask;
    const auto encode = [&](const std::vector<torch::Tensor>& images) {
      return enc_.vae->encode(torch::cat(images).to(device_)).to(torch::kCPU, torch::kFloat32).contiguous();
    };
    if (layout_.latents) latents = encode(images_);
    if (layout_.control) controls = encode(controls_);
    if (layout_.text) {
      std::tie(features, mask) = enc_.text->encode(captions_);
      features = features.to(torch::kCPU, torch::kFloat32).contiguous();
      mask = mask.to(torch::kCPU, torch::kInt64).contiguous();
    }
    for (size_t i = 0; i < ids_.size(); ++i) {
      const auto n = static_cast<int64_t>(i);
      if (layout_.latents) write_latent(Layout::latent_rel(ids_[i]), latents[n].contiguous());
      if (layout_.control) write_latent(Layout::control_rel(ids_[i]), controls[n].contiguous());
      if (layout_.text) write_text(ids_[i], features[n].contiguous(), mask[n].contiguous());
      ++written_;
      kill_for_tests(kill_after_, rank_, written_);
    }
    ids_.clear();
    images_.clear();
    controls_.clear();
    captions_.clear();
  }

  int64_t written() const { return written_; }

 private:
  void write(const std::string& rel, const std::string& bytes) {
    const fs::path path = layout_.out / rel;
    if (path.parent_path() != made_dir_) {
      fs::create_directories(path.parent_path());
      made_dir_ = path.parent_path();
    }
    data::write_file_atomically(path.string(), bytes);
  }
  void write_latent(const std::string& rel, const torch::Tensor& z) {
    write(rel, data::npy_bytes({"", "<f4", z.sizes().vec(), z.data_ptr(),
                                                   static_cast<size_t>(z.numel()) * sizeof(float)}));
  }
  void write_text(SampleId id, const torch::Tensor& f, const torch::Tensor& m) {
    const std::vector<int64_t> fshape{1, f.size(0), f.size(1)}, mshape{1, m.size(0)};
    write(Layout::text_rel(id),
          data::npz_bytes({{"caption_feature", "<f4", fshape, f.data_ptr(), static_cast<size_t>(f.numel()) * sizeof(float)},
                           {"attention_mask", "<i8", mshape, m.data_ptr(), static_cast<size_t>(m.numel()) * sizeof(int64_t)}}));
  }

  const Layout& layout_;
  Encoders enc_;
  torch::Device device_;
  int64_t batch_;
  int rank_;
  std::string kill_after_;
  int bucket_ = -1;
  std::vector<SampleId> ids_;
  std::vector<torch::Tensor> images_, controls_;
  std::vector<std::string> captions_;
  fs::path made_dir_;
  int64_t written_ = 0;
};

// "prepare-features: 120/500 of this rank's samples (24%), 3.1/s, ETA 2m03s", every few seconds.
class Progress {
 public:
  Progress(int64_t total, dist::Runtime& rt) : total_(total), rt_(rt) {}
  void tick(int64_t done) {
    const auto now = Clock::now();
    if (now - last_beat_ >= std::chrono::seconds(1)) {  // the others wait on this rank's progress
      rt_.work_progress(fmt::format("features/{}", rt_.rank()), done);
      last_beat_ = now;
    }
    if (now - last_ < std::chrono::seconds(5) && done < total_) return;
    last_ = Clock::now();
    const double secs = std::chrono::duration<double>(last_ - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
    log::info("prepare-features: {}/{} of this rank's samples ({:.0f}%), {:.1f}/s, ETA {}", done, total_,
              total_ ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0, rate,
              duration_text(rate > 0 ? static_cast<double>(total_ - done) / rate : -1));
  }

 private:
  int64_t total_;
  dist::Runtime& rt_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now(), last_beat_ = Clock::now();
};

struct ShareCounts {
  int64_t written = 0, existing = 0, bad = 0;
};

// Rank r's samples (id % world == r) without files yet, in bucket order.
std::vector<SampleId> pending_share(const data::Dataset& ds, const Layout& layout, int rank, int world,
                                    ShareCounts& counts) {
  std::vector<std::vector<SampleId>> per_bucket(static_cast<size_t>(ds.buckets().size()));
  for (uint64_t id = static_cast<uint64_t>(rank); id < ds.index().size(); id += static_cast<uint64_t>(world)) {
    if (layout.done(id)) {
      ++counts.existing;
    } else {
      per_bucket[ds.bucket_of(id)].push_back(static_cast<SampleId>(id));
    }
  }
  std::vector<SampleId> out;
  for (const auto& ids : per_bucket) out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

// Decodes the share through the training loader (same decode and crop as training, no
// flip) and encodes it. Bad images are counted and get no files.
void encode_images(const config::Config& cfg, const data::Dataset& ds, const std::vector<SampleId>& ids,
                   const data::ControlMapOptions& control, FeatureWriter& writer, Progress& progress,
                   ShareCounts& counts) {
  std::vector<uint16_t> buckets;
  buckets.reserve(ids.size());
  for (SampleId id : ids) buckets.push_back(ds.bucket_of(id));
  data::PlanStats stats;
  stats.num_samples = static_cast<int64_t>(ids.size());
  const data::EpochPlan plan = data::EpochPlan::from_batches(ids, buckets, 1, 0, stats);
  auto o = loader_options_for(cfg);
  o.caption = data::CaptionChoice::prompt_only();  // features are the sample's own caption's
  o.micro_batch = 1;
  o.random_flip = false;
  o.load_latents = false;
  o.load_text_feat = false;
  o.control = control;  // a ControlNet's maps, made as training makes them (epoch 0's draws)
  data::Loader loader(ds, plan, o);
  int64_t seen = 0;
  while (auto b = loader.next()) {
    ++seen;
    if (b->substituted > 0) {
      ++counts.bad;  // the loader has named the file and the reason
    } else {
      writer.add(b->ids.front(), b->bucket, b->images, b->captions.front(), b->control);
    }
    progress.tick(seen);
  }
  writer.flush();
}

// Text features only: captions come from the index, no image is read.
void encode_captions(const data::Dataset& ds, const std::vector<SampleId>& ids, FeatureWriter& writer,
                     Progress& progress) {
  int64_t seen = 0;
  for (SampleId id : ids) {
    writer.add(id, 0, torch::Tensor(), std::string(ds.index().text(id).caption));
    progress.tick(++seen);
  }
  writer.flush();
}

// Rank 0, after every rank is done: meta.jsonl lists the samples that have every file.
int64_t write_meta(const data::Dataset& ds, const Layout& layout, dist::Runtime& rt, const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  int64_t rows = 0;
  const auto& index = ds.index();
  for (uint64_t id = 0; id < index.size(); ++id) {
    if (id % 100000 == 0) rt.work_progress("features/meta", static_cast<int64_t>(id));
    if (!layout.done(id)) continue;
    const auto& rec = index.record(id);
    const auto text = index.text(id);
    nlohmann::ordered_json row;
    const fs::path image(text.path);
    row["path"] = image.is_absolute() ? image.string() : fs::absolute(image).lexically_normal().string();
    row["caption"] = std::string(text.caption);
    row["width"] = rec.width;
    row["height"] = rec.height;
    if (rec.label >= 0) row["label"] = rec.label;
    if (layout.latents) row["latent"] = Layout::latent_rel(id);
    if (layout.control) row["control_latent"] = Layout::control_rel(id);
    if (layout.text) row["text_feat"] = Layout::text_rel(id);
    out << row.dump() << "\n";
    ++rows;
  }
  out.close();
  if (!out) throw RunError(fmt::format("cannot write '{}'; check the folder's space", tmp));
  fs::rename(tmp, path);
  return rows;
}

// The config that trains on the features: the user's file as its base, the data keys
// switched. Command-line overrides of this run are listed, since a base cannot hold them.
void write_train_config(const PrepareOptions& opts, const PrepareResult& r) {
  const auto abs = [](const std::string& p) { return fs::absolute(p).lexically_normal().string(); };
  std::string y = "# Written by sana-train prepare-features: the config below, training on the features in this\n"
                  "# folder instead of the images (sana-train --config " + abs(r.train_config) + ").\n";
  if (!opts.overrides.empty()) {
    y += fmt::format("# prepare-features ran with these overrides; give training the same where they matter:\n#   {}\n",
                     fmt::join(opts.overrides, " "));
  }
  y += fmt::format("base: {}\ndata:\n  data_dir: [{}]\n", nlohmann::json(abs(opts.config_file)).dump(),
                   nlohmann::json(abs(r.meta)).dump());
  y += fmt::format("  load_vae_feat: {}\n  load_text_feat: {}\n", r.latents, r.text);
  if (r.text) y += fmt::format("text_encoder:\n  null_embed_path: {}\n", nlohmann::json(abs(r.null_embed)).dump());
  data::write_file_atomically(r.train_config, y);
}

// The end of the pass, once this rank's share is written: every rank waits for the others
// (bounded by their progress, not their length), the counts are gathered, and rank 0 writes
// the null caption's features, meta.jsonl and train.yaml while the others wait for it.
PrepareResult finish_pass(const config::Config& cfg, dist::Runtime& rt, const PrepareOptions& opts,
                     const data::Dataset& ds, const Layout& layout, const Encoders& enc, const ShareCounts& mine) {
  const std::string my_work = fmt::format("features/{}", rt.rank());
  rt.work_done(my_work);
  for (int r = 0; r < rt.world_size(); ++r) {
    if (r != rt.rank()) rt.wait_for_work(fmt::format("features/{}", r), r);
  }
  PrepareResult res;
  for (const auto& s : rt.all_gather("prepare-features counts",
                                     fmt::format("{} {} {}", mine.written, mine.existing, mine.bad))) {
    ShareCounts c;
    std::istringstream(s) >> c.written >> c.existing >> c.bad;
    res.written += c.written;
    res.existing += c.existing;
    res.bad += c.bad;
  }
  res.samples = static_cast<int64_t>(ds.index().size());
  res.out = layout.out.string();
  res.meta = (layout.out / "meta.jsonl").string();
  res.latents = layout.latents;
  res.text = layout.text;
  if (rt.rank() == 0) {
    if (layout.text) {
      res.null_embed = (layout.out / "null_embed.safetensors").string();
      const std::string tmp = res.null_embed + ".tmp";
      write_safetensors(tmp, {{"uncond_prompt_embeds", enc.text->empty_prompt().to(torch::kCPU).unsqueeze(0)}},
                        {{"text_encoder", cfg.text_encoder.text_encoder_name}});
      fs::rename(tmp, res.null_embed);
    }
    const int64_t rows = write_meta(ds, layout, rt, res.meta);
    res.train_config = (layout.out / "train.yaml").string();
    if (!opts.config_file.empty()) write_train_config(opts, res);
    if (rows != res.samples - res.bad) {
      log::warn("prepare-features: {} rows in {} for {} samples and {} bad ones", rows, res.meta, res.samples, res.bad);
    }
    rt.work_done("features/meta");
  } else {
    rt.wait_for_work("features/meta", 0);
  }
  return res;
}

PrepareResult run(const config::Config& cfg, dist::Runtime& rt, const PrepareOptions& opts, const TestHooks& hooks) {
  Layout layout;
  layout.out = fs::path(opts.out.empty() ? (fs::path(cfg.work_dir) / "features").string() : opts.out);
  layout.latents = config::uses_vae(cfg.vae);
  layout.text = config::uses_text_encoder(cfg.text_encoder);
  layout.control = layout.latents && model_spec_for(cfg).control_blocks > 0;
  if (!layout.latents && !layout.text) {
    throw UsageError("prepare-features: the config runs no encoder (vae.vae_type is none and text_encoder."
                     "text_encoder_name is none); set vae.vae_type (torchscript or dc-ae) with "
                     "vae.vae_pretrained, and/or text_encoder.text_encoder_name with text_encoder.text_encoder_path",
                     "config error");
  }
  auto dataset = shared_dataset_options_for(cfg);
  dataset.index_delay_ms = hooks.index_delay_ms;
  const data::Dataset ds = open_dataset(dataset, rt);
  const auto settings = settings_of(cfg, ds, layout);
  if (rt.rank() == 0) claim_folder(layout, settings);
  rt.agree("prepare-features settings", settings.dump());  // also: the folder is claimed

  // The encoders as training would run them (training use: images and captions in).
  config::Config source = cfg;
  source.data.load_vae_feat = false;
  source.data.load_text_feat = false;
  Encoders enc = load_encoders(encoder_options_for(source), rt.device(), EncoderUse::training, model::Conditioning::caption);
  if (!layout.text) enc.text.reset();

  ShareCounts mine;
  const auto ids = pending_share(ds, layout, rt.rank(), rt.world_size(), mine);
  log::info("prepare-features: {} sample{} for this rank ({} done before), into {}{}{}{}", ids.size(),
            ids.size() == 1 ? "" : "s", mine.existing, layout.out.string(), layout.latents ? "; latents" : "",
            layout.control ? "; control latents" : "", layout.text ? "; caption features" : "");
  Progress progress(static_cast<int64_t>(ids.size()), rt);
  FeatureWriter writer(layout, enc, rt.device(), std::max<int64_t>(1, opts.batch_size), rt.rank(),
                       hooks.kill_after_features);
  if (!ids.empty() && layout.latents) {
    encode_images(source, ds, ids, layout.control ? control_maps_for(control_map_options_for(source), enc) : data::ControlMapOptions{}, writer,
                  progress, mine);
  } else if (!ids.empty()) {
    encode_captions(ds, ids, writer, progress);
  }
  mine.written = writer.written();

  return finish_pass(cfg, rt, opts, ds, layout, enc, mine);
}

}  // namespace

PrepareResult prepare_features(const config::Config& cfg, const dist::LaunchEnv& env, const PrepareOptions& opts,
                               const TestHooks& hooks) {
  auto rt = dist::Runtime::start(env, runtime_options_for(cfg, hooks), {SANA_VERSION, config::config_fingerprint(cfg)},
                                 dist::flight_record_dir(cfg.work_dir));
  try {
    PrepareResult r = run(cfg, *rt, opts, hooks);
    rt->finish();
    return r;
  } catch (const dist::PeerFailure& e) {
    dist::FlightRecorder::process().dump(e.what());
    throw;
  } catch (const std::exception& e) {
    rt->fail(dist::short_error(e));
    throw;
  }
}

}  // namespace sana::train
