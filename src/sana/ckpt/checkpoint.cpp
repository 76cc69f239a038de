#include "sana/ckpt/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "sana/ckpt/folder.h"
#include "sana/ckpt/shards.h"
#include "sana/util/hash.h"

namespace fs = std::filesystem;

namespace sana::ckpt {

namespace {

std::string tensor_file(const std::string& part) { return part + ".safetensors"; }

}  // namespace

// An epoch segment in trainer_state.json: [first_step, global_batch_size, batch_tokens].
template <class Json>
void to_json(Json& j, const EpochSegment& g) {
  j = Json::array({g.first_step, g.global_batch_size, g.batch_tokens});
}
template <class Json>
void from_json(const Json& j, EpochSegment& g) {
  g = {j.at(0).template get<int64_t>(), j.at(1).template get<int64_t>(), j.at(2).template get<int64_t>()};
}

namespace {

enum class Presence { always, since_format_2 };  // since_format_2: older files may lack it

// trainer_state.json's fields, each once, in the file's order: its key, the member and
// whether every file has it. `State` is TrainerState or const TrainerState.
template <class State, class Visit>
void fields_of(State& s, Visit&& field) {
  field("epoch", s.position.epoch, Presence::always);
  field("step_in_epoch", s.position.step_in_epoch, Presence::always);
  field("global_step", s.position.global_step, Presence::always);
  field("consumed_samples", s.position.consumed_samples, Presence::always);
  field("global_batch_size", s.global_batch_size, Presence::always);
  field("batch_tokens", s.batch_tokens, Presence::since_format_2);
  field("epoch_segments", s.epoch_segments, Presence::since_format_2);
  field("seed", s.seed, Presence::always);
  field("world_size_at_save", s.world_size, Presence::always);
  field("model", s.model, Presence::always);
  field("config_hash", s.config_hash, Presence::always);
  field("config", s.config, Presence::since_format_2);
  field("checksums", s.checksums, Presence::always);
}

}  // namespace

std::string trainer_state_text(const TrainerState& s, const nlohmann::json& parts) {
  nlohmann::ordered_json j = {{"format", fmt::format("sana-train checkpoint {}", s.format)}};
  fields_of(s, [&j](const char* key, const auto& value, Presence) { j[key] = value; });
  j["parts"] = parts;
  return j.dump(2) + "\n";
}

namespace {

// Format 1 (sana-train before its parts were Stateful, up to 0016840) kept the parts' JSON
// as loose fields of the state; they map onto the parts the trainer registers under these
// names (train/loop/trainer.cpp), so its checkpoints still resume. Its tensor files are named
// as the parts that write them today (model, ema, optimizer).
nlohmann::json format1_parts(const nlohmann::json& j) {
  auto parts = nlohmann::json::object();
  parts["reducer"] = {{"exact_scales", j.value("exact_scales", std::vector<int64_t>{})}};
  parts["bad_samples"] = {{"bad_samples", j.value("bad_samples", int64_t{0})},
                          {"samples_read", j.value("samples_read", int64_t{0})}};
  parts["nonfinite"] = {{"skipped_steps", j.value("skipped_steps", int64_t{0})}};
  if (j.value("loss_scale", 0.0) > 0) {
    parts["loss_scaler"] = {{"loss_scale", j.at("loss_scale")},
                            {"loss_scale_clean_steps", j.value("loss_scale_clean_steps", int64_t{0})},
                            {"overflow_steps", j.value("overflow_steps", int64_t{0})}};
  }
  return parts;
}

// trainer_state.json as read: the run's state, and each part's JSON by name.
struct StateFile {
  TrainerState state;
  nlohmann::json parts;
};

StateFile state_from_json(const nlohmann::json& j) {
  TrainerState s;
  fields_of(s, [&j](const char* key, auto& value, Presence presence) {
    if (presence == Presence::always || j.contains(key)) j.at(key).get_to(value);  // at(): a missing key throws
  });
  const std::string format = j.value("format", std::string());
  s.format = format == "sana-train checkpoint 3" ? 3 : j.contains("parts") ? 2 : 1;
  return {std::move(s), j.contains("parts") ? j.at("parts") : format1_parts(j)};
}

}  // namespace

std::string checkpoint_name(int64_t global_step) { return fmt::format("step_{:08d}", global_step); }

std::string checkpoint_folder_of(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  const fs::path folder = fs::is_directory(p, ec) ? p : p.parent_path();
  return fs::is_regular_file(folder / "trainer_state.json", ec) ? folder.string() : std::string();
}

std::string write_checkpoint(const std::string& work_dir, Snapshot snap, int64_t keep_last_n,
                             const StageHook& before_stage) {
  const fs::path root = fs::path(work_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = checkpoint_name(snap.state.position.global_step);
  const fs::path tmp = root / fmt::format(".tmp-{}-{}", name, ::getpid());
  std::error_code ec;
  remove_stale_temporaries(root);
  fs::remove_all(tmp, ec);
  snap.state.format = 2;
  try {
    fs::create_directories(tmp);
    auto part_json = nlohmann::json::object();
    for (const auto& [part, state] : snap.parts) {
      if (!state.json.is_null()) part_json[part] = state.json;
      if (!state.tensors) continue;
      const std::string file = tensor_file(part);
      stage(before_stage, file.c_str());
      auto metadata = state.metadata;
      metadata["checkpoint"] = name;
      write_safetensors((tmp / file).string(), *state.tensors, metadata);
      fsync_path(tmp / file);
      snap.state.checksums[file] = file_checksum(tmp / file);
    }
    stage(before_stage, "trainer_state.json");
    write_text_synced(tmp / "trainer_state.json", trainer_state_text(snap.state, part_json));
    fsync_path(tmp);
  } catch (...) {
    // A failed write (disk full) must not keep the space it took: the run's next step, or
    // a resume, needs it. The checkpoints saved before are untouched.
    fs::remove_all(tmp, ec);
    throw;
  }
  return publish_folder(root, tmp, name, keep_last_n, before_stage);
}

namespace {

// trainer_state.json of a checkpoint folder, with every file's expected checksum.
StateFile read_state(const std::string& dir) {
  const fs::path d(dir);
  nlohmann::json j;
  try {
    std::ifstream in(d / "trainer_state.json");
    if (!in) throw CheckpointError(fmt::format("'{}' has no trainer_state.json", dir));
    j = nlohmann::json::parse(in);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("'{}/trainer_state.json' is damaged: {}", dir, e.what()));
  }
  StateFile f;
  try {
    f = state_from_json(j);
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("'{}/trainer_state.json' lacks a field: {}", dir, e.what()));
  }
  for (const auto& [file, sum] : f.state.checksums) {
    if (!fs::exists(d / file)) throw CheckpointError(fmt::format("'{}': {} is missing", dir, file));
  }
  return f;
}

void check_sum(const std::string& dir, const std::string& file, const std::string& actual, const TrainerState& s) {
  const std::string& expected = s.checksums.at(file);
  if (actual != expected) {
    throw CheckpointError(fmt::format("'{}': {} is damaged (checksum {} instead of {})", dir, file, actual, expected));
  }
}

}  // namespace

const PartState* Snapshot::part(const std::string& name) const {
  for (const auto& [n, state] : parts) {
    if (n == name) return &state;
  }
  return nullptr;
}

TrainerState verify_checkpoint(const std::string& dir) {
  auto s = read_state(dir).state;
  for (const auto& [file, sum] : s.checksums) check_sum(dir, file, file_checksum(fs::path(dir) / file), s);
  if (s.format < 3) return s;
  // Format 3: the shard files' checksums are per tensor, checked by whoever reads one;
  // here each file must be there whole.
  for (const auto& [file, bytes] : read_shard_index(dir).files) {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(dir) / file, ec);
    if (ec) throw CheckpointError(fmt::format("'{}': {} is missing", dir, file));
    if (static_cast<int64_t>(size) != bytes) {
      throw CheckpointError(fmt::format("'{}': {} is damaged ({} bytes instead of {})", dir, file, size, bytes));
    }
  }
  return s;
}

namespace {

// Each part's JSON into `snap` (after its tensors, if any), as read_state() found them.
void add_part_json(Snapshot& snap, const nlohmann::json& parts) {
  for (const auto& [name, json] : parts.items()) {
    auto it = std::find_if(snap.parts.begin(), snap.parts.end(), [&](const auto& p) { return p.first == name; });
    if (it == snap.parts.end()) it = snap.parts.insert(snap.parts.end(), {name, PartState{}});
    it->second.json = json;
  }
}

}  // namespace

Snapshot snapshot_of_state_text(const std::string& text) {
  auto file_state = state_from_json(nlohmann::json::parse(text));
  Snapshot snap;
  snap.state = std::move(file_state.state);
  add_part_json(snap, file_state.parts);
  return snap;
}

Snapshot read_checkpoint(const std::string& dir, bool tensors) {
  auto file_state = read_state(dir);
  Snapshot snap;
  snap.state = std::move(file_state.state);
  if (snap.state.format >= 3) {
    verify_checkpoint(dir);
    for (const auto& [part, entries] : read_shard_index(dir).parts) {
      std::vector<const ShardEntry*> all;
      for (const auto& e : entries) all.push_back(&e);
      snap.parts.push_back({part, {nullptr, tensors ? read_shard_entries(dir, all) : NamedTensors{}, {}}});
    }
    add_part_json(snap, file_state.parts);
    return snap;
  }
  // Each file is read once: hashed and parsed from the same bytes.
  for (const auto& [file, sum] : snap.state.checksums) {
    const fs::path path = fs::path(dir) / file;
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    check_sum(dir, file, hash_hex(std::string_view(bytes.data(), bytes.size())), snap.state);
    if (path.extension() != ".safetensors") continue;
    try {
      snap.parts.push_back({path.stem().string(), {nullptr, parse_safetensors(bytes, path.string()).tensors, {}}});
    } catch (const SafetensorsError& e) {
      throw CheckpointError(e.what());
    }
  }
  add_part_json(snap, file_state.parts);
  return snap;
}

std::optional<NamedTensors> read_part_tensors(const std::string& dir, const std::string& part) {
  const auto state = read_state(dir).state;  // format 2: only the part's file is read and checked
  if (state.format >= 3) {
    verify_checkpoint(dir);  // index.json and every shard file whole; each entry is checked as read
    const auto index = read_shard_index(dir);
    const auto it = index.parts.find(part);
    if (it == index.parts.end()) return std::nullopt;
    std::vector<const ShardEntry*> entries;
    for (const auto& e : it->second) entries.push_back(&e);
    return read_shard_entries(dir, entries);
  }
  const std::string file = tensor_file(part);
  if (state.checksums.count(file) == 0) return std::nullopt;
  const fs::path path = fs::path(dir) / file;
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check_sum(dir, file, hash_hex(std::string_view(bytes.data(), bytes.size())), state);
  try {
    return parse_safetensors(bytes, path.string()).tensors;
  } catch (const SafetensorsError& e) {
    throw CheckpointError(e.what());
  }
}

Resolved resolve_latest(const std::string& work_dir, const std::vector<std::string>& skip) {
  const fs::path root = fs::path(work_dir) / "checkpoints";
  Resolved r;
  std::string named;
  {
    std::ifstream in(root / "latest");
    if (in) std::getline(in, named);
  }
  std::vector<fs::path> candidates;
  if (!named.empty()) candidates.push_back(root / named);
  auto dirs = checkpoint_dirs(root);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->filename() != named) candidates.push_back(*it);
  }
  for (const auto& c : candidates) {
    if (std::find(skip.begin(), skip.end(), c.string()) != skip.end()) continue;
    try {
      verify_checkpoint(c.string());
      r.path = c.string();
      return r;
    } catch (const CheckpointError& e) {
      r.warnings.push_back(fmt::format("skipping {}: {}", c.filename().string(), e.what()));
    }
  }
  return r;
}

AsyncSaver::~AsyncSaver() {
  try {
    wait();
  } catch (...) {
  }
}

void AsyncSaver::save(const std::string& work_dir, Snapshot snapshot, int64_t keep_last_n, StageHook before_stage) {
  auto snap = std::make_shared<Snapshot>(std::move(snapshot));
  run([work_dir, snap, keep_last_n, before_stage = std::move(before_stage)] {
    return write_checkpoint(work_dir, std::move(*snap), keep_last_n, before_stage);
  });
}

void AsyncSaver::run(std::function<std::string()> job) {
  wait();
  thread_ = std::thread([this, job = std::move(job)] {
    const auto start = std::chrono::steady_clock::now();
    try {
      last_path_ = job();
    } catch (...) {
      error_ = std::current_exception();
    }
    last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

void AsyncSaver::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace sana::ckpt
