#include "sana/data/index_builder.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "sana/data/dataset_index.h"
#include "sana/data/image_header.h"
#include "sana/util/log.h"

namespace fs = std::filesystem;

namespace sana::data {

namespace {

// ---------------------------------------------------------------------------------------
// Rows from sources

struct Row {
  std::string path, caption, latent, text_feat;
  uint32_t width = 0, height = 0;
  int32_t label = -1;
};

class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual bool next(Row& row) = 0;
};

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
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

class FolderSource : public RowSource {
 public:
  explicit FolderSource(const std::string& dir) {
    for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink)) {
      if (e.is_regular_file() && is_image_file(e.path())) files_.push_back(e.path());
    }
    std::sort(files_.begin(), files_.end());  // deterministic whatever the file system
  }
  bool next(Row& row) override {
    if (i_ >= files_.size()) return false;
    const fs::path& p = files_[i_++];
    row = Row{};
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

// Shared by JSONL and CSV: relative paths are relative to the metadata file's folder.
std::string resolve(const fs::path& base, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (base / p).lexically_normal().string();
}

uint32_t parse_size(const std::string& text, const std::string& where, const char* what) {
  if (text.empty()) return 0;
  try {
    const long v = std::stol(text);
    if (v < 0 || v > (1 << 20)) throw std::out_of_range("size");
    return static_cast<uint32_t>(v);
  } catch (const std::exception&) {
    throw IndexError(fmt::format("{}: {} '{}' is not a size in pixels", where, what, text));
  }
}

class JsonlSource : public RowSource {
 public:
  explicit JsonlSource(const std::string& file) : file_(file), in_(file), base_(fs::path(file).parent_path()) {
    if (!in_) throw IndexError(fmt::format("cannot read metadata file '{}'", file));
  }
  bool next(Row& row) override {
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
      row = Row{};
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
  bool next(Row& row) override {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_no_;
      if (trim(line).empty()) continue;
      const auto f = split_csv(line);
      const std::string where = fmt::format("{}:{}", file_, line_no_);
      auto get = [&](std::initializer_list<const char*> names) {
        const int c = column(names);
        return c >= 0 && static_cast<size_t>(c) < f.size() ? f[static_cast<size_t>(c)] : std::string();
      };
      row = Row{};
      row.path = resolve(base_, get({"path", "image", "image_path", "file_name", "file"}));
      if (row.path.empty()) throw IndexError(fmt::format("{}: empty image path", where));
      row.caption = get({"caption", "prompt", "text"});
      row.width = parse_size(get({"width", "w"}), where, "width");
      row.height = parse_size(get({"height", "h"}), where, "height");
      row.label = parse_label(get({"label", "class", "class_id"}), where);
      row.latent = resolve(base_, get({"latent", "latent_path", "vae_feat"}));
      row.text_feat = resolve(base_, get({"text_feat", "text_feat_path", "caption_feature"}));
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
  bool next(Row& row) override {
    if (i_ >= idx_.size()) return false;
    const IndexRecord& r = idx_.record(i_);
    const SampleText t = idx_.text(i_++);
    row = Row{std::string(t.path), std::string(t.caption), std::string(t.latent),
              std::string(t.text_feat), r.width, r.height, r.label};
    return true;
  }

 private:
  DatasetIndex idx_;
  uint64_t i_ = 0;
};

std::unique_ptr<RowSource> open_source(const std::string& src) {
  std::error_code ec;
  if (fs::is_directory(src, ec)) return std::make_unique<FolderSource>(src);
  if (!fs::is_regular_file(src, ec)) {
    throw IndexError(fmt::format("data source '{}' does not exist", src));
  }
  if (is_index_file(src)) return std::make_unique<IndexSource>(src);
  const std::string ext = fs::path(src).extension().string();
  if (ext == ".jsonl" || ext == ".json") return std::make_unique<JsonlSource>(src);
  if (ext == ".csv") return std::make_unique<CsvSource>(src);
  throw IndexError(fmt::format("data source '{}' is not a folder, a .jsonl or .csv metadata file "
                               "or a dataset index",
                               src));
}

// ---------------------------------------------------------------------------------------
// Writing

class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "w+b");
    if (f_ == nullptr) throw IndexError(fmt::format("cannot write '{}'", path_));
  }
  ~TempFile() {
    if (f_ != nullptr) std::fclose(f_);
    std::remove(path_.c_str());
  }
  void write(const void* p, size_t n) {
    if (std::fwrite(p, 1, n, f_) != n) throw IndexError(fmt::format("writing '{}' failed (disk full?)", path_));
  }
  std::FILE* get() { return f_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

void fill_sizes(std::vector<Row>& rows, std::vector<uint32_t>& flags, int threads,
                IndexBuildResult& result) {
  std::vector<size_t> todo;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].width == 0 || rows[i].height == 0) todo.push_back(i);
  }
  if (todo.empty()) return;
  std::vector<ImageSize> sizes(todo.size());
  std::vector<std::thread> pool;
  const size_t n = static_cast<size_t>(std::max(1, threads));
  for (size_t t = 0; t < n; ++t) {
    pool.emplace_back([&, t] {
      for (size_t k = t; k < todo.size(); k += n) sizes[k] = read_image_size(rows[todo[k]].path);
    });
  }
  for (auto& th : pool) th.join();
  for (size_t k = 0; k < todo.size(); ++k) {
    Row& r = rows[todo[k]];
    if (sizes[k].ok) {
      r.width = static_cast<uint32_t>(sizes[k].width);
      r.height = static_cast<uint32_t>(sizes[k].height);
      ++result.sizes_read;
    } else {
      flags[todo[k]] |= kSizeUnknown;
      ++result.unreadable;
      log::warn("index: cannot read the size of '{}': {}", r.path, sizes[k].error);
    }
  }
}

uint16_t short_length(const std::string& s, const char* what) {
  if (s.size() > 65535) throw IndexError(fmt::format("a {} longer than 65535 bytes: {}...", what, s.substr(0, 80)));
  return static_cast<uint16_t>(s.size());
}

}  // namespace

bool is_index_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof kIndexMagic] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == sizeof magic && std::memcmp(magic, kIndexMagic, sizeof magic) == 0;
}

IndexBuildResult build_index(const std::vector<std::string>& sources, const std::string& output,
                             const IndexBuildOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  IndexBuildResult result;
  const int threads = options.threads > 0 ? options.threads
                                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const fs::path out_path(output);
  if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path());
  // Host and pid: ranks of several nodes may build the same cached index on a shared disk.
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  const std::string tmp_base = fmt::format("{}.tmp.{}.{}", output, host, getpid());
  TempFile records(tmp_base + ".records"), blob(tmp_base + ".blob");
  uint64_t blob_size = 0;
  auto last_report = start;

  constexpr size_t kChunk = 4096;
  std::vector<Row> rows;
  std::vector<uint32_t> flags;
  auto flush = [&] {
    fill_sizes(rows, flags, threads, result);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      IndexRecord rec{};
      rec.offset = blob_size;
      rec.path_len = short_length(r.path, "path");
      rec.caption_len = static_cast<uint32_t>(r.caption.size());
      rec.latent_len = short_length(r.latent, "latent path");
      rec.text_feat_len = short_length(r.text_feat, "text-feature path");
      rec.width = r.width;
      rec.height = r.height;
      rec.label = r.label;
      rec.flags = flags[i] | (r.label >= 0 ? kHasLabel : 0u) | (r.latent.empty() ? 0u : kHasLatent) |
                  (r.text_feat.empty() ? 0u : kHasTextFeat);
      records.write(&rec, sizeof rec);
      for (const std::string* s : {&r.path, &r.caption, &r.latent, &r.text_feat}) {
        blob.write(s->data(), s->size());
        blob_size += s->size();
      }
    }
    result.rows += rows.size();
    if (options.on_rows) options.on_rows(result.rows);
    rows.clear();
    flags.clear();
    const auto now = std::chrono::steady_clock::now();
    if (options.progress_every_s > 0 &&
        std::chrono::duration<double>(now - last_report).count() >= options.progress_every_s) {
      const double secs = std::chrono::duration<double>(now - start).count();
      log::info("index: {} rows ({:.0f} rows/s), {} sizes read from headers, {} unreadable",
                result.rows, result.rows / secs, result.sizes_read, result.unreadable);
      last_report = now;
    }
  };
  for (const auto& src : sources) {
    auto source = open_source(src);
    Row row;
    while (source->next(row)) {
      rows.push_back(std::move(row));
      flags.push_back(0);
      if (rows.size() == kChunk) flush();
    }
  }
  flush();

  // Header, records, blob: copied into the final file while hashing, then renamed.
  IndexHeader h{};
  std::memcpy(h.magic, kIndexMagic, sizeof kIndexMagic);
  h.version = kIndexVersion;
  h.record_size = sizeof(IndexRecord);
  h.count = result.rows;
  h.records_offset = sizeof(IndexHeader);
  h.blob_offset = h.records_offset + result.rows * sizeof(IndexRecord);
  h.blob_size = blob_size;
  const std::string tmp_out = tmp_base + ".out";
  {
    TempFile out(tmp_out);
    out.write(&h, sizeof h);
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hasher(XXH3_createState(),
                                                                     &XXH3_freeState);
    XXH3_state_t* state = hasher.get();
    XXH3_64bits_reset(state);
    std::vector<char> buf(1 << 20);
    for (TempFile* part : {&records, &blob}) {
      std::fflush(part->get());
      std::rewind(part->get());
      size_t n = 0;
      while ((n = std::fread(buf.data(), 1, buf.size(), part->get())) > 0) {
        XXH3_64bits_update(state, buf.data(), n);
        out.write(buf.data(), n);
      }
    }
    h.content_hash = XXH3_64bits_digest(state);
    std::rewind(out.get());
    out.write(&h, sizeof h);
    if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0) {
      throw IndexError(fmt::format("writing '{}' failed (disk full?)", tmp_out));
    }
    fs::rename(tmp_out, output);  // the TempFile then finds nothing left to remove
  }
  result.bytes = fs::file_size(output);
  result.fingerprint = fmt::format("{:016x}", h.content_hash);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string ensure_index(const std::vector<std::string>& sources, const std::string& cache_dir,
                         const IndexBuildOptions& options) {
  if (sources.size() == 1 && fs::is_regular_file(sources[0]) && is_index_file(sources[0])) {
    return sources[0];
  }
  // The cache key: every source file's path, size and modification time; for a folder,
  // every file in it (a caption edited deep inside changes the key).
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                   &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  auto add = [&](const fs::path& p) {
    std::error_code ec;
    const std::string abs = fs::absolute(p, ec).string();
    const auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
    const uintmax_t size = fs::is_regular_file(p, ec) ? fs::file_size(p, ec) : 0;
    XXH3_64bits_update(state.get(), abs.data(), abs.size() + 1);
    XXH3_64bits_update(state.get(), &mtime, sizeof mtime);
    XXH3_64bits_update(state.get(), &size, sizeof size);
  };
  for (const auto& src : sources) {
    add(src);
    std::error_code ec;
    if (!fs::is_directory(src, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(src, ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) add(f);
  }
  const uint64_t key = XXH3_64bits_digest(state.get());
  const std::string path = (fs::path(cache_dir) / fmt::format("index-{:016x}.sidx", key)).string();
  if (fs::exists(path)) return path;
  log::info("indexing {} source{} into {}", sources.size(), sources.size() == 1 ? "" : "s", path);
  const auto r = build_index(sources, path, options);
  log::info("indexed {} samples in {:.1f} s ({} sizes read from headers, {} unreadable)", r.rows,
            r.seconds, r.sizes_read, r.unreadable);
  return path;
}

}  // namespace sana::data
