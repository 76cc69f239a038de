// Checks a typed Config: bounds and choices from the schema, then combinations of keys,
// then (when the run will touch them) paths on disk.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "sana/config/loader.h"
#include "sana/config/schema.h"
#include "sana/config/checks.h"
#include "sana/config/encoder_source.h"
#include "sana/config/upstream.h"

namespace fs = std::filesystem;

namespace sana::config {

std::vector<std::string> null_embed_candidates(const Config& cfg) {
  const auto& text = cfg.text_encoder;
  if (!text.null_embed_path.empty()) return {text.null_embed_path};
  const std::filesystem::path root(cfg.train.null_embed_root);
  return {(root / fmt::format("null_embed_diffusers_{}_{}token_{}.pth", text.text_encoder_name, text.model_max_length,
                              text.caption_channels)).string(),
          (root / fmt::format("null_embed_diffusers_{}token.pth", text.model_max_length)).string()};
}

std::string null_embed_file(const Config& cfg) {
  for (const auto& path : null_embed_candidates(cfg)) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return "";
}

int64_t accumulation_steps(const TrainConfig& train, int64_t world_size) {
  const int64_t per_micro_step = train.micro_batch_size * world_size;
  if (train.micro_batch_auto || per_micro_step <= 0 || train.global_batch_size % per_micro_step != 0) return 0;
  return train.global_batch_size / per_micro_step;
}

void resolve_defaults(Config& config, const OriginMap& origins) {
  auto& opt = config.train.optimizer;
  const bool came = is_came(opt.type);
  const bool lion = opt.type == OptimizerType::Lion;
  const bool adafactor = opt.type == OptimizerType::Adafactor;
  const bool prodigy = opt.type == OptimizerType::Prodigy;
  const bool schedule_free = opt.type == OptimizerType::ScheduleFreeAdamW;
  // Adafactor keeps no first moment unless a beta1 is given (transformers' beta1=None).
  if (opt.betas.empty() && !adafactor) {
    opt.betas = came   ? std::vector<double>{0.9, 0.999, 0.9999}
                : lion ? std::vector<double>{0.9, 0.99}  // lion-pytorch's
                       : std::vector<double>{0.9, 0.999};
  }
  if (opt.eps.empty() && !lion) {
    opt.eps = came        ? std::vector<double>{1e-30, 1e-16}
              : adafactor ? std::vector<double>{1e-30, 1e-3}  // transformers'
              : prodigy || schedule_free ? std::vector<double>{1e-8}  // prodigyopt's, schedulefree's
                          : std::vector<double>{1e-10};
  }
  // Prodigy's lr scales the step size it finds: 1 unless given (prodigyopt's default).
  if (prodigy && !origins.count("train.optimizer.lr")) opt.lr = 1.0;
  // Schedule-free: schedulefree's lr, and no warmup of the trainer's (its own is
  // train.optimizer.warmup_steps).
  if (schedule_free && !origins.count("train.optimizer.lr")) opt.lr = 0.0025;
  if (schedule_free && !origins.count("train.lr_schedule_args.num_warmup_steps")) {
    config.train.lr_schedule_args.num_warmup_steps = 0;
  }
  if (opt.min_8bit_size < 0) opt.min_8bit_size = opt.type == OptimizerType::AdamW8bit ? 4096 : 16384;
}

namespace {

class Checker : public IssueSink {
 public:
  Checker(const OriginMap& origins, std::vector<ConfigIssue>& out)
      : origins_(origins), out_(out) {}

  void fail(const std::string& key, std::string message, std::string hint = "") override {
    auto it = origins_.find(key);
    out_.push_back({key, std::move(message), it == origins_.end() ? Origin{} : it->second,
                    std::move(hint)});
  }

  // `word`: the other form an IntOrWord field takes, named beside the range.
  void bounds(const Field& f, double v, const std::string& word = "") {
    const bool low = f.min && (f.min_exclusive ? v <= *f.min : v < *f.min);
    const bool high = f.max && v > *f.max;
    if (!low && !high) return;
    std::string range;
    if (f.min && f.max) {
      range = fmt::format("in {}{}, {}]", f.min_exclusive ? "(" : "[", *f.min, *f.max);
    } else if (f.min) {
      range = fmt::format("{} {}", f.min_exclusive ? ">" : ">=", *f.min);
    } else {
      range = fmt::format("<= {}", *f.max);
    }
    fail(f.key, fmt::format("{} is out of range: must be {}{}", v, range, word.empty() ? "" : " or " + word));
  }

  void choice(const Field& f, const std::string& v) {
    if (f.choices.empty() ||
        std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end()) {
      return;
    }
    auto it = origins_.find(f.key);
    out_.push_back(choice_issue(f.key, v, f.choices, it == origins_.end() ? Origin{} : it->second));
  }

 private:
  const OriginMap& origins_;
  std::vector<ConfigIssue>& out_;
};

struct CheckField {
  Checker& c;
  const Field& f;
  void operator()(int64_t* v) const { c.bounds(f, static_cast<double>(*v)); }
  void operator()(const IntOrWord& w) const {
    if (!*w.word_given) c.bounds(f, static_cast<double>(*w.value), w.word);
  }
  void operator()(double* v) const {
    if (std::isinf(*v) && !f.infinite) return c.fail(f.key, "is infinite: it takes a finite number");
    if (!std::isinf(*v)) c.bounds(f, *v);
  }
  void operator()(bool*) const {}
  void operator()(std::string* v) const { c.choice(f, *v); }
  void operator()(std::vector<std::string>* v) const {
    for (const auto& s : *v) c.choice(f, s);
  }
  void operator()(std::vector<int64_t>* v) const {
    for (int64_t x : *v) c.bounds(f, static_cast<double>(x));
  }
  void operator()(std::vector<double>* v) const {
    for (double x : *v) c.bounds(f, x);
  }
  void operator()(NamedWeights* v) const {
    for (const auto& [name, x] : *v) c.bounds(f, x);
  }
  void operator()(const ChoiceRef&) const {}  // the loader took only a known name
};

// Any world size works: ranks' shares of a global batch differ by at most one sample and
// each is cut into micro-batches of at most micro_batch_size. Only more processes than
// samples per step cannot.
void check_batch(Checker& c, const TrainConfig& t, int64_t world_size) {
  if (t.global_batch_size < 1 || world_size <= t.global_batch_size) return;
  c.fail("train.global_batch_size",
         fmt::format("{} is smaller than the world size {}: every process needs at least one sample per step",
                     t.global_batch_size, world_size),
         "raise train.global_batch_size or start fewer processes");
}

// The optimizer's betas and eps come in the number its type takes.
void check_optimizer_shape(Checker& c, const OptimizerConfig& opt) {
  const bool adafactor = opt.type == OptimizerType::Adafactor, prodigy = opt.type == OptimizerType::Prodigy;
  const size_t want_betas = is_came(opt.type) ? 3 : adafactor ? 1 : 2;
  const size_t want_eps = is_came(opt.type) || adafactor ? 2 : opt.type == OptimizerType::Lion ? 0 : 1;
  if (adafactor && opt.betas.size() > 1) {
    c.fail("train.optimizer.betas", fmt::format("Adafactor takes at most one beta (its beta1), got {}", opt.betas.size()),
           "give [beta1] for a first moment, or remove the key for none");
  } else if (prodigy && opt.betas.size() != 2 && opt.betas.size() != 3) {
    c.fail("train.optimizer.betas", fmt::format("Prodigy takes 2 betas, or 3 with beta3, got {}", opt.betas.size()),
           "remove the key to use the optimizer's defaults");
  } else if (!adafactor && !prodigy && opt.betas.size() != want_betas) {
    c.fail("train.optimizer.betas",
           fmt::format("{} takes {} betas, got {}", name_of(opt.type), want_betas, opt.betas.size()),
           "remove the key to use the optimizer's defaults");
  }
  if (opt.type == OptimizerType::ScheduleFreeAdamW && opt.betas.size() == 2 && opt.betas[0] == 0) {
    c.fail("train.optimizer.betas", "ScheduleFreeAdamW's beta1 must be above 0 (its evaluation weights divide by it)",
           "give a beta1 such as 0.9");
  }
  if (adafactor && opt.warmup_init && !opt.relative_step) {
    c.fail("train.optimizer.warmup_init", "Adafactor's warmup_init needs relative_step true",
           "set train.optimizer.relative_step true, or warmup_init false");
  }
  if (opt.eps.size() != want_eps) {
    c.fail("train.optimizer.eps",
           want_eps == 0 ? fmt::format("{} takes no eps (its update is a sign), got {}", name_of(opt.type),
                                       opt.eps.size())
                         : fmt::format("{} takes {} eps value{}, got {}", name_of(opt.type), want_eps,
                                       want_eps == 1 ? "" : "s", opt.eps.size()),
           want_eps == 0 ? "remove train.optimizer.eps" : "remove the key to use the optimizer's defaults");
  }
}

// An optimizer's own keys set away from their defaults for another type would do nothing:
// each names its owner. (At its default a key is what --print-config writes, so that a
// printed config loads again.)
void check_optimizer_keys(Checker& c, const OptimizerConfig& opt) {
  const OptimizerConfig d;
  const std::pair<OptimizerType, std::vector<std::pair<const char*, bool>>> owners[] = {
      {OptimizerType::Adafactor,
       {{"clip_threshold", opt.clip_threshold != d.clip_threshold}, {"decay_rate", opt.decay_rate != d.decay_rate},
        {"scale_parameter", opt.scale_parameter != d.scale_parameter},
        {"relative_step", opt.relative_step != d.relative_step}, {"warmup_init", opt.warmup_init != d.warmup_init}}},
      {OptimizerType::Prodigy,
       {{"d0", opt.d0 != d.d0}, {"d_coef", opt.d_coef != d.d_coef}, {"growth_rate", opt.growth_rate != d.growth_rate},
        {"decouple", opt.decouple != d.decouple}, {"use_bias_correction", opt.use_bias_correction != d.use_bias_correction},
        {"safeguard_warmup", opt.safeguard_warmup != d.safeguard_warmup}, {"slice_p", opt.slice_p != d.slice_p}}},
      {OptimizerType::ScheduleFreeAdamW,
       {{"warmup_steps", opt.warmup_steps != d.warmup_steps}, {"r", opt.r != d.r},
        {"weight_lr_power", opt.weight_lr_power != d.weight_lr_power}}}};
  for (const auto& [type, keys] : owners) {
    if (opt.type == type) continue;
    for (const auto& [key, changed] : keys) {
      const std::string full = std::string("train.optimizer.") + key;
      if (!changed) continue;
      c.fail(full, fmt::format("is {}'s, and train.optimizer.type is {}", name_of(type), name_of(opt.type)),
             fmt::format("remove it, or set train.optimizer.type: {}", name_of(type)));
    }
  }
}

// Schedule-free AdamW replaces the learning-rate schedule: its warmup is its own key.
void check_schedule_free(Checker& c, const TrainConfig& t) {
  if (t.optimizer.type != OptimizerType::ScheduleFreeAdamW) return;
  if (t.lr_schedule != LrSchedule::constant) {
    c.fail("train.lr_schedule", "ScheduleFreeAdamW takes no schedule: it averages its iterates instead of decaying",
           "remove train.lr_schedule (constant), or choose another train.optimizer.type");
  }
  if (t.lr_schedule_args.num_warmup_steps > 0) {
    c.fail("train.lr_schedule_args.num_warmup_steps", "ScheduleFreeAdamW warms up by itself",
           fmt::format("set train.optimizer.warmup_steps: {} instead", t.lr_schedule_args.num_warmup_steps));
  }
}

// The bucket tables: the base size agrees with the model's and has a table.
void check_buckets(Checker& c, const Config& cfg) {
  const auto& d = cfg.data;
  if (cfg.model.image_size != d.image_size) {
    c.fail("model.image_size",
           fmt::format("{} differs from data.image_size {}", cfg.model.image_size, d.image_size),
           "set both to the same base resolution");
  }
  if (d.aspect_ratio_type != "generated") {
    const std::string table_size = d.aspect_ratio_type.substr(d.aspect_ratio_type.rfind('_') + 1);
    if (table_size != std::to_string(d.image_size)) {
      c.fail("data.aspect_ratio_type",
             fmt::format("{} is upstream's table for {} px, but data.image_size is {}",
                         d.aspect_ratio_type, table_size, d.image_size),
             fmt::format("use ASPECT_RATIO_{} if upstream has it, or 'generated'", d.image_size));
    }
    for (int64_t s : d.multi_scale_sizes) {
      if (s != 256 && s != 512 && s != 1024 && s != 2048 && s != 2880 && s != 4096) {
        c.fail("data.multi_scale_sizes",
               fmt::format("{} has no upstream bucket table (256, 512, 1024, 2048, 2880, 4096)", s),
               "set data.aspect_ratio_type: generated for other sizes");
      }
    }
  } else {
    std::vector<int64_t> sizes = d.multi_scale_sizes;
    sizes.push_back(d.image_size);
    for (int64_t s : sizes) {
      if (d.bucket_step > 0 && s % d.bucket_step != 0) {
        c.fail(s == d.image_size ? "data.image_size" : "data.multi_scale_sizes",
               fmt::format("{} is not a multiple of data.bucket_step {}", s, d.bucket_step));
      }
    }
  }
}

// Upstream's caption choice: proportion needs a weight somewhere.
void check_captions(Checker& c, const DataConfig& d) {
  if (d.caption_selection_type != "proportion") return;
  double total = 0;
  for (const auto& [name, weight] : d.caption_proportion) total += weight;
  if (!(total > 0)) {
    c.fail("data.caption_proportion",
           d.caption_proportion.empty() ? "is empty, but data.caption_selection_type is proportion"
                                        : "weights add up to 0, but data.caption_selection_type is proportion",
           "give each caption name a weight, e.g. {prompt: 1}");
  }
}

// Tiles of whole latent cells, overlapping by less than a tile.
void check_vae_tiles(Checker& c, const VaeConfig& v) {
  if (v.tile_size == 0) return;
  const int64_t f = v.vae_downsample_rate;
  if (v.tile_size % f != 0) {
    c.fail("vae.tile_size", fmt::format("{} is not a multiple of vae.vae_downsample_rate {}", v.tile_size, f),
           fmt::format("use a multiple of {}, e.g. {}", f, (v.tile_size / f + 1) * f));
  } else if (v.tile_overlap % f != 0 || v.tile_overlap >= v.tile_size) {
    c.fail("vae.tile_overlap",
           fmt::format("{} must be a multiple of vae.vae_downsample_rate {} below vae.tile_size {}", v.tile_overlap, f,
                       v.tile_size),
           fmt::format("e.g. {}", v.tile_size / 4 / f * f));
  }
}

// train.eval: samples to measure when it is on, and timesteps in the training table.
void check_eval(Checker& c, const Config& cfg) {
  const auto& e = cfg.train.eval;
  if (e.every_steps > 0 && e.data_dir.empty() && e.fraction == 0) {
    c.fail("train.eval.data_dir",
           fmt::format("is empty and train.eval.fraction 0, but train.eval.every_steps is {}", e.every_steps),
           "name the held-out samples (a folder, a JSONL/CSV file or an index), or hold out a share of the training "
           "set (train.eval.fraction: 0.05), or set every_steps: 0");
  }
  if (!e.data_dir.empty() && e.fraction > 0) {
    c.fail("train.eval.fraction", "and train.eval.data_dir are both set", "keep one: held-out samples of their own, or a share of data.data_dir");
  }
  if (e.every_steps > 0 && e.timesteps.empty()) {
    c.fail("train.eval.timesteps", "is empty: no timestep to measure the loss at", "e.g. [100, 300, 500, 700, 900]");
  }
  const int64_t steps = cfg.scheduler.train_sampling_steps;
  for (int64_t t : e.timesteps) {
    if (t >= steps) {
      c.fail("train.eval.timesteps", fmt::format("{} is not below scheduler.train_sampling_steps {}", t, steps),
             fmt::format("use timesteps from 0 to {}", steps - 1));
      break;
    }
  }
}

void check_combinations(Checker& c, const Config& cfg, const ValidationContext& ctx) {
  if (ctx.check_batch) check_batch(c, cfg.train, ctx.world_size);
  if (cfg.train.micro_batch_auto && cfg.train.deterministic) {
    c.fail("train.micro_batch_size",
           "auto with train.deterministic: the deterministic sums are the same only at the same micro-batch, and "
           "auto's follows the device and the process count",
           "give a number (sana-train model --device-memory GIB suggests one)");
  }
  check_optimizer_shape(c, cfg.train.optimizer);
  check_optimizer_keys(c, cfg.train.optimizer);
  check_schedule_free(c, cfg.train);
  check_buckets(c, cfg);
  check_captions(c, cfg.data);
  if (!cfg.model_growth.pretrained_ckpt_path.empty() && !cfg.model.load_from.empty()) {
    c.fail("model_growth.pretrained_ckpt_path",
           "and model.load_from are both set: growth initialises the model from the smaller checkpoint (upstream "
           "refuses the pair too)",
           "keep one of them");
  }
  if (!cfg.scheduler.predict_flow_v) {
    c.fail("scheduler.predict_flow_v",
           "false is not supported: sana-train trains the flow velocity (noise - data), as every upstream Sana "
           "config does",
           "remove the key or set it to true");
  }

  if (cfg.dist.backend == Backend::nccl && cfg.dist.device == DeviceKind::cpu) {
    c.fail("dist.backend", "nccl needs CUDA devices, but dist.device is cpu",
           "use backend gloo (or auto) with device cpu");
  }
  if (cfg.dist.allow_shared_device && cfg.dist.backend == Backend::nccl) {
    c.fail("dist.allow_shared_device", "NCCL cannot run two ranks on one GPU",
           "use dist.backend=gloo for shared-device debugging runs");
  }
  if (cfg.vae.vae_type == VaeType::torchscript && cfg.vae.vae_pretrained.empty()) {
    c.fail("vae.vae_pretrained", "is required when vae.vae_type is torchscript",
           "give the TorchScript encoder file, or set vae.vae_type: none");
  }
  check_vae_tiles(c, cfg.vae);
  check_eval(c, cfg);
  if (cfg.text_encoder.text_encoder_name == "torchscript" && cfg.text_encoder.text_encoder_path.empty()) {
    c.fail("text_encoder.text_encoder_path", "is required when text_encoder_name is torchscript",
           "give the TorchScript encoder file, or set text_encoder.text_encoder_name: none");
  }
  if (cfg.work_dir.empty()) c.fail("work_dir", "must not be empty", "e.g. work_dir: output/run");
  for (const auto& [name, check] : registered_checks()) check(cfg, c);
}

void check_existing(Checker& c, const std::string& key, const std::string& path,
                    const char* what) {
  if (path.rfind("hf://", 0) == 0 || path.find("://") != std::string::npos) {
    c.fail(key, fmt::format("'{}' is a remote location; sana-train reads local files only", path),
           fmt::format("download the {} and give its local path", what));
    return;
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    c.fail(key, fmt::format("{} '{}' does not exist", what, path),
           "check the path (relative paths are relative to the working directory)");
  }
}

// Upstream's YAMLs name hub models (mit-han-lab/dc-ae-..., gemma-2-2b-it): found on this
// machine they run natively; else the error says where sana-train looked and what to run.
void check_encoder_paths(Checker& c, const Config& cfg) {
  const auto& vae = cfg.vae;
  if (uses_vae(vae) && !cfg.data.load_vae_feat) {
    const auto source = vae_source(vae);
    if (!source.problem.empty()) {
      c.fail("vae.vae_pretrained", source.problem, source.hint);
    } else if (source.path.empty() && vae.vae_type != VaeType::torchscript) {  // torchscript: said above
      c.fail("vae.vae_pretrained", fmt::format("is empty, but vae.vae_type is {}", name_of(vae.vae_type)),
             "give diffusers' AutoencoderDC folder or its hub name (mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers), a "
             "TorchScript export, or precompute features and set data.load_vae_feat: true");
    } else if (source.kind == VaeSource::Kind::torchscript && !source.path.empty()) {
      check_existing(c, "vae.vae_pretrained", source.path, "VAE");
    }
  }
  const auto& text = cfg.text_encoder;
  if (uses_text_encoder(text) && !cfg.data.load_text_feat) {
    const auto source = text_encoder_source(text);
    if (!source.problem.empty()) {
      c.fail("text_encoder.text_encoder_path", source.problem, source.hint);
    } else if (source.kind == TextEncoderSource::Kind::torchscript && !source.path.empty()) {
      check_existing(c, "text_encoder.text_encoder_path", source.path, "text encoder");
    }
    if (!source.tokenizer.empty()) {
      check_existing(c, text.tokenizer_path.empty() ? "text_encoder.text_encoder_path" : "text_encoder.tokenizer_path",
                     source.tokenizer, "tokenizer");
    }
  }
  if (!text.null_embed_path.empty()) {
    check_existing(c, "text_encoder.null_embed_path", text.null_embed_path, "null embedding");
  } else if (cfg.data.load_text_feat && cfg.model.class_dropout_prob > 0 && cfg.model.load_from.empty() &&
             null_embed_file(cfg).empty()) {
    // Upstream trains dropped captions on the empty prompt's features (its train.py writes
    // them before building the model); without an encoder here they must come from a file.
    const auto tried = null_embed_candidates(cfg);
    c.fail("text_encoder.null_embed_path",
           fmt::format("is needed: captions are precomputed (data.load_text_feat) and model.class_dropout_prob is {}, "
                       "so dropped captions train on the empty prompt's features, as upstream; no file at {}",
                       cfg.model.class_dropout_prob, fmt::join(tried, " or ")),
           "run `sana-train prepare-features` (it writes null_embed.safetensors and sets this key in its "
           "train.yaml), point this key at upstream's null_embed_diffusers_*.pth, or set "
           "model.class_dropout_prob: 0");
  }
}

// train.load_from_optimizer / load_from_lr_scheduler read model.load_from's optimizer state
// and schedule position, which only a sana-train checkpoint folder holds (trainer_state.json
// in the folder named, or beside the file named).
void check_carried_state(Checker& c, const Config& cfg) {
  const auto& t = cfg.train;
  if (!t.load_from_optimizer && !t.load_from_lr_scheduler) return;
  std::error_code ec;
  const fs::path p(cfg.model.load_from);
  const fs::path folder = fs::is_directory(p, ec) ? p : p.parent_path();
  if (fs::is_regular_file(folder / "trainer_state.json", ec) || !fs::exists(p, ec)) return;
  c.fail(t.load_from_optimizer ? "train.load_from_optimizer" : "train.load_from_lr_scheduler",
         fmt::format("model.load_from '{}' is not a sana-train checkpoint folder or a file in one: it keeps no "
                     "optimizer state or schedule position that sana-train reads (upstream's .pth holds torch's "
                     "pickled optimizer, ordered by its own parameters)",
                     cfg.model.load_from),
         "point model.load_from at a checkpoint folder (work_dir/checkpoints/step_N), or set this key false");
}

void check_paths(Checker& c, const Config& cfg) {
  if (cfg.data.data_dir.empty()) {
    c.fail("data.data_dir", "is required: no training data given",
           "set it to an image folder, a JSONL/CSV metadata file or an index");
  }
  for (const auto& dir : cfg.data.data_dir) check_existing(c, "data.data_dir", dir, "data source");
  for (const auto& dir : cfg.train.eval.data_dir) check_existing(c, "train.eval.data_dir", dir, "data source");
  if (!cfg.model.load_from.empty()) {
    check_existing(c, "model.load_from", cfg.model.load_from, "checkpoint");
    check_carried_state(c, cfg);
  }
  if (!cfg.model_growth.pretrained_ckpt_path.empty()) {
    check_existing(c, "model_growth.pretrained_ckpt_path", cfg.model_growth.pretrained_ckpt_path, "checkpoint");
  }
  check_encoder_paths(c, cfg);
  if (!cfg.resume_from.empty() && cfg.resume_from != "latest") {
    check_existing(c, "resume_from", cfg.resume_from, "checkpoint");
  }
}

}  // namespace

std::vector<ConfigIssue> validate(const Config& config, const ValidationContext& ctx,
                                  const OriginMap& origins) {
  std::vector<ConfigIssue> issues;
  Checker checker(origins, issues);
  Config copy = config;  // fields_of points into a mutable Config
  for (const Field& f : fields_of(copy)) std::visit(CheckField{checker, f}, f.ref);
  check_combinations(checker, config, ctx);
  if (ctx.check_paths) check_paths(checker, config);
  return issues;
}

}  // namespace sana::config
