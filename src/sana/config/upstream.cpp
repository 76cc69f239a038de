#include "sana/config/upstream.h"
#include "sana/util/text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <utility>

namespace sana::config {

namespace {

// One upstream key (and every key under it). Exactly one of `moved_to` / `why` is set.
// `only`: the value (YAML) that may be given; anything else is an error, because
// ignoring it would train something other than what the user asked for.
struct Rule {
  const char* key;
  const char* moved_to;
  const char* why;
  const char* only;
  bool refused = false;  // any value is an error: the key belongs to training sana-train does not do
};

constexpr const char* kInference = "an inference option; previews use train.preview_cfg_scale";
constexpr const char* kDistill = "a consistency-distillation option that upstream's train.py does not read";
constexpr const char* kResume = "a resume restores weights, EMA, optimizer, schedule and data position together";
constexpr const char* kTracker = "no experiment tracker: metrics go to work_dir/metrics.jsonl and TensorBoard";
constexpr const char* kLadd = "this SANA-Sprint / LADD option is not built (docs/sprint.md)";
constexpr const char* kSprintUnused = "upstream's train_scm_ladd.py never reads it";
constexpr const char* kVideo = "SANA-Video training is not supported";

const Rule kRules[] = {
    // top level
    {"load_from", "model.load_from", nullptr, nullptr},
    {"debug", nullptr, "log_level: debug gives the detail", nullptr},
    {"caching", nullptr, "upstream's caching has no effect here; later runs reuse dataset indexes, bucket assignments and "
     "data.cache: disk", nullptr},
    {"report_to", "train.report_to", nullptr, nullptr},
    {"tracker_project_name", nullptr, kTracker, nullptr},
    {"name", nullptr, kTracker, nullptr},
    {"loss_report_name", nullptr, kTracker, nullptr},
    {"model_growth.extra", nullptr, "unused upstream too", nullptr},
    // data
    {"data.buckets_file", nullptr, "buckets come from data.aspect_ratio_type", nullptr},
    {"data.sort_dataset", nullptr, "the epoch plan fixes the order from train.seed", nullptr},
    {"data.transform", nullptr, "images are resized and centre-cropped to their bucket, as default_train",
     "default_train"},
    {"data.type", nullptr,
     "the dataset kind follows data.data_dir (folders, JSONL/CSV metadata, wids shards as SanaWebDatasetMS "
     "reads them, indexes)",
     nullptr},
    {"data.valid_num", nullptr, "upstream's sampler computes its bucket list from it and never uses it", nullptr},
    {"data.data", nullptr, "unused upstream too", nullptr},
    {"data.extra", nullptr, "unused upstream too", nullptr},
    // model
    {"model.resume_from.checkpoint", "resume_from", nullptr, nullptr},
    {"model.resume_from.load_ema", nullptr, kResume, "false"},
    {"model.resume_from.resume_optimizer", nullptr, kResume, "true"},
    {"model.resume_from.resume_lr_scheduler", nullptr,
     "upstream's train.py replaces it with train.resume_lr_scheduler, which acts here", nullptr},
    {"model.resume_from", "resume_from", nullptr, nullptr},
    {"model.aspect_ratio_type", "data.aspect_ratio_type", nullptr, nullptr},
    {"model.micro_condition", nullptr, "no micro-conditioning", "false"},
    {"model.autocast_linear_attn", nullptr,
     "model.fp32_attention decides (upstream reads this at import, so it has no effect there either)", nullptr},
    {"model.mlp_acts", nullptr, "GLUMBConv's activations are fixed", "[silu, silu, null]"},
    {"model.cfg_scale", nullptr, kInference, nullptr},
    {"model.guidance_type", nullptr, kInference, nullptr},
    {"model.pag_applied_layers", nullptr, kInference, nullptr},
    {"model.pos_embed_type", nullptr, "model.use_pe adds the sin-cos embedding; flux_rope and wan_rope are not implemented",
     "sincos"},
    {"model.cross_attn_type", nullptr, "softmax cross-attention, the maths of every upstream kind", nullptr},
    {"model.extra", nullptr, "unused upstream too", nullptr},
    // vae
    {"vae.weight_dtype", nullptr, "the VAE runs in its TorchScript export's dtype", nullptr},
    {"vae.sample_posterior", nullptr, "DC-AE encodes deterministically", nullptr},
    {"vae.extra", nullptr, "unused upstream too", nullptr},
    {"text_encoder.extra", nullptr, "unused upstream too", nullptr},
    // scheduler
    {"scheduler.predict_v", "scheduler.predict_flow_v", nullptr, nullptr},
    {"scheduler.pred_sigma", nullptr, "flow matching predicts no variance", "false"},
    {"scheduler.learn_sigma", nullptr, "only with pred_sigma", nullptr},
    {"scheduler.extra", nullptr, "unused upstream too", nullptr},
    // train
    {"train.work_dir", "work_dir", nullptr, nullptr},
    {"train.auto_lr.rule", "train.auto_lr", nullptr, nullptr},
    {"train.auto_lr.base_batch_size", nullptr, "the base batch is 256, as upstream's", "256"},
    {"train.eval_batch_size", nullptr, "no evaluation set is read", nullptr},
    {"train.use_flash_attn", nullptr, "self-attention is linear; cross-attention uses LibTorch's kernel", nullptr},
    {"train.lora_rank", nullptr, "upstream's train.py trains no LoRA; train.lora.rank turns it on here", nullptr},
    {"train.mask_type", nullptr, "no token masking", "null"},
    {"train.mask_loss_coef", nullptr, "no token masking", "0"},
    {"train.load_mask_index", nullptr, "no token masking", "false"},
    {"train.snr_loss", nullptr, "the flow loss is unweighted, as upstream's flow runs", "false"},
    {"train.real_prompt_ratio", nullptr, "upstream's train.py does not read it either", nullptr},
    {"train.training_hours", nullptr, "no wall-clock limit: use train.max_steps", nullptr},
    {"train.save_image_epochs", nullptr, "previews follow eval_sampling_steps and preview_every_epochs",
     nullptr},
    {"train.valid_prompt_embed_root", nullptr, "no embedding cache files are written", nullptr},
    {"train.local_save_vis", nullptr, "previews are always written under work_dir/previews", nullptr},
    {"train.deterministic_validation", nullptr, "previews always start from the same noise", nullptr},
    {"train.online_metric", nullptr,
     "no online FID/CLIP metrics; train.eval measures a held-out loss at fixed timesteps and noise instead", nullptr},
    {"train.eval_metric_step", nullptr, "no online FID/CLIP metrics", nullptr},
    {"train.online_metric_dir", nullptr, "no online FID/CLIP metrics", nullptr},
    {"train.skip_step", nullptr, "a resume continues at the next sample; nothing is skipped", "0"},
    {"train.loss_type", nullptr, kDistill, nullptr},
    {"train.huber_c", nullptr, kDistill, nullptr},
    {"train.num_ddim_timesteps", nullptr, kDistill, nullptr},
    {"train.w_max", nullptr, kDistill, nullptr},
    {"train.w_min", nullptr, kDistill, nullptr},
    {"train.ema_decay", nullptr, kDistill, nullptr},
    {"train.debug_nan", nullptr, "non-finite steps are always counted (train.max_nonfinite)", nullptr},
    // Sana-Sprint / LADD / sCM (upstream's config.py "for ladd", discriminator, teacher)
    {"model.teacher_model_weight_dtype", nullptr, kLadd, nullptr, true},
    {"model.discriminator_model", nullptr, kLadd, nullptr, true},
    {"scheduler.add_noise_timesteps", nullptr, kLadd, nullptr, true},
    {"scheduler.p_low", nullptr, kLadd, nullptr, true},
    {"scheduler.p_high", nullptr, kLadd, nullptr, true},
    {"scheduler.pretrain_timestep_norm_scale_factor", nullptr, kLadd, nullptr, true},
    {"scheduler.discrete_norm_timestep", nullptr, kLadd, nullptr, true},
    {"train.optimizer_D", nullptr, "the discriminator's optimizer is train.optimizer's, as upstream's train_scm_ladd.py builds it (it never reads optimizer_D)", nullptr},
    {"train.cfg_interval", nullptr, kSprintUnused, nullptr},
    {"train.scm_logvar_loss", nullptr, kSprintUnused, nullptr},
    {"train.weight_loss", nullptr, kLadd, nullptr, true},
    {"train.norm_invariant_to_spatial_dim", nullptr, kSprintUnused, nullptr},
    {"train.norm_same_as_512_scale", nullptr, kLadd, nullptr, true},
    {"train.g_norm_constant", nullptr, kSprintUnused, nullptr},
    {"train.g_norm_r", nullptr, kSprintUnused, nullptr},
    {"train.loss_scale", nullptr, kLadd, nullptr, true},
    {"train.r1_penalty", nullptr, "no R1 penalty (off in upstream's Sprint YAMLs)", "false"},
    {"train.r1_penalty_weight", nullptr, kLadd, nullptr, true},
    {"train.suffix_checkpoints", nullptr, kLadd, nullptr, true},
    // SANA-Video (upstream's TrainVideoConfig / ModelVideoConfig)
    {"train.validation_images", nullptr, kVideo, nullptr, true},
    {"train.image_prior_type", nullptr, kVideo, nullptr, true},
    {"train.joint_training_interval", nullptr, kVideo, nullptr, true},
    {"train.timestep_weight", nullptr, kVideo, nullptr, true},
    {"train.noise_multiplier", nullptr, kVideo, nullptr, true},
    {"train.ltx_image_condition_prob", nullptr, kVideo, nullptr, true},
    {"train.chunk_sampling_strategy", nullptr, kVideo, nullptr, true},
    {"train.same_timestep_prob", nullptr, kVideo, nullptr, true},
    {"train.temporal_coherence_loss", nullptr, kVideo, nullptr, true},
    {"train.temporal_coherence_weight", nullptr, kVideo, nullptr, true},
    {"model.image_latent_mode", nullptr, kVideo, nullptr, true},
    {"train.extra", nullptr, "unused upstream too", nullptr},
};

// Upstream's names for values of ours.
struct ValueName {
  const char* key;
  const char* upstream;
  const char* ours;
  const char* note;  // when the value is not exactly the same thing
};

const ValueName kValueNames[] = {
    {"train.optimizer.type", "CAMEWrapper", "CAME", nullptr},
    {"train.optimizer.type", "CAME8BitWrapper", "CAME8bit", nullptr},
    {"train.optimizer.type", "AdamW8bitWrapper", "AdamW8bit", nullptr},
    {"vae.vae_type", "AutoencoderDC", "dc-ae", nullptr},
    {"scheduler.weighting_scheme", "mode", "uniform",
     "upstream's train.py applies a density only for logit_normal, so 'mode' trains uniform timesteps, as "
     "here; SD3's mode density is weighting_scheme: sd3_mode"},
    {"train.report_to", "wandb", "tensorboard", "no wandb here: TensorBoard event files in work_dir/tensorboard"},
    {"train.report_to", "comet_ml", "tensorboard", "no comet_ml here: TensorBoard event files in work_dir/tensorboard"},
    {"train.report_to", "all", "tensorboard", "TensorBoard is the tracker here"},
};

struct Encoder {
  const char* name;
  int64_t width;
  const char* hub;  // upstream's hub repo (diffusion/model/builder.py), where sana-train runs it natively
};

// Upstream's text_encoder_dict (diffusion/model/builder.py) and the hidden size of each; the
// Gemma-2 ones run natively here (model/gemma2.h) from the folder of their hub repo.
const Encoder kEncoders[] = {
    {"T5", 4096, ""},
    {"T5-small", 512, ""},
    {"T5-base", 768, ""},
    {"T5-large", 1024, ""},
    {"T5-xl", 2048, ""},
    {"T5-xxl", 4096, ""},
    {"gemma-2b", 2048, ""},
    {"gemma-2b-it", 2048, ""},
    {"gemma-2-2b", 2304, "google/gemma-2-2b"},
    {"gemma-2-2b-it", 2304, "Efficient-Large-Model/gemma-2-2b-it"},
    {"gemma-2-9b", 3584, "google/gemma-2-9b"},
    {"gemma-2-9b-it", 3584, "google/gemma-2-9b-it"},
    {"Qwen2-0.5B-Instruct", 896, ""},
    {"Qwen2-1.5B-Instruct", 1536, ""},
};

bool as_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// YAML equality as a user means it: 1 == 1.0, True == true, `-` == null.
bool same_value(const YAML::Node& a, const YAML::Node& b) {
  const bool a_null = !a || a.IsNull();
  const bool b_null = !b || b.IsNull();
  if (a_null || b_null) return a_null && b_null;
  if (a.IsSequence() && b.IsSequence()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_value(a[i], b[i])) return false;
    }
    return true;
  }
  if (!a.IsScalar() || !b.IsScalar()) return false;
  double x = 0, y = 0;
  if (as_number(a.Scalar(), x) && as_number(b.Scalar(), y)) return x == y;
  return ascii_lower(a.Scalar()) == ascii_lower(b.Scalar());
}

bool under(const std::string& key, const std::string& prefix) {
  return key == prefix ||
         (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 && key[prefix.size()] == '.');
}

// The exact rule for `key`, else the rule of its nearest enclosing key.
const Rule* find_rule(const std::string& key) {
  const Rule* best = nullptr;
  size_t best_length = 0;
  for (const Rule& r : kRules) {
    const std::string k = r.key;
    if (under(key, k) && k.size() > best_length) {
      best = &r;
      best_length = k.size();
    }
  }
  return best;
}

std::string describe(const YAML::Node& n) {
  if (!n || n.IsNull()) return "null";
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << n;
  return out.c_str();
}

// Translates upstream's value names; returns the note to log, or "".
std::string apply_value_names(UpstreamTranslation& t) {
  // auto_lr: {rule: sqrt} arrives as train.auto_lr.rule; an empty auto_lr turns scaling off.
  if (t.key == "train.auto_lr" && (t.value.IsNull() || (t.value.IsMap() && t.value.size() == 0))) {
    t.value = YAML::Node(std::string("none"));
    return "";
  }
  if (!t.value.IsScalar()) return "";
  for (const ValueName& v : kValueNames) {
    if (t.key == v.key && t.value.Scalar() == v.upstream) {
      t.value = YAML::Node(std::string(v.ours));
      return v.note ? fmt::format("upstream's {}: {}: {}", t.key, v.upstream, v.note)
                    : fmt::format("upstream's {}: {} is {} here", t.key, v.upstream, v.ours);
    }
  }
  return "";
}

}  // namespace

UpstreamTranslation translate_upstream(const std::string& key, const YAML::Node& value) {
  UpstreamTranslation t;
  t.key = key;
  t.value = value;
  if (key == "train.use_fsdp") {  // a switch upstream, a stage here
    const bool on = same_value(value, YAML::Load("true"));
    if (!on && !same_value(value, YAML::Load("false"))) {
      t.error = fmt::format("train.use_fsdp: {} is not true or false", describe(value));
      t.hint = "set it to true (train.zero_stage 3) or false";
      return t;
    }
    t.key = "train.zero_stage";
    t.value = YAML::Node(on ? 3 : 0);
    t.note = on ? "upstream's train.use_fsdp: true is train.zero_stage: 3 here (parameters, gradients, optimizer state "
                  "and EMA split over the ranks, as FSDP's FULL_SHARD; the EMA is kept, which upstream drops under FSDP)"
                : "upstream's train.use_fsdp: false is train.zero_stage: 0 here";
    return t;
  }
  const Rule* rule = find_rule(key);
  if (rule && !rule->moved_to) {
    t.dropped = true;
    if (rule->refused) {
      t.error = fmt::format("{} (key {})", rule->why, key);
      t.hint = "remove the key: sana-train trains the diffusion model itself (flow matching, as upstream's train.py)";
    } else if (rule->only && !same_value(value, YAML::Load(rule->only))) {
      t.error = fmt::format("{} is not supported here: {}", describe(value), rule->why);
      t.hint = fmt::format("remove the key or set it to {}", rule->only);
    } else {
      t.note = fmt::format("upstream's {} is accepted with no effect: {}", key, rule->why);
    }
    return t;
  }
  std::vector<std::string> notes;
  if (rule) {
    t.key = rule->moved_to;
    notes.push_back(fmt::format("upstream's {} is read as {}", key, t.key));
  }
  if (std::string named = apply_value_names(t); !named.empty()) notes.push_back(named);
  t.note = fmt::format("{}", fmt::join(notes, "; "));
  return t;
}

const std::vector<std::string>& text_encoder_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = {"none", "torchscript"};
    for (const Encoder& e : kEncoders) out.push_back(e.name);
    return out;
  }();
  return names;
}

int64_t text_encoder_width(const std::string& name) {
  for (const Encoder& e : kEncoders) {
    if (name == e.name) return e.width;
  }
  return 0;
}

void resolve_upstream_style(Config& config, const OriginMap& origins, int64_t world_size,
                            std::vector<ConfigIssue>& issues) {
  auto& t = config.train;
  if (upstream_batch_style(t)) {
    for (const char* ours : {"train.global_batch_size", "train.micro_batch_size"}) {
      const auto it = origins.find(ours);
      if (it == origins.end()) continue;
      issues.push_back({ours, "is set together with upstream's train_batch_size / gradient_accumulation_steps",
                        it->second,
                        "use one style: global_batch_size + micro_batch_size (the global batch stays fixed "
                        "at any world size) or train_batch_size + gradient_accumulation_steps (upstream's: "
                        "the global batch is their product x world size)"});
    }
    if (t.train_batch_size == 0) t.train_batch_size = 32;  // upstream's defaults
    if (t.gradient_accumulation_steps == 0) t.gradient_accumulation_steps = 1;
    t.micro_batch_size = t.train_batch_size;
    t.global_batch_size = t.train_batch_size * t.gradient_accumulation_steps * std::max<int64_t>(1, world_size);
    config.load_notes.push_back(fmt::format(
        "train.global_batch_size is {}: train_batch_size {} x gradient_accumulation_steps {} x world size {}",
        t.global_batch_size, t.train_batch_size, t.gradient_accumulation_steps, world_size));
  }
  auto& text = config.text_encoder;
  const int64_t width = text_encoder_width(text.text_encoder_name);
  if (width > 0 && width != text.caption_channels && origins.count("text_encoder.caption_channels") == 0) {
    config.load_notes.push_back(fmt::format("text_encoder.caption_channels is {}, the width of {}", width,
                                            text.text_encoder_name));
    text.caption_channels = width;
  }
}

std::string text_encoder_hub_name(const std::string& name) {
  for (const Encoder& e : kEncoders) {
    if (name == e.name) return e.hub;
  }
  return "";
}

std::vector<std::string> native_text_encoder_names() {
  std::vector<std::string> out;
  for (const Encoder& e : kEncoders) {
    if (*e.hub != '\0') out.push_back(e.name);
  }
  return out;
}

bool looks_like_hub_name(const std::string& path) {
  if (path.empty() || path[0] == '/' || path[0] == '.') return false;
  const size_t slash = path.find('/');
  if (slash == std::string::npos || path.find('/', slash + 1) != std::string::npos) return false;
  const std::string last = path.substr(slash + 1);
  for (const char* ext : {".pt", ".pth", ".ts", ".bin", ".safetensors", ".ckpt"}) {
    const std::string e = ext;
    if (last.size() > e.size() && last.compare(last.size() - e.size(), e.size(), e) == 0) return false;
  }
  return true;
}

}  // namespace sana::config
