// `sana-train export --config C [--from WEIGHTS [--ema]] --format diffusers|upstream --out PATH`:
// a model's weights in diffusers' layout (a transformer folder SanaPipeline loads) or
// upstream's (.pth with {"state_dict": ...}), from a weights file (ours, upstream's or
// diffusers'), a diffusers folder, or a checkpoint folder (its model weights, a
// schedule-free run's averaged x, or with --ema its EMA weights); without --from, the
// config's initial weights. With --merge-lora, --from names LoRA adapters (a LoRA run's checkpoint folder or work_dir, or a LoRA file in
// diffusers' naming), folded into the config's base (model.load_from). model/export.h
// writes them; docs/finetune.md has the names.
#include <fmt/format.h>

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "command.h"
#include "sana/ckpt/shards.h"
#include "sana/model/controlnet.h"
#include "sana/model/export.h"
#include "sana/model/lora.h"
#include "sana/model/sana_ms.h"
#include "sana/model/weights.h"
#include "sana/train/options/core_options.h"
#include "sana/train/trainable/initial_model.h"
#include "sana/train/options/torch_options.h"
#include "sana/train/input/run_encoders.h"
#include "sana/util/error.h"
#include "sana/util/log.h"
#include "sana/util/safetensors.h"

namespace sana::app {

namespace {

namespace fs = std::filesystem;

class Export : public ConfigSubcommand {
 public:
  explicit Export(CLI::App& app)
      : ConfigSubcommand(app, "export", "write weights in diffusers' or upstream's layout",
                         {/*required=*/true, /*data=*/false}) {
    cli_->add_option("--from", from_,
                     "weights: a file, a diffusers folder, or a checkpoint folder (default: the initial weights)");
    cli_->add_flag("--ema", ema_, "from a checkpoint folder: its EMA weights");
    cli_->add_flag("--merge-lora", merge_lora_,
                   "--from names LoRA adapters (a LoRA run's checkpoint or work_dir, or a LoRA file): fold them into "
                   "the config's base (model.load_from)");
    cli_->add_option("--format", format_,
                     "diffusers (a transformer folder; a ControlNet: transformer/ and controlnet/) or upstream (a .pth)")
        ->required()
        ->check(CLI::IsMember({"diffusers", "upstream"}));
    cli_->add_option("--out", out_, "the folder (diffusers) or file (upstream) to write")->required();
  }

  int run(const dist::LaunchEnv&, const config::Config& cfg) override {
    const Consolidated consolidated(from_);  // a format-3 checkpoint is read as format 2
    const auto spec = train::model_spec_for(cfg);
    const bool schedule_free = cfg.train.optimizer.type == config::OptimizerType::ScheduleFreeAdamW && !ema_ &&
                               fs::exists(fs::path(from_) / "optimizer.safetensors");  // a checkpoint's y
    if (schedule_free && (merge_lora_ || spec.control_blocks > 0)) {
      throw UsageError(fmt::format("{} is a schedule-free run's checkpoint, whose adapters are its y, not its averaged "
                                   "x: export the finished run's work_dir, which holds x", from_));
    }
    model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, static_cast<uint64_t>(cfg.train.seed)});
    if (merge_lora_) {
      merge_adapters(cfg, *net);
    } else if (spec.control_blocks > 0 && fs::exists(fs::path(from_) / "controlnet.safetensors") &&
               !fs::exists(fs::path(from_) / "model.safetensors")) {
      control_checkpoint(cfg, *net);
    } else if (from_.empty()) {
      log::info("export: no --from: the initial weights (train.seed {})", cfg.train.seed);
      make_null_caption_ = true;
    } else {
      const auto source = weights_path();
      const auto report = model::load_weights(*net, source, /*strict=*/true);
      log::info("export: {} from {}", report.summary(), source);
      make_null_caption_ = !report.made_by_run.empty();
      if (schedule_free) schedule_free_x(cfg, *net);
    }
    if (make_null_caption_) null_caption_as_a_run(cfg, net);
    if (ema_ && !merge_lora_) {  // the EMA holds the parameters; the buffers (the null caption) stay the model file's
      const auto ema = (fs::path(from_) / "ema.safetensors").string();
      const auto averaged = model::load_weights(*net, ema, /*strict=*/false);
      // A ControlNet's EMA holds what trained: its control blocks.
      const auto trained = spec.control_blocks > 0 ? net->parameters().size() - model::base_parameters(*net).size()
                                                   : net->parameters().size();
      if (!averaged.unexpected.empty() || !averaged.mismatched.empty() ||
          averaged.loaded != static_cast<int64_t>(trained)) {
        throw model::WeightsError(fmt::format("--ema: {} does not hold this model's parameters: {}", ema, averaged.summary()));
      }
      log::info("export: EMA weights, {} from {}", averaged.summary(), ema);
    }
    model::TensorMap tensors;
    for (const auto& [name, t] : model::module_tensors(*net)) tensors[name] = t;
    if (format_ == "upstream") {
      tensors["pos_embed"] = model::upstream_pos_embed(spec, cfg.model.image_size);
      model::export_upstream(tensors, out_);
      std::cout << out_ << "\n";
    } else {
      const auto written = spec.control_blocks > 0
                               ? model::export_controlnet_diffusers(tensors, spec, cfg.model.image_size, out_)
                               : model::export_diffusers(tensors, spec, cfg.model.image_size, out_);
      for (const auto& f : written) std::cout << f << "\n";
    }
    log::info("export: {} weights of {} in {}'s layout at {}", tensors.size(), spec.name, format_, out_);
    return 0;
  }

 private:
  // The base as the LoRA run had it (model.load_from, else the seed's weights), the adapters
  // (or their EMA) folded in.
  void merge_adapters(const config::Config& cfg, model::SanaMSImpl& net) {
    const fs::path from(from_);
    if (from_.empty()) throw UsageError("--merge-lora needs --from: the adapters (a LoRA run's checkpoint, work_dir or file)");
    const bool folder = fs::is_directory(from);
    const auto adapters = lora_file_in(from);
    if (folder && adapters.empty()) {
      throw model::WeightsError(fmt::format("--merge-lora: {} has no {} or lora.safetensors (not a LoRA run's folder)",
                                            from_, model::kLoraWeightsFile));
    }
    if (ema_ && !(folder && fs::exists(from / "ema.safetensors"))) {
      throw model::WeightsError(fmt::format("--ema --merge-lora: {} has no ema.safetensors (train.ema_update off?)", from_));
    }
    if (!cfg.model.load_from.empty()) {
      const auto report = model::load_weights(net, cfg.model.load_from, cfg.model.load_strict);
      log::info("export: the base, {} from {}", report.summary(), cfg.model.load_from);
      make_null_caption_ = !report.made_by_run.empty();
    } else {
      log::info("export: the base is the initial weights (train.seed {}): model.load_from is empty", cfg.train.seed);
      make_null_caption_ = true;
    }
    const auto file = folder ? adapters : from_;
    const auto lora = model::read_lora_file(file, ema_ ? (from / "ema.safetensors").string() : "");
    model::merge_lora_file(net, lora, train::weights_checksum(net), file);
    log::info("export: {} adapters of rank {} (alpha {:g}){} folded into the base", lora.targets.size(), lora.rank,
              lora.alpha, ema_ ? ", their EMA," : "");
  }

  // A schedule-free run's checkpoint holds its y (model.safetensors) and z (in
  // optimizer.safetensors): the weights to export are x = lerp(y, z, 1 - 1/beta1), what the
  // run's own final files hold (train/optim/schedule_free.h).
  void schedule_free_x(const config::Config& cfg, model::SanaMSImpl& net) const {
    const auto file = (fs::path(from_) / "optimizer.safetensors").string();
    const auto state = read_safetensors(file);
    std::map<std::string, torch::Tensor> z;
    for (const auto& [entry, t] : state.tensors) {
      const auto slash = entry.rfind('/');
      if (slash != std::string::npos && entry.substr(slash + 1) == "z") z.emplace(entry.substr(0, slash), t);
    }
    if (z.empty()) {
      throw model::WeightsError(fmt::format("{} holds no schedule-free z (ckpt.save_optimizer false?): {}'s model "
                                            "weights are its y, not the x to export; export the finished run's "
                                            "work_dir instead", file, from_));
    }
    torch::NoGradGuard no_grad;
    const double beta1 = cfg.train.optimizer.betas.at(0);
    int64_t averaged = 0;
    for (auto& item : net.named_parameters()) {
      auto& p = item.value();
      const auto it = z.find(item.key());
      if (it == z.end()) continue;  // never stepped: x is y
      p.copy_(p.lerp(it->second.to(p.dtype()), 1 - 1 / beta1));
      ++averaged;
    }
    log::info("export: schedule-free x of {} parameters from {} (beta1 {:g})", averaged, file, beta1);
  }

  // A ControlNet run's checkpoint: the base as the run had it (model.load_from, else the
  // seed's weights), then the checkpoint's control blocks.
  void control_checkpoint(const config::Config& cfg, model::SanaMSImpl& net) {
    if (!cfg.model.load_from.empty()) {
      const auto report = model::load_controlnet_weights(net, cfg.model.load_from, cfg.model.load_strict);
      log::info("export: the base, {} from {}", report.summary(), cfg.model.load_from);
      make_null_caption_ = !report.made_by_run.empty();
    } else {
      log::info("export: the base is the initial weights (train.seed {}): model.load_from is empty", cfg.train.seed);
      make_null_caption_ = true;
    }
    // Restored as a resume restores them: onto the base they trained on, every block exactly.
    const auto file = (fs::path(from_) / "controlnet.safetensors").string();
    auto tensors = read_safetensors(file);
    PartState saved;
    saved.json = {{"base_checksum", tensors.metadata.count("base_checksum") ? tensors.metadata.at("base_checksum") : ""}};
    saved.tensors = std::move(tensors.tensors);
    model::ControlNetState(net, train::tensors_checksum(model::base_parameters(net))).restore_state(&saved, file);
    log::info("export: the control blocks from {}", file);
  }

  // The null caption a run has (Trainer::use_empty_prompt): the config's text encoder on the
  // empty prompt (when the config names its export), or its null-embedding file. For the initial weights and a source without
  // one (diffusers' layout keeps none), so the file holds what a run would, not a random init.
  static void null_caption_as_a_run(const config::Config& cfg, model::SanaMS& net) {
    if (!net->caption_embedder) return;
    auto options = train::encoder_options_for(cfg);
    options.vae.reset();  // the text encoder alone, when the config gives its export
    if (options.text && options.text->text_encoder_path.empty()) options.text.reset();
    options.precomputed_captions = false;
    const auto encoders = train::load_encoders(options, torch::kCPU, train::EncoderUse::training, net->spec().conditioning);
    train::use_empty_prompt(net, encoders, config::null_embed_file(cfg));
  }

  // A LoRA run's adapters in `folder`: its work_dir's file, or a checkpoint's (and an older
  // work_dir's) lora.safetensors; "" when neither is there.
  static std::string lora_file_in(const fs::path& folder) {
    for (const char* name : {model::kLoraWeightsFile, "lora.safetensors"}) {
      if (fs::exists(folder / name)) return (folder / name).string();
    }
    return "";
  }

  // A checkpoint folder (or a finished run's work_dir) holds model.safetensors and
  // ema.safetensors; anything else is read as it is.
  std::string weights_path() const {
    const fs::path from(from_);
    if (fs::is_directory(from) && !lora_file_in(from).empty() && !fs::exists(from / "model.safetensors")) {
      throw UsageError(fmt::format("{} holds LoRA adapters, not a whole model: add --merge-lora to fold them into the "
                                   "config's base (model.load_from)", from_));
    }
    if (fs::is_directory(from) && fs::exists(from / "model.safetensors")) {
      if (ema_ && !fs::exists(from / "ema.safetensors")) {
        throw model::WeightsError(fmt::format("--ema: {} has no ema.safetensors (ckpt.save_ema false?)", from_));
      }
      return (from / "model.safetensors").string();
    }
    if (ema_) throw model::WeightsError(fmt::format("--ema takes a checkpoint folder or work_dir; {} is not one", from_));
    return from_;
  }

  // A format-3 checkpoint folder `from` (each rank's files, ckpt/shards.h) consolidated,
  // tensor by tensor, into a temporary format-2 folder that `from` then names, for as long
  // as this lives.
  class Consolidated {
   public:
    explicit Consolidated(std::string& from) {
      if (from.empty() || !fs::exists(fs::path(from) / "index.json")) return;
      folder_ = fs::temp_directory_path() / fmt::format("sana-export-{}", ::getpid());
      ckpt::consolidate_checkpoint(from, folder_.string());
      log::info("export: {} (format 3) consolidated into {}", from, folder_.string());
      from = folder_.string();
    }
    ~Consolidated() {
      std::error_code ec;
      if (!folder_.empty()) fs::remove_all(folder_, ec);
    }
    Consolidated(const Consolidated&) = delete;
    Consolidated& operator=(const Consolidated&) = delete;

   private:
    fs::path folder_;
  };

  std::string from_, format_, out_;
  bool ema_ = false, merge_lora_ = false;
  bool make_null_caption_ = false;  // the weights came without a null caption: make it as a run does
};

}  // namespace

std::unique_ptr<ConfigCommand> export_command(CLI::App& app) { return std::make_unique<Export>(app); }

}  // namespace sana::app
