#include "sana/model/export.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include "sana/model/pos_embed.h"
#include "sana/model/weights.h"
#include "sana/util/safetensors.h"

namespace sana::model {

namespace fs = std::filesystem;

namespace {

// A diffusers model folder as save_pretrained writes it: the tensors (diffusers' names) in
// shards filled in name order, a new one whenever the next tensor would pass the limit (a
// tensor over the limit alone), as huggingface_hub's splitter does; their index when more
// than one; config.json.
std::vector<std::string> write_diffusers_folder(const TensorMap& diffusers, nlohmann::json config,
                                                const std::string& dir, int64_t max_shard_bytes) {
  fs::create_directories(dir);
  std::vector<NamedTensors> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : diffusers) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, t.detach().to(torch::kCPU).contiguous());
    in_shard += bytes;
    total += bytes;
  }
  std::vector<std::string> written;
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shards.size() == 1 ? "diffusion_pytorch_model.safetensors"
                                                : fmt::format("diffusion_pytorch_model-{:05d}-of-{:05d}.safetensors",
                                                              i + 1, shards.size());
    write_safetensors((fs::path(dir) / file).string(), shards[i], meta);
    for (const auto& [name, t] : shards[i]) weight_map[name] = file;
    written.push_back((fs::path(dir) / file).string());
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const auto path = fs::path(dir) / "diffusion_pytorch_model.safetensors.index.json";
    std::ofstream(path) << index.dump(2) << "\n";
    written.push_back(path.string());
  }
  config["_diffusers_version"] = "0.32.0";  // the first release with SanaTransformer2DModel and SanaControlNetModel
  const auto config_path = fs::path(dir) / "config.json";
  std::ofstream(config_path) << config.dump(2) << "\n";
  written.push_back(config_path.string());
  return written;
}

void check_caption_model(const ModelSpec& spec) {
  if (spec.conditioning != Conditioning::caption) {
    throw WeightsError(fmt::format("{} is {}-conditioned; diffusers' SanaTransformer2DModel is the caption-conditioned "
                                   "Sana (export --format upstream keeps any model)",
                                   spec.name, conditioning_name(spec.conditioning)));
  }
}

}  // namespace

std::vector<std::string> export_diffusers(const TensorMap& tensors, const ModelSpec& spec, int64_t image_size,
                                          const std::string& dir, int64_t max_shard_bytes) {
  check_caption_model(spec);
  return write_diffusers_folder(to_diffusers(tensors), diffusers_config(spec, image_size), dir, max_shard_bytes);
}

std::vector<std::string> export_controlnet_diffusers(const TensorMap& tensors, const ModelSpec& spec,
                                                     int64_t image_size, const std::string& dir,
                                                     int64_t max_shard_bytes) {
  check_caption_model(spec);
  // SanaControlNetModel always applies its caption norm and builds its blocks without q/k norms.
  if (!spec.y_norm || spec.qk_norm || spec.cross_norm) {
    throw WeightsError(fmt::format(
        "{}: diffusers' SanaControlNetModel always normalises the caption (model.y_norm true) and has no q/k norms "
        "(model.qk_norm, cross_norm false); this model has y_norm {}, qk_norm {}, cross_norm {}. export --format "
        "upstream writes what upstream's SanaControlNetPipeline loads",
        spec.name, spec.y_norm, spec.qk_norm, spec.cross_norm));
  }
  TensorMap base;
  for (const auto& [name, t] : tensors) {
    if (name.rfind("controlnet.", 0) != 0) base[name] = t;
  }
  auto written = write_diffusers_folder(to_diffusers(base), diffusers_config(spec, image_size),
                                        (fs::path(dir) / "transformer").string(), max_shard_bytes);
  for (auto& f : write_diffusers_folder(controlnet_to_diffusers(tensors), diffusers_controlnet_config(spec, image_size),
                                        (fs::path(dir) / "controlnet").string(), max_shard_bytes)) {
    written.push_back(std::move(f));
  }
  return written;
}

torch::Tensor upstream_pos_embed(const ModelSpec& spec, int64_t image_size) {
  const int64_t grid = image_size / (spec.downsample * spec.patch);
  if (!spec.use_pe) return torch::zeros({1, grid * grid, spec.hidden});
  return sincos_pos_embed(spec.hidden, grid, grid, spec.pe_interpolation, spec.pe_base_size).unsqueeze(0);
}

void export_upstream(const TensorMap& tensors, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> state;
  for (const auto& [name, t] : tensors) state.insert(name, t.detach().to(torch::kCPU).contiguous());
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("state_dict", state);
  // torch::pickle_save's archive, without its type tags on dicts (torch.jit._pickle.
  // restore_type_tag), which torch.load's weights_only mode (PyTorch 2.6's default, and
  // upstream's find_model calls torch.load plainly) refuses.
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* b, size_t n) { pickled.insert(pickled.end(), b, b + n); }, nullptr,
                              nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(top);
  pickler.stop();
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path, std::ios::binary);
  if (!out) throw WeightsError(fmt::format("cannot write '{}': {}", path, ec ? ec.message() : std::strerror(errno)));
  // A failed write is told after the archive ends, never to the stream writer: it would
  // throw, and its destructor would throw again while unwinding (std::terminate).
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, size_t n) -> size_t {
    out.write(static_cast<const char*>(b), static_cast<std::streamsize>(n));
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  if (!out) throw WeightsError(fmt::format("cannot write '{}'", path));
}

}  // namespace sana::model
