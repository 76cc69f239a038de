#include "sana/data/sample_meta.h"

#include "sana/util/hash.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "sana/data/dataset_index.h"
#include "sana/data/index_fields.h"

namespace fs = std::filesystem;

namespace sana::data {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

Json parse_meta(std::string_view meta) {
  if (meta.empty()) return Json::object();
  Json j = Json::parse(meta.begin(), meta.end(), nullptr, false);
  return j.is_object() ? j : Json::object();
}

// Python's float(x) of a score: a number, or a string holding one.
double score_of(const OrderedJson& v, const std::string& where) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = fields::trim(v.get<std::string>());
    size_t used = 0;
    try {
      const double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::exception&) {
    }
  }
  throw IndexError(fmt::format("{}: {} is not a CLIP score (a number)", where, v.dump()));
}

// The shard's path without its ".tar": upstream's __shard__.replace(".tar", suffix + ".json").
std::string shard_stem(const std::string& shard) {
  const fs::path p(shard);
  return p.extension() == ".tar" ? (p.parent_path() / p.stem()).string() : shard;
}

}  // namespace

std::string CaptionSources::describe() const {
  if (!any()) return "";
  return fmt::format("captions {} clipscores {} names {}", caption_suffixes, clipscore_suffixes, names);
}

std::string SampleFilter::describe() const {
  std::string s = fmt::format("hq_only {} del_img_clip_thr {}", hq_only, min_clip_score);
  if (holdout > 0) s += fmt::format(" train.eval.fraction {} seed {} {}", holdout, holdout_seed, held_out ? "held out" : "trained");
  return s;
}

std::string meta_with_files(const std::string& control, const std::string& control_latent, const std::string& mask) {
  Json j = Json::object();
  if (!control.empty()) j["control"] = control;
  if (!control_latent.empty()) j["control_latent"] = control_latent;
  if (!mask.empty()) j["mask"] = mask;
  return j.empty() ? "" : j.dump();
}

namespace {
std::string meta_path(std::string_view meta, const char* key) {
  const Json j = parse_meta(meta);
  const auto c = j.find(key);
  return c != j.end() && c->is_string() ? c->get<std::string>() : "";
}
}  // namespace

std::string control_image(std::string_view meta) { return meta_path(meta, "control"); }
std::string control_latent(std::string_view meta) { return meta_path(meta, "control_latent"); }
std::string mask_image(std::string_view meta) { return meta_path(meta, "mask"); }

const char* SampleFilter::drops(std::string_view meta, std::string_view path) const {
  if (holdout > 0) {
    util::RandomStream draw(util::stream_key("sample.holdout", {holdout_seed, hash64(path.data(), path.size())}));
    if ((draw.uniform() < holdout) != held_out) return held_out ? "train.eval.fraction (trained)" : "train.eval.fraction (held out)";
  }
  const Json j = parse_meta(meta);
  if (hq_only) {
    const auto v = j.find("version");
    if (v == j.end() || !v->is_string() || v->get<std::string>() != "high_quality") return "data.hq_only";
  }
  if (min_clip_score > 0) {
    const auto c = j.find("clip");
    // No score file: upstream's 100. In the file without this sample: upstream cannot read
    // the sample's info and skips it. A score of 0 passes (upstream tests the score's truth).
    if (c != j.end()) {
      if (!c->is_number()) return "data.del_img_clip_thr";
      const double score = c->get<double>();
      if (score != 0 && score < min_clip_score) return "data.del_img_clip_thr";
    } else if (100.0 < min_clip_score) {
      return "data.del_img_clip_thr";
    }
  }
  return nullptr;
}

namespace {

// The caption called `name`: the sample's prompt, or one of the metadata's ("" for a null
// one, as upstream trains it); the prompt when the sample has no such caption.
std::string caption_named(const std::string& name, std::string_view prompt, const Json& meta) {
  if (name == "prompt") return std::string(prompt);
  const auto captions = meta.find("captions");
  if (captions == meta.end()) return std::string(prompt);
  const auto c = captions->find(name);
  if (c == captions->end()) return std::string(prompt);
  return c->is_string() ? c->get<std::string>() : std::string();
}

// Index of the draw of `weights` (non-negative) with `rng`: random.choices' rule.
size_t draw(const std::vector<double>& weights, util::RandomStream& rng) {
  double total = 0;
  for (double w : weights) total += w;
  if (!(total > 0)) return 0;
  const double x = rng.uniform() * total;
  double acc = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    acc += weights[i];
    if (x < acc) return i;
  }
  return weights.size() - 1;
}

}  // namespace

bool CaptionChoice::draws() const {
  if (type == CaptionSelection::clipscore) return scored;
  return std::any_of(proportion.begin(), proportion.end(),
                     [](const auto& p) { return p.first != "prompt" && p.second > 0; });
}

std::string CaptionChoice::choose(std::string_view prompt, std::string_view meta, util::RandomStream& rng) const {
  if (!draws()) return std::string(prompt);
  const Json j = parse_meta(meta);
  if (type == CaptionSelection::proportion) {
    std::vector<double> weights;
    for (const auto& p : proportion) weights.push_back(p.second);
    return caption_named(proportion.at(draw(weights, rng)).first, prompt, j);
  }
  const auto scores = j.find("scores");
  if (scores == j.end() || !scores->is_array() || scores->empty()) return std::string(prompt);
  std::vector<std::string> labels;
  std::vector<double> kept;
  std::string fallback;
  double best = -std::numeric_limits<double>::infinity();
  for (const auto& entry : *scores) {
    const std::string name = entry.at(0).get<std::string>();
    const double score = entry.at(1).get<double>();
    if (score >= clip_thr) {
      labels.push_back(name);
      kept.push_back(score);
    }
    if (score > best) best = score, fallback = name;
  }
  if (labels.empty()) return caption_named(fallback, prompt, j);
  // score^(1/t), normalised: computed relative to the largest score, so that a low
  // temperature (an exponent up to 100) cannot overflow.
  const double exponent = 1.0 / std::max(temperature, 0.01);
  const double top = *std::max_element(kept.begin(), kept.end());
  std::vector<double> weights;
  for (double s : kept) weights.push_back(s > 0 && top > 0 ? std::pow(s / top, exponent) : 0.0);
  return caption_named(labels[draw(weights, rng)], prompt, j);
}

ShardSidecars::File ShardSidecars::load(const std::string& path) {
  File f;
  f.path = path;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return f;
  try {
    f.json = OrderedJson::parse(fields::read_file(path));
  } catch (const std::exception& e) {
    throw IndexError(fmt::format("'{}' is not valid JSON: {}", path, e.what()));
  }
  if (!f.json.is_object()) throw IndexError(fmt::format("'{}' is not a JSON object of sample keys", path));
  f.present = true;
  return f;
}

ShardSidecars::ShardSidecars(const std::string& shard, const CaptionSources& sources) : sources_(sources) {
  const std::string stem = shard_stem(shard);
  prompt_clip_ = load(stem + "_prompt_clip_score.json");
  for (const auto& s : sources.caption_suffixes) captions_.push_back(load(stem + s + ".json"));
  for (const auto& s : sources.clipscore_suffixes) clipscores_.push_back(load(stem + s + ".json"));
}

std::string ShardSidecars::meta_for(const std::string& key, const nlohmann::json& info) const {
  Json meta = Json::object();
  if (const auto v = info.find("version"); v != info.end() && v->is_string()) meta["version"] = *v;
  if (prompt_clip_.present) {
    const auto e = prompt_clip_.json.find(key);
    const bool has = e != prompt_clip_.json.end() && e->is_object() && e->contains("prompt");
    meta["clip"] = has ? Json(score_of(e->at("prompt"), fmt::format("{}: \"{}\"", prompt_clip_.path, key)))
                       : Json(nullptr);
  }
  if (!sources_.any()) return meta.empty() ? "" : meta.dump();
  // The sample's info as SanaWebDatasetMS merges it: an external entry with a "prompt"
  // adds that caption under the suffix's name (dots as underscores); one without adds its keys.
  OrderedJson merged(info);
  for (size_t i = 0; i < captions_.size(); ++i) {
    if (!captions_[i].present) continue;
    const auto e = captions_[i].json.find(key);
    if (e == captions_[i].json.end() || !e->is_object()) continue;
    if (e->contains("prompt")) {
      std::string name = sources_.caption_suffixes[i];
      std::replace(name.begin(), name.end(), '.', '_');
      merged[name] = e->at("prompt");
    } else {
      merged.update(*e);
    }
  }
  // Scores of the captions the sample has, in upstream's order: suffix by suffix, each
  // file's entries as written.
  Json scores = Json::array();
  std::vector<std::string> wanted = sources_.names;
  for (size_t i = 0; i < clipscores_.size(); ++i) {
    if (!clipscores_[i].present) continue;
    const auto e = clipscores_[i].json.find(key);
    if (e == clipscores_[i].json.end() || !e->is_object()) continue;
    for (const auto& [name, value] : e->items()) {
      if (!merged.contains(name)) continue;
      scores.push_back(Json::array({name, score_of(value, fmt::format("{}: \"{}\".{}", clipscores_[i].path, key, name))}));
      wanted.push_back(name);
    }
  }
  Json captions = Json::object();
  for (const auto& name : wanted) {
    const auto c = merged.find(name);
    if (name == "prompt" || c == merged.end() || !(c->is_string() || c->is_null())) continue;
    captions[name] = *c;
  }
  if (!scores.empty()) meta["scores"] = std::move(scores);
  if (!captions.empty()) meta["captions"] = std::move(captions);
  return meta.empty() ? "" : meta.dump();
}

}  // namespace sana::data
