#include "sana/ckpt/shards.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "sana/ckpt/folder.h"
#include "sana/util/hash.h"

namespace fs = std::filesystem;

namespace sana::ckpt {

namespace {

constexpr const char* kIndexFile = "index.json";
constexpr const char* kIndexFormat = "sana-train checkpoint index 1";

nlohmann::json entry_json(const ShardEntry& e) {
  return {{"name", e.name},   {"dtype", e.dtype}, {"shape", e.shape}, {"file", e.file}, {"offset", e.offset},
          {"bytes", e.bytes}, {"xxh3", e.xxh3},   {"order", e.order}, {"rank", e.rank}, {"minor", e.minor}};
}

ShardEntry entry_from_json(const nlohmann::json& j) {
  ShardEntry e;
  e.name = j.at("name");
  e.dtype = j.at("dtype");
  e.shape = j.at("shape").get<std::vector<int64_t>>();
  e.file = j.at("file");
  e.offset = j.at("offset");
  e.bytes = j.at("bytes");
  e.xxh3 = j.at("xxh3");
  e.order = j.at("order");
  e.rank = j.at("rank");
  e.minor = j.at("minor");
  return e;
}

nlohmann::json parts_json(const std::map<std::string, std::vector<ShardEntry>>& parts) {
  auto out = nlohmann::json::object();
  for (const auto& [part, entries] : parts) {
    auto list = nlohmann::json::array();
    for (const auto& e : entries) list.push_back(entry_json(e));
    out[part] = list;
  }
  return out;
}

std::map<std::string, std::vector<ShardEntry>> parts_from_json(const nlohmann::json& j) {
  std::map<std::string, std::vector<ShardEntry>> out;
  for (const auto& [part, list] : j.items()) {
    auto& entries = out[part];
    for (const auto& e : list) entries.push_back(entry_from_json(e));
  }
  return out;
}

std::string bytes_checksum(const torch::Tensor& cpu) {
  return fmt::format("{:016x}", hash64(cpu.data_ptr(), cpu.nbytes()));
}

}  // namespace

nlohmann::json RankShards::to_json() const {
  if (!error.empty()) return {{"rank", rank}, {"error", error}};
  return {{"rank", rank}, {"files", files}, {"parts", parts_json(parts)}};
}

RankShards RankShards::from_json(const nlohmann::json& j) {
  RankShards r;
  r.rank = j.at("rank");
  r.error = j.value("error", std::string());
  if (!r.error.empty()) return r;
  r.files = j.at("files").get<std::map<std::string, int64_t>>();
  r.parts = parts_from_json(j.at("parts"));
  return r;
}

std::string shard_file_name(const std::string& part, int rank, int world) {
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", part, rank + 1, world);
}

std::string shard_temporary_folder(const std::string& work_dir, int64_t global_step, const std::string& token) {
  return (fs::path(work_dir) / "checkpoints" / fmt::format(".tmp-{}-{}", checkpoint_name(global_step), token))
      .string();
}

RankShards write_rank_shards(const std::string& dir, const std::vector<std::pair<std::string, PartState>>& mine,
                             int rank, int world,
                             const std::function<int64_t(const std::string&, const std::string&)>& order_of,
                             const StageHook& before_stage) {
  RankShards out;
  out.rank = rank;
  const fs::path folder(dir);
  fs::create_directories(folder);
  for (const auto& [part, state] : mine) {
    if (!state.tensors) continue;
    const std::string file = shard_file_name(part, rank, world);
    stage(before_stage, file.c_str());
    auto metadata = state.metadata;
    // The checkpoint's name, as format 2 records it: the temporary folder is .tmp-<name>-<token>.
    const std::string folder_name = folder.filename().string();
    metadata["checkpoint"] = folder_name.rfind(".tmp-", 0) == 0
                                 ? folder_name.substr(5, folder_name.rfind('-') - 5)
                                 : folder_name;
    metadata["shard"] = fmt::format("rank {} of {}", rank, world);
    std::vector<SafetensorsEntry> placed;
    try {
      placed = write_safetensors((folder / file).string(), *state.tensors, metadata);
    } catch (const SafetensorsError& e) {
      throw CheckpointError(e.what());
    }
    fsync_path(folder / file);
    auto& entries = out.parts[part];
    for (size_t k = 0; k < placed.size(); ++k) {
      const auto cpu = state.tensors->at(k).second.detach().to(torch::kCPU).contiguous();
      ShardEntry e;
      e.name = placed[k].name;
      e.dtype = placed[k].dtype;
      e.shape = placed[k].shape;
      e.file = file;
      e.offset = static_cast<int64_t>(placed[k].begin);
      e.bytes = static_cast<int64_t>(placed[k].end - placed[k].begin);
      e.xxh3 = bytes_checksum(cpu);
      e.order = order_of(part, e.name);
      e.rank = rank;
      e.minor = static_cast<int64_t>(k);
      entries.push_back(std::move(e));
    }
    out.files[file] = static_cast<int64_t>(fs::file_size(folder / file));
  }
  return out;
}

std::string commit_shards(const std::string& work_dir, const std::string& dir, TrainerState state,
                          const nlohmann::json& part_json, const std::vector<RankShards>& ranks, int64_t keep_last_n,
                          const StageHook& before_stage) {
  const fs::path root = fs::path(work_dir) / "checkpoints";
  const fs::path tmp(dir);
  std::error_code ec;
  const std::string name = checkpoint_name(state.position.global_step);
  try {
    ShardIndex index;
    index.world = static_cast<int>(ranks.size());
    for (const auto& r : ranks) {
      if (!r.error.empty()) throw CheckpointError(fmt::format("rank {} could not write its share of {}: {}", r.rank, name, r.error));
      index.files.insert(r.files.begin(), r.files.end());
      for (const auto& [part, entries] : r.parts) {
        auto& all = index.parts[part];
        all.insert(all.end(), entries.begin(), entries.end());
      }
    }
    // Every rank's files must be in the folder as rank 0 sees it: a work_dir that is not one
    // folder shared by every rank (a node-local disk) would commit a checkpoint without them.
    for (const auto& [file, bytes] : index.files) {
      std::error_code size_error;
      const auto size = fs::file_size(tmp / file, size_error);
      if (size_error || static_cast<int64_t>(size) != bytes) {
        const auto writer = std::find_if(ranks.begin(), ranks.end(), [&](const RankShards& r) { return r.files.count(file) > 0; });
        throw CheckpointError(fmt::format(
            "rank {} wrote {} ({} bytes) into {}, but rank 0 finds {} there: every rank must see the same work_dir "
            "(a shared filesystem), or set ckpt.format: 2 (rank 0 writes everything)",
            writer == ranks.end() ? -1 : writer->rank, file, bytes, tmp.string(),
            size_error ? std::string("no such file") : fmt::format("{} bytes", size)));
      }
    }
    for (auto& [part, entries] : index.parts) {
      std::sort(entries.begin(), entries.end(), [](const ShardEntry& a, const ShardEntry& b) {
        return std::tie(a.order, a.rank, a.minor) < std::tie(b.order, b.rank, b.minor);
      });
    }
    const nlohmann::ordered_json j = {
        {"format", kIndexFormat}, {"world", index.world}, {"files", index.files}, {"parts", parts_json(index.parts)}};
    stage(before_stage, kIndexFile);
    write_text_synced(tmp / kIndexFile, j.dump(1) + "\n");
    state.format = 3;
    state.checksums = {{kIndexFile, file_checksum(tmp / kIndexFile)}};
    stage(before_stage, "trainer_state.json");
    write_text_synced(tmp / "trainer_state.json", trainer_state_text(state, part_json));
    fsync_path(tmp);
  } catch (...) {
    fs::remove_all(tmp, ec);  // as write_checkpoint: the space is needed by what comes next
    throw;
  }
  return publish_folder(root, tmp, name, keep_last_n, before_stage);
}

ShardIndex read_shard_index(const std::string& dir) {
  const fs::path path = fs::path(dir) / kIndexFile;
  nlohmann::json j;
  try {
    std::ifstream in(path);
    if (!in) throw CheckpointError(fmt::format("'{}': {} is missing", dir, kIndexFile));
    j = nlohmann::json::parse(in);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("'{}': {} is damaged: {}", dir, kIndexFile, e.what()));
  }
  try {
    if (j.at("format") != kIndexFormat) {
      throw CheckpointError(fmt::format("'{}': {} is '{}', which this sana-train does not read", dir, kIndexFile,
                                        j.at("format").dump()));
    }
    ShardIndex index;
    index.world = j.at("world");
    index.files = j.at("files").get<std::map<std::string, int64_t>>();
    index.parts = parts_from_json(j.at("parts"));
    return index;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("'{}': {} lacks a field: {}", dir, kIndexFile, e.what()));
  }
}

NamedTensors read_shard_entries(const std::string& dir, const std::vector<const ShardEntry*>& entries,
                                int64_t* bytes_read) {
  NamedTensors out;
  std::map<std::string, int> open;  // file -> descriptor
  const auto close_all = [&] {
    for (const auto& [file, fd] : open) ::close(fd);
  };
  try {
    for (const ShardEntry* e : entries) {
      auto it = open.find(e->file);
      if (it == open.end()) {
        const int fd = ::open((fs::path(dir) / e->file).c_str(), O_RDONLY);
        if (fd < 0) throw CheckpointError(fmt::format("'{}': cannot open {}: {}", dir, e->file, std::strerror(errno)));
        it = open.emplace(e->file, fd).first;
      }
      auto t = torch::empty(e->shape, torch::TensorOptions().dtype(safetensors_scalar_type(e->dtype)));
      if (static_cast<int64_t>(t.nbytes()) != e->bytes) {
        throw CheckpointError(fmt::format("'{}': index.json gives tensor '{}' {} bytes for its shape", dir, e->name,
                                          e->bytes));
      }
      auto* data = static_cast<char*>(t.data_ptr());
      int64_t done = 0;
      while (done < e->bytes) {
        const ssize_t n = ::pread(it->second, data + done, static_cast<size_t>(e->bytes - done), e->offset + done);
        if (n <= 0) {
          throw CheckpointError(fmt::format("'{}': {} ends inside tensor '{}'{}", dir, e->file, e->name,
                                            n < 0 ? std::string(": ") + std::strerror(errno) : ""));
        }
        done += n;
      }
      const std::string sum = bytes_checksum(t);
      if (sum != e->xxh3) {
        throw CheckpointError(fmt::format("'{}': {} is damaged: tensor '{}' has checksum {} instead of {}", dir,
                                          e->file, e->name, sum, e->xxh3));
      }
      if (bytes_read != nullptr) *bytes_read += e->bytes;
      out.emplace_back(e->name, std::move(t));
    }
  } catch (const SafetensorsError& e) {
    close_all();
    throw CheckpointError(e.what());
  } catch (...) {
    close_all();
    throw;
  }
  close_all();
  return out;
}

namespace {

// A safetensors file's metadata, from its header alone.
std::map<std::string, std::string> file_metadata(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8] = {};
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (!in || n > (uint64_t{100} << 20)) throw CheckpointError(fmt::format("'{}' has no safetensors header", path.string()));
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const auto j = nlohmann::json::parse(header, nullptr, false);
  if (!in || j.is_discarded()) throw CheckpointError(fmt::format("'{}': its safetensors header is damaged", path.string()));
  std::map<std::string, std::string> out;
  if (j.contains("__metadata__")) out = j.at("__metadata__").get<std::map<std::string, std::string>>();
  return out;
}

}  // namespace

int64_t consolidate_part(const std::string& dir, const ShardIndex& index, const std::string& part,
                         const std::string& out_path, int64_t buffer_bytes) {
  const auto& entries = index.parts.at(part);
  auto metadata = file_metadata(fs::path(dir) / shard_file_name(part, 0, index.world));
  metadata.erase("shard");
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (!out) throw CheckpointError(fmt::format("cannot write '{}': {}", out_path, std::strerror(errno)));
  const uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<char> buffer(static_cast<size_t>(std::max<int64_t>(1, buffer_bytes)));
  for (const auto& e : entries) {
    std::ifstream in(fs::path(dir) / e.file, std::ios::binary);
    in.seekg(e.offset);
    Hasher h;
    for (int64_t done = 0; done < e.bytes;) {
      const int64_t take = std::min<int64_t>(e.bytes - done, static_cast<int64_t>(buffer.size()));
      in.read(buffer.data(), static_cast<std::streamsize>(take));
      if (!in) throw CheckpointError(fmt::format("'{}': {} ends inside tensor '{}'", dir, e.file, e.name));
      h.update(buffer.data(), static_cast<size_t>(take));
      out.write(buffer.data(), static_cast<std::streamsize>(take));
      done += take;
    }
    if (h.hex() != e.xxh3) {
      throw CheckpointError(fmt::format("'{}': {} is damaged: tensor '{}' has checksum {} instead of {}", dir, e.file,
                                        e.name, h.hex(), e.xxh3));
    }
  }
  out.flush();
  if (!out) throw CheckpointError(fmt::format("writing '{}' failed: {}", out_path, std::strerror(errno)));
  out.close();
  fsync_path(out_path);
  return static_cast<int64_t>(8 + n) + offset;
}

std::vector<std::string> consolidate_checkpoint(const std::string& dir, const std::string& out_dir) {
  auto snap = read_checkpoint(dir, /*tensors=*/false);  // verifies it
  if (snap.state.format < 3) throw CheckpointError(fmt::format("'{}' is format {}: one file per part already", dir, snap.state.format));
  const auto index = read_shard_index(dir);
  fs::create_directories(out_dir);
  std::vector<std::string> written;
  snap.state.format = 2;
  snap.state.checksums.clear();
  auto part_json = nlohmann::json::object();
  for (const auto& [part, state] : snap.parts) {
    if (!state.json.is_null()) part_json[part] = state.json;
    if (!index.parts.count(part)) continue;
    const auto file = part + ".safetensors";
    consolidate_part(dir, index, part, (fs::path(out_dir) / file).string());
    snap.state.checksums[file] = file_checksum(fs::path(out_dir) / file);
    written.push_back((fs::path(out_dir) / file).string());
  }
  write_text_synced(fs::path(out_dir) / "trainer_state.json", trainer_state_text(snap.state, part_json));
  written.push_back((fs::path(out_dir) / "trainer_state.json").string());
  return written;
}

}  // namespace sana::ckpt
