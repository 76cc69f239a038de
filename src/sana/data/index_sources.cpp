#include "sana/data/index_sources.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "sana/data/dataset_index.h"
#include "sana/data/folder_walk.h"
#include "sana/data/index_builder.h"
#include "sana/data/sample_meta.h"
#include "sana/data/index_fields.h"
#include "sana/data/index_wids.h"
#include "sana/util/text.h"

namespace fs = std::filesystem;

namespace sana::data {

namespace fields {

bool is_image_file(const fs::path& p) {
  const std::string ext = ascii_lower(p.extension().string());
  // Formats whose size the header reader knows (TIFF is not among them).
  for (const char* e : {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif"}) {
    if (ext == e) return true;
  }
  return false;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

// The first of `names` present in `obj` as a string (or number, as text).
std::string json_text(const nlohmann::json& obj, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    auto it = obj.find(n);
    if (it == obj.end() || it->is_null()) continue;
    if (it->is_string()) return it->get<std::string>();
    return it->dump();
  }
  return "";
}

int32_t parse_label(const std::string& text, const std::string& where) {
  if (text.empty()) return -1;
  try {
    size_t used = 0;
    const long v = std::stol(text, &used);
    if (used != text.size() || v < 0 || v > (1L << 30)) throw std::out_of_range("label");
    return static_cast<int32_t>(v);
  } catch (const std::exception&) {
    throw IndexError(fmt::format("{}: label '{}' is not a class number (0, 1, 2, ...)", where, text));
  }
}

// Shared by JSONL and CSV: relative paths are relative to the metadata file's folder.
std::string resolve(const fs::path& base, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (base / p).lexically_normal().string();
}

uint32_t parse_size(const std::string& text, const std::string& where, const char* what) {
  if (text.empty()) return 0;
  try {
    size_t used = 0;
    const long v = std::stol(text, &used);
    if (used != text.size() || v < 0 || v > (1 << 20)) throw std::out_of_range("size");
    return static_cast<uint32_t>(v);
  } catch (const std::exception&) {
    throw IndexError(fmt::format("{}: {} '{}' is not a size in pixels", where, what, text.substr(0, 80)));
  }
}

// The index stores paths with a 16-bit length: a longer one is the line's error.
void check_path_length(const std::string& path, const std::string& where, const char* what) {
  if (path.size() > 65535) {
    throw IndexError(fmt::format("{}: the {} is {} bytes long (at most 65535): {}...", where, what, path.size(),
                                 path.substr(0, 80)));
  }
}

void check_row_paths(const IndexRow& row, const std::string& where) {
  check_path_length(row.path, where, "image path");
  check_path_length(row.latent, where, "latent path");
  check_path_length(row.text_feat, where, "text feature path");
  check_path_length(row.meta, where, "metadata kept for it (its extra captions and CLIP scores)");
}

}  // namespace fields

namespace {

using namespace fields;

class FolderSource : public RowSource {
 public:
  explicit FolderSource(const std::string& dir) {
    for (auto& f : files_under(dir)) {  // sorted: deterministic whatever the file system
      if (is_image_file(f)) files_.push_back(std::move(f));
    }
  }
  bool next(IndexRow& row) override {
    if (i_ >= files_.size()) return false;
    const fs::path& p = files_[i_++];
    row = IndexRow{};
    row.path = p.string();
    fs::path side = p;
    if (fs::exists(side.replace_extension(".txt"))) {
      row.caption = trim(read_file(side));
    } else if (fs::exists(side.replace_extension(".json"))) {
      try {
        const auto j = nlohmann::json::parse(read_file(side));
        row.caption = json_text(j, {"caption", "prompt", "text"});
        row.label = parse_label(json_text(j, {"label", "class", "class_id"}), side.string());
      } catch (const std::exception& e) {
        throw IndexError(fmt::format("caption file '{}' is not valid JSON: {}", side.string(), e.what()));
      }
    }
    return true;
  }

 private:
  std::vector<fs::path> files_;
  size_t i_ = 0;
};

// The first byte offset that is not well-formed UTF-8, or npos.
size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;  // cut short
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return i;
    }
    i += n + 1;
  }
  return std::string::npos;
}

class JsonlSource : public RowSource {
 public:
  explicit JsonlSource(const std::string& file) : file_(file), in_(file), base_(fs::path(file).parent_path()) {
    if (!in_) throw IndexError(fmt::format("cannot read metadata file '{}'", file));
  }
  bool next(IndexRow& row) override {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_no_;
      if (trim(line).empty()) continue;
      const std::string where = fmt::format("{}:{}", file_, line_no_);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw IndexError(fmt::format("{}: not a JSON object: {}", where, e.what()));
      }
      if (!j.is_object()) throw IndexError(fmt::format("{}: not a JSON object", where));
      row = IndexRow{};
      row.path = resolve(base_, json_text(j, {"path", "image", "image_path", "file_name", "file"}));
      if (row.path.empty()) {
        throw IndexError(fmt::format("{}: no image path (keys: path, image, file_name)", where));
      }
      row.caption = json_text(j, {"caption", "prompt", "text"});
      row.width = parse_size(json_text(j, {"width", "w"}), where, "width");
      row.height = parse_size(json_text(j, {"height", "h"}), where, "height");
      row.label = parse_label(json_text(j, {"label", "class", "class_id"}), where);
      row.latent = resolve(base_, json_text(j, {"latent", "latent_path", "vae_feat"}));
      row.text_feat = resolve(base_, json_text(j, {"text_feat", "text_feat_path", "caption_feature"}));
      row.meta = meta_with_files(resolve(base_, json_text(j, {"control", "control_image", "conditioning_image"})),
                                 resolve(base_, json_text(j, {"control_latent"})),
                                 resolve(base_, json_text(j, {"mask", "mask_image", "mask_path"})));
      check_row_paths(row, where);
      return true;
    }
    return false;
  }

 private:
  std::string file_;
  std::ifstream in_;
  fs::path base_;
  uint64_t line_no_ = 0;
};

constexpr size_t kMaxRecord = 64u << 20;

// Whether a CSV text has an odd number of quotes: a record so far with a quoted field still
// open (it goes on on the next line), or a line that flips that.
bool quote_open(const std::string& record) {
  return std::count(record.begin(), record.end(), '"') % 2 == 1;
}

// RFC 4180 fields: commas, double quotes, doubled quotes inside quotes.
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  return out;
}

class CsvSource : public RowSource {
 public:
  explicit CsvSource(const std::string& file) : file_(file), in_(file), base_(fs::path(file).parent_path()) {
    if (!in_) throw IndexError(fmt::format("cannot read metadata file '{}'", file));
    std::string header;
    std::getline(in_, header);
    columns_ = split_csv(header);
    ++line_no_;
    if (column({"path", "image", "image_path", "file_name", "file"}) < 0) {
      throw IndexError(fmt::format("{}:1: the header names no image path column (path, image, "
                                   "file_name)",
                                   file));
    }
  }
  bool next(IndexRow& row) override {
    std::string line;
    while (std::getline(in_, line)) {
      const uint64_t first_line = ++line_no_;
      if (trim(line).empty()) continue;
      // A quoted field may hold newlines (RFC 4180): the record goes on.
      std::string more;
      bool in_quotes = quote_open(line);
      while (in_quotes && std::getline(in_, more)) {
        ++line_no_;
        line += '\n' + more;
        in_quotes ^= quote_open(more);  // each line flips the parity by its own quotes
        if (line.size() > kMaxRecord) {
          throw IndexError(fmt::format("{}:{}: a quoted field runs on for over {} MiB (a quote never closed?)", file_,
                                       first_line, kMaxRecord >> 20));
        }
      }
      const std::string where = fmt::format("{}:{}", file_, first_line);
      if (in_quotes) throw IndexError(fmt::format("{}: a quoted field is never closed", where));
      if (const size_t bad = invalid_utf8_at(line); bad != std::string::npos) {
        throw IndexError(fmt::format("{}: byte {} (0x{:02X}) is not UTF-8; save the file as UTF-8", where, bad + 1,
                                     static_cast<unsigned char>(line[bad])));
      }
      const auto f = split_csv(line);
      auto get = [&](std::initializer_list<const char*> names) {
        const int c = column(names);
        return c >= 0 && static_cast<size_t>(c) < f.size() ? f[static_cast<size_t>(c)] : std::string();
      };
      row = IndexRow{};
      row.path = resolve(base_, get({"path", "image", "image_path", "file_name", "file"}));
      if (row.path.empty()) throw IndexError(fmt::format("{}: empty image path", where));
      row.caption = get({"caption", "prompt", "text"});
      row.width = parse_size(get({"width", "w"}), where, "width");
      row.height = parse_size(get({"height", "h"}), where, "height");
      row.label = parse_label(get({"label", "class", "class_id"}), where);
      row.latent = resolve(base_, get({"latent", "latent_path", "vae_feat"}));
      row.text_feat = resolve(base_, get({"text_feat", "text_feat_path", "caption_feature"}));
      row.meta = meta_with_files(resolve(base_, get({"control", "control_image", "conditioning_image"})),
                                 resolve(base_, get({"control_latent"})), resolve(base_, get({"mask", "mask_image", "mask_path"})));
      check_row_paths(row, where);
      return true;
    }
    return false;
  }

 private:
  int column(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      auto it = std::find(columns_.begin(), columns_.end(), n);
      if (it != columns_.end()) return static_cast<int>(it - columns_.begin());
    }
    return -1;
  }
  std::string file_;
  std::ifstream in_;
  fs::path base_;
  std::vector<std::string> columns_;
  uint64_t line_no_ = 0;
};

class IndexSource : public RowSource {
 public:
  explicit IndexSource(const std::string& file) : idx_(DatasetIndex::open(file)) {}
  bool next(IndexRow& row) override {
    if (i_ >= idx_.size()) return false;
    const IndexRecord& r = idx_.record(i_);
    const SampleText t = idx_.text(i_++);
    row = IndexRow{std::string(t.path), std::string(t.caption), std::string(t.latent),
                   std::string(t.text_feat), r.width, r.height, r.label, std::string(t.meta)};
    return true;
  }

 private:
  DatasetIndex idx_;
  uint64_t i_ = 0;
};

}  // namespace

std::unique_ptr<RowSource> open_source(const std::string& src, const CaptionSources& captions) {
  std::error_code ec;
  if (auto wids = open_wids_source(src, captions)) return wids;  // before a folder's images or a .json's rows
  if (fs::is_directory(src, ec)) return std::make_unique<FolderSource>(src);
  if (!fs::is_regular_file(src, ec)) {
    throw IndexError(fmt::format("data source '{}' does not exist", src));
  }
  if (is_index_file(src)) return std::make_unique<IndexSource>(src);
  const std::string ext = fs::path(src).extension().string();
  if (ext == ".jsonl" || ext == ".json") return std::make_unique<JsonlSource>(src);
  if (ext == ".csv") return std::make_unique<CsvSource>(src);
  throw IndexError(fmt::format("data source '{}' is not a folder, a .jsonl or .csv metadata file, "
                               "a wids-meta.json or .tar shard, or a dataset index",
                               src));
}

}  // namespace sana::data
