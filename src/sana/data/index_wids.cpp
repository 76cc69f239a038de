#include "sana/data/index_wids.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "sana/data/dataset_index.h"
#include "sana/data/file_ref.h"
#include "sana/data/index_fields.h"
#include "sana/data/sample_meta.h"
#include "sana/data/tar_reader.h"
#include "sana/util/log.h"
#include "sana/util/text.h"

namespace fs = std::filesystem;

namespace sana::data {

namespace {

using namespace fields;

// wids' splitname: the key is the member's path up to the first dot of its file name, the
// extension the rest (".json", ".npy", ".vae.npy").
std::pair<std::string, std::string> split_member(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), name.substr(dot)};
}

bool looks_like_wids_meta(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(64 * 1024, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  const size_t first = head.find_first_not_of(" \t\r\n");
  return first != std::string::npos && head[first] == '{' && head.find("\"shardlist\"") != std::string::npos;
}

// The shards a wids-meta.json lists, as paths relative to its folder.
std::vector<std::string> shard_list(const std::string& meta) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(meta));
  } catch (const std::exception& e) {
    throw IndexError(fmt::format("'{}' is not valid JSON: {}", meta, e.what()));
  }
  const auto list = j.is_object() ? j.find("shardlist") : j.end();
  if (list == j.end() || !list->is_array()) {
    throw IndexError(fmt::format("'{}' has no \"shardlist\" array (the wids-meta.json layout)", meta));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < list->size(); ++i) {
    const auto& s = (*list)[i];
    const std::string url = s.is_object() ? json_text(s, {"url"}) : "";
    const std::string where = fmt::format("{}: shardlist[{}]", meta, i);
    if (url.empty()) throw IndexError(where + ": no \"url\"");
    if (url.find("://") != std::string::npos) {
      throw IndexError(fmt::format("{}: '{}' is remote; copy the shards to a local or network file system", where, url));
    }
    out.push_back(resolve(fs::path(meta).parent_path(), url));
  }
  if (out.empty()) throw IndexError(fmt::format("'{}' lists no shards", meta));
  return out;
}

class WidsSource : public RowSource {
 public:
  WidsSource(std::vector<std::string> shards, fs::path feature_dir, CaptionSources captions)
      : shards_(std::move(shards)), feature_dir_(std::move(feature_dir)), cwd_(fs::current_path()),
        captions_(std::move(captions)) {}

  bool next(IndexRow& row) override {
    while (rows_.empty()) {
      if (next_shard_ >= shards_.size()) return false;
      read_shard(shards_[next_shard_++]);
    }
    row = std::move(rows_.front());
    rows_.pop_front();
    return true;
  }

 private:
  struct Sample {
    std::string key;
    std::vector<TarMember> members;  // with their extensions as names
  };

  void read_shard(const std::string& shard) {
    std::vector<Sample> samples;
    scan_tar(shard, [&](const TarMember& m) {
      auto [key, ext] = split_member(m.name);
      TarMember member = m;
      member.name = ascii_lower(ext);
      if (samples.empty() || samples.back().key != key) samples.push_back({key, {}});
      samples.back().members.push_back(member);
    });
    std::ifstream in(shard, std::ios::binary);
    const ShardSidecars sidecars(shard, captions_);
    int64_t without_json = 0;
    for (const Sample& s : samples) {
      IndexRow row;
      if (!fill(shard, s, in, sidecars, row)) {
        ++without_json;
        continue;
      }
      check_row_paths(row, fmt::format("{}: sample '{}'", shard, s.key));
      rows_.push_back(std::move(row));
    }
    if (without_json > 0) {
      log::warn("index: {} of {} samples in '{}' have no .json member and were left out", without_json,
                samples.size(), shard);
    }
  }

  // A sample's row from its members; false when it has no .json (upstream cannot read it).
  bool fill(const std::string& shard, const Sample& s, std::ifstream& in, const ShardSidecars& sidecars,
            IndexRow& row) const {
    const TarMember* json = nullptr;
    const TarMember* image = nullptr;
    for (const TarMember& m : s.members) {
      const std::string ref = member_ref(shard, s.key + m.name, m.offset, m.size);
      if (m.name == ".json") json = &m;
      else if (m.name == ".npy") row.latent = ref;
      else if (m.name == ".npz") row.text_feat = ref;
      else if (image == nullptr && is_image_file(fs::path("x" + m.name))) image = &m;
    }
    if (json == nullptr) return false;
    const std::string where = fmt::format("{}: '{}.json'", shard, s.key);
    if (json->size > (16u << 20)) throw IndexError(where + " is larger than 16 MB");
    std::string text(json->size, '\0');
    in.seekg(static_cast<std::streamoff>(json->offset));
    if (!in.read(text.data(), static_cast<std::streamsize>(text.size()))) throw IndexError(where + ": cannot read it");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw IndexError(fmt::format("{}: not valid JSON: {}", where, e.what()));
    }
    if (!j.is_object()) throw IndexError(where + ": not a JSON object");
    const TarMember& path = image != nullptr ? *image : *json;
    row.path = member_ref(shard, s.key + path.name, path.offset, path.size);
    row.caption = json_text(j, {"prompt", "caption", "text"});
    row.width = parse_size(json_text(j, {"width"}), where, "width");
    row.height = parse_size(json_text(j, {"height"}), where, "height");
    row.label = parse_label(json_text(j, {"label"}), where);
    if (row.text_feat.empty()) row.text_feat = text_feature_file(s.key);
    row.meta = sidecars.meta_for(s.key, j);
    return true;
  }

  // Upstream reads f"{key}.npz" relative to the working directory; beside wids-meta.json
  // comes first here. "" when neither exists (a run with load_text_feat reports it).
  std::string text_feature_file(const std::string& key) const {
    std::error_code ec;
    for (const fs::path& dir : {feature_dir_, cwd_}) {
      const fs::path p = dir / (key + ".npz");
      if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
    }
    return "";
  }

  std::vector<std::string> shards_;
  size_t next_shard_ = 0;
  fs::path feature_dir_, cwd_;
  CaptionSources captions_;
  std::deque<IndexRow> rows_;
};

}  // namespace

std::unique_ptr<RowSource> open_wids_source(const std::string& src, const CaptionSources& captions) {
  std::error_code ec;
  const fs::path p(src);
  if (fs::is_directory(p, ec)) {
    const fs::path meta = p / "wids-meta.json";
    if (!fs::is_regular_file(meta, ec)) return nullptr;
    return std::make_unique<WidsSource>(shard_list(meta.string()), p, captions);
  }
  if (ascii_lower(p.extension().string()) == ".tar") {
    return std::make_unique<WidsSource>(std::vector<std::string>{src}, p.parent_path(), captions);
  }
  if (ascii_lower(p.extension().string()) == ".json" && looks_like_wids_meta(src)) {
    return std::make_unique<WidsSource>(shard_list(src), p.parent_path(), captions);
  }
  return nullptr;
}

}  // namespace sana::data
