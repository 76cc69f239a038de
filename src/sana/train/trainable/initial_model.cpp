#include "sana/train/trainable/initial_model.h"

#include <fmt/format.h>

#include <map>

#include "sana/ckpt/checkpoint.h"
#include "sana/data/sample_cache.h"
#include "sana/model/controlnet.h"
#include "sana/model/growth.h"
#include "sana/model/weights.h"
#include "sana/util/hash.h"
#include "sana/util/log.h"

namespace sana::train {

// A hash of every parameter's name, shape and bytes, in order: equal on every rank
// exactly when the weights are bitwise equal.
std::string tensors_checksum(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  Hasher h;
  for (const auto& [name, value] : tensors) {
    h.update(name);
    const auto t = value.detach().to(torch::kCPU).contiguous();
    for (int64_t d : t.sizes()) h.update_value(d);
    h.update(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  return h.hex();
}

std::string weights_checksum(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : model.named_parameters()) named.emplace_back(p.key(), p.value());
  return tensors_checksum(named);
}

namespace {

// model.load_from naming a sana-train checkpoint folder (any format) or a file in it: the
// weights of its `model` part, which a run that trains the whole model writes.
model::LoadReport load_from_checkpoint(torch::nn::Module& net, const std::string& folder, bool strict) {
  const auto tensors = ckpt::read_part_tensors(folder, "model");
  if (!tensors) {
    throw model::WeightsError(fmt::format(
        "model.load_from: the checkpoint {} holds no whole model (a LoRA or ControlNet run's checkpoint keeps "
        "only what it trained): `sana-train export` it and load that file, or give a checkpoint of a run that trains "
        "the whole model",
        folder));
  }
  std::map<std::string, torch::Tensor> by_name(tensors->begin(), tensors->end());
  return model::load_tensors(net, by_name, folder, strict);
}

}  // namespace

model::SanaMS build_initial_model(const InitialModelOptions& o, const model::ModelSpec& spec, dist::Runtime& rt) {
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, o.seed});
  const auto& growth = o.growth;
  if (!growth.source.empty()) {
    const auto report = model::grow_model(*net, growth);
    log::info("model_growth ({}): {} from {}", o.growth_strategy, report.summary(), growth.source);
  }
  if (!o.load_from.empty()) {
    const auto report = spec.control_blocks > 0 ? model::load_controlnet_weights(*net, o.load_from, o.load_strict)
                        : ckpt::checkpoint_folder_of(o.load_from).empty()
                            ? model::load_weights(*net, o.load_from, o.load_strict)
                            : load_from_checkpoint(*net, ckpt::checkpoint_folder_of(o.load_from), o.load_strict);
    if (report.clean()) {
      log::info("model.load_from: {} from {}", report.summary(), o.load_from);
    } else {
      log::warn_shared("model.load_from (model.load_strict false): {} from {}", report.summary(), o.load_from);
    }
  }
  // A ControlNet's base is what is not a control block (model/controlnet.h); LoRA's, everything.
  const bool control = spec.control_blocks > 0;
  if (o.frozen_base || control) {
    const auto frozen = [control](const std::string& name) { return !control || !model::is_control_parameter(name); };
    for (const auto& p : net->named_parameters()) {
      if (frozen(p.key())) p.value().requires_grad_(false);
    }
    const auto r = model::store_frozen_layers(*net, o.frozen_dtype, frozen);
    if (r.layers > 0) {
      log::info("train.frozen_base_dtype {}: the frozen base's {} Linear and Conv2d weights take {} ({} in fp32)",
                model::storage_dtype_name(o.frozen_dtype), r.layers,
                data::size_text(static_cast<uint64_t>(r.bytes_after)),
                data::size_text(static_cast<uint64_t>(r.bytes_before)));
    }
  }
  net->to(rt.device());
  net->set_grad_checkpointing(o.grad_checkpointing, o.gc_step);
  net->set_fused_kernels(o.fused_kernels);
  net->train();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) rt.broadcast(p);
    for (auto& b : net->buffers()) rt.broadcast(b);
  }
  rt.agree("model weights after the broadcast", weights_checksum(*net));
  return net;
}

std::unique_ptr<model::SwappedBlocks> swap_blocks(const InitialModelOptions& o, model::SanaMSImpl& net,
                                                  const torch::Device& device) {
  const auto ids = model::swapped_block_ids(o.offload_blocks, net.spec().depth);
  if (ids.empty()) return nullptr;
  const bool trained = !o.frozen_base && net.spec().control_blocks == 0;
  auto swapped = std::make_unique<model::SwappedBlocks>(net, ids, device, trained);
  log::info("train.offload_blocks: blocks {} to {} of {} keep their {} in host memory ({}{}), each "
            "copied to the device one block ahead of its use",
            ids.front(), ids.back(), net.spec().depth,
            trained ? "weights (trained: their gradients stream to the host optimizer)" : "frozen weights",
            data::size_text(static_cast<uint64_t>(swapped->host_bytes())), device.is_cuda() ? ", page-locked" : "");
  return swapped;
}

}  // namespace sana::train
