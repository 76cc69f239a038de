#include "sana/data/index_builder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "sana/data/dataset_index.h"
#include "sana/data/folder_walk.h"
#include "sana/data/image_header.h"
#include "sana/data/index_sources.h"
#include "sana/util/hash.h"
#include "sana/util/log.h"

namespace fs = std::filesystem;

namespace sana::data {

namespace {

using Clock = std::chrono::steady_clock;

// Writing the index failed: an I/O error (exit 1), naming the folder and the cause.
[[noreturn]] void write_failed(const std::string& path, int err) {
  const fs::path p(path);
  throw sana::RunError(fmt::format("cannot write the index into '{}' ({}): {}", p.parent_path().string(),
                                   p.filename().string(), std::strerror(err)),
                       "index error");
}

class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "w+b");
    if (f_ == nullptr) write_failed(path_, errno);
  }
  ~TempFile() {
    if (f_ != nullptr) std::fclose(f_);
    std::remove(path_.c_str());
  }
  void write(const void* p, size_t n) {
    if (std::fwrite(p, 1, n, f_) != n) write_failed(path_, errno);
  }
  std::FILE* get() { return f_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

void fill_sizes(std::vector<IndexRow>& rows, std::vector<uint32_t>& flags, int threads, bool exif_orientation,
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
      for (size_t k = t; k < todo.size(); k += n) sizes[k] = read_image_size(rows[todo[k]].path).as_decoded(exif_orientation);
    });
  }
  for (auto& th : pool) th.join();
  for (size_t k = 0; k < todo.size(); ++k) {
    IndexRow& r = rows[todo[k]];
    if (sizes[k].ok) {
      r.width = static_cast<uint32_t>(sizes[k].width);
      r.height = static_cast<uint32_t>(sizes[k].height);
      ++result.sizes_read;
    } else {
      flags[todo[k]] |= kSizeUnknown;
      ++result.unreadable;
      log::warn("index: cannot read the size of '{}{}': {}", r.path.substr(0, 200), r.path.size() > 200 ? "..." : "",
                sizes[k].error);
    }
  }
}

uint16_t short_length(const std::string& s, const char* what) {
  if (s.size() > 65535) throw IndexError(fmt::format("a {} longer than 65535 bytes: {}...", what, s.substr(0, 80)));
  return static_cast<uint16_t>(s.size());
}

// The header-reading threads: as many as asked, or one per core.
int header_threads(const IndexBuildOptions& options) {
  return options.threads > 0 ? options.threads
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The prefix of the files written before the final rename, beside `output` (whose folder
// is created). Host and pid: ranks of several nodes may build the same cached index on a
// shared disk.
std::string temp_base(const std::string& output) {
  const fs::path out_path(output);
  if (out_path.has_parent_path()) fs::create_directories(out_path.parent_path());
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}.tmp.{}.{}", output, host, getpid());
}

// The records file and the string blob, appended to row by row.
class RecordWriter {
 public:
  RecordWriter(TempFile& records, TempFile& blob) : records_(records), blob_(blob) {}

  void write(const IndexRow& r, uint32_t flags) {
    IndexRecord rec{};
    rec.offset = blob_size_;
    rec.path_len = short_length(r.path, "path");
    rec.caption_len = static_cast<uint32_t>(r.caption.size());
    rec.latent_len = short_length(r.latent, "latent path");
    rec.text_feat_len = short_length(r.text_feat, "text-feature path");
    rec.meta_len = short_length(r.meta, "sample's metadata (version, CLIP scores, captions)");
    rec.width = r.width;
    rec.height = r.height;
    rec.label = r.label;
    rec.flags = flags | (r.label >= 0 ? kHasLabel : 0u) | (r.latent.empty() ? 0u : kHasLatent) |
                (r.text_feat.empty() ? 0u : kHasTextFeat);
    records_.write(&rec, sizeof rec);
    for (const std::string* s : {&r.path, &r.caption, &r.latent, &r.text_feat, &r.meta}) {
      blob_.write(s->data(), s->size());
      blob_size_ += s->size();
    }
  }
  uint64_t blob_size() const { return blob_size_; }

 private:
  TempFile& records_;
  TempFile& blob_;
  uint64_t blob_size_ = 0;
};

// A progress line at most every `every_s` seconds; none when it is 0.
class Progress {
 public:
  Progress(Clock::time_point start, double every_s) : start_(start), last_report_(start), every_s_(every_s) {}

  void update(const IndexBuildResult& result) {
    const auto now = Clock::now();
    if (every_s_ > 0 && std::chrono::duration<double>(now - last_report_).count() >= every_s_) {
      const double secs = std::chrono::duration<double>(now - start_).count();
      log::info("index: {} rows ({:.0f} rows/s), {} sizes read from headers, {} unreadable",
                result.rows, result.rows / secs, result.sizes_read, result.unreadable);
      last_report_ = now;
    }
  }

 private:
  Clock::time_point start_, last_report_;
  double every_s_;
};

// Rows in chunks, so memory stays bounded whatever the input: each chunk gets its missing
// sizes from the image headers, is written, and is counted.
class ChunkedRows {
 public:
  ChunkedRows(RecordWriter& writer, const IndexBuildOptions& options, int threads,
              Clock::time_point start, IndexBuildResult& result)
      : writer_(writer), options_(options), threads_(threads), progress_(start, options.progress_every_s),
        result_(result) {}

  void add(IndexRow&& row) {
    if (options_.keep && !options_.keep(row)) return;
    rows_.push_back(std::move(row));
    flags_.push_back(0);
    if (rows_.size() == kChunk) flush();
  }
  void flush() {
    fill_sizes(rows_, flags_, threads_, options_.exif_orientation, result_);
    for (size_t i = 0; i < rows_.size(); ++i) writer_.write(rows_[i], flags_[i]);
    result_.rows += rows_.size();
    if (options_.on_rows) options_.on_rows(result_.rows);
    rows_.clear();
    flags_.clear();
    progress_.update(result_);
  }

 private:
  static constexpr size_t kChunk = 4096;
  RecordWriter& writer_;
  const IndexBuildOptions& options_;
  const int threads_;
  Progress progress_;
  IndexBuildResult& result_;
  std::vector<IndexRow> rows_;
  std::vector<uint32_t> flags_;
};

void read_rows(const std::vector<std::string>& sources, const CaptionSources& captions, ChunkedRows& chunks) {
  for (const auto& src : sources) {
    auto source = open_source(src, captions);
    IndexRow row;
    while (source->next(row)) chunks.add(std::move(row));
  }
}

IndexHeader index_header(uint64_t rows, uint64_t blob_size) {
  IndexHeader h{};
  std::memcpy(h.magic, kIndexMagic, sizeof kIndexMagic);
  h.version = kIndexVersion;
  h.record_size = sizeof(IndexRecord);
  h.count = rows;
  h.records_offset = sizeof(IndexHeader);
  h.blob_offset = h.records_offset + rows * sizeof(IndexRecord);
  h.blob_size = blob_size;
  return h;
}

// Appends `parts` to `out`, hashing what it copies; returns the hash.
uint64_t append_hashed(TempFile& out, std::initializer_list<TempFile*> parts) {
  Hasher hasher;
  std::vector<char> buf(1 << 20);
  for (TempFile* part : parts) {
    std::fflush(part->get());
    std::rewind(part->get());
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), part->get())) > 0) {
      hasher.update(buf.data(), n);
      out.write(buf.data(), n);
    }
  }
  return hasher.digest();
}

// Header, records, blob: copied into `tmp_out` while hashing (the hash goes into `h`),
// synced, then renamed to `output`.
void write_index_file(IndexHeader& h, TempFile& records, TempFile& blob, const std::string& tmp_out,
                      const std::string& output) {
  TempFile out(tmp_out);
  out.write(&h, sizeof h);
  h.content_hash = append_hashed(out, {&records, &blob});
  std::rewind(out.get());
  out.write(&h, sizeof h);
  if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0) write_failed(tmp_out, errno);
  fs::rename(tmp_out, output);  // the TempFile then finds nothing left to remove
}

// The cache key: every source file's path, size and modification time; for a folder,
// every file in it (a caption edited deep inside changes the key).
uint64_t sources_key(const std::vector<std::string>& sources) {
  Hasher key;
  auto add = [&](const fs::path& p) {
    std::error_code ec;
    const std::string abs = fs::absolute(p, ec).string();
    const auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
    const uintmax_t size = fs::is_regular_file(p, ec) ? fs::file_size(p, ec) : 0;
    key.update(abs.data(), abs.size() + 1);  // with its terminating NUL
    key.update_value(mtime);
    key.update_value(size);
  };
  for (const auto& src : sources) {
    add(src);
    for (const auto& f : files_under(src)) add(f);  // what the folder source reads, links followed
  }
  return key.digest();
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
  const auto start = Clock::now();
  IndexBuildResult result;
  const int threads = header_threads(options);
  const std::string tmp_base = temp_base(output);
  TempFile records(tmp_base + ".records"), blob(tmp_base + ".blob");
  RecordWriter writer(records, blob);
  ChunkedRows chunks(writer, options, threads, start, result);
  read_rows(sources, options.captions, chunks);
  chunks.flush();
  IndexHeader h = index_header(result.rows, writer.blob_size());
  write_index_file(h, records, blob, tmp_base + ".out", output);
  result.bytes = fs::file_size(output);
  result.fingerprint = fmt::format("{:016x}", h.content_hash);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

std::string ensure_index(const std::vector<std::string>& sources, const std::string& cache_dir,
                         const IndexBuildOptions& options) {
  if (sources.size() == 1 && fs::is_regular_file(sources[0]) && is_index_file(sources[0])) {
    if (options.captions.any()) {
      log::warn("data.data_dir is the prebuilt index '{}': the caption keys ({}) read the files beside upstream's "
                "shards when indexing, which `sana-train index` does not; each sample trains on its own caption. "
                "Name the wids folder (with wids-meta.json) in data.data_dir to use them",
                sources[0], options.captions.describe());
    }
    return sources[0];
  }
  // Header sizes depend on the EXIF setting, wids samples' metadata on the caption
  // sources; "v3" retired the indexes made before wids metadata was kept, "v4" those made
  // before JSONL/CSV `mask` fields were.
  Hasher key;
  key.update_value(sources_key(sources));
  const std::string settings =
      fmt::format("v4 exif {} {}", options.exif_orientation, options.captions.describe());
  key.update(settings.data(), settings.size());
  const std::string path = (fs::path(cache_dir) / fmt::format("index-{:016x}.sidx", key.digest())).string();
  if (fs::exists(path)) return path;
  log::info("indexing {} source{} into {}", sources.size(), sources.size() == 1 ? "" : "s", path);
  const auto r = build_index(sources, path, options);
  log::info("indexed {} samples in {:.1f} s ({} sizes read from headers, {} unreadable)", r.rows,
            r.seconds, r.sizes_read, r.unreadable);
  return path;
}

}  // namespace sana::data
