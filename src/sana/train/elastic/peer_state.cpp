#include "sana/train/elastic/peer_state.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

#include "sana/ckpt/folder.h"

namespace sana::train {

namespace {

// What rank 0 tells the others first: the state file's text, then per part whether it
// has tensors, their names, types and shapes, and its file metadata.
std::string describe(const ckpt::Snapshot& snap) {
  auto parts_json = nlohmann::json::object();
  auto tensors = nlohmann::json::array();
  for (const auto& [name, part] : snap.parts) {
    if (!part.json.is_null()) parts_json[name] = part.json;
    if (!part.tensors) continue;
    auto list = nlohmann::json::array();
    for (const auto& [key, t] : *part.tensors) {
      list.push_back({key, static_cast<int>(t.scalar_type()), t.sizes().vec()});
    }
    tensors.push_back({{"part", name}, {"tensors", list}, {"metadata", part.metadata}});
  }
  return nlohmann::json{{"state", ckpt::trainer_state_text(snap.state, parts_json)}, {"parts", tensors}}.dump();
}

}  // namespace

ckpt::Snapshot share_snapshot(dist::Runtime& rt, const ckpt::Snapshot* mine) {
  const bool root = rt.rank() == 0;
  if (root && mine == nullptr) throw std::logic_error("share_snapshot: rank 0 has no state to share");
  const auto header = nlohmann::json::parse(rt.broadcast_string(root ? describe(*mine) : std::string()));
  auto snap = ckpt::snapshot_of_state_text(header.at("state").get<std::string>());
  snap.state.format = 2;  // whole tensors, each part's with it
  torch::NoGradGuard no_grad;
  for (const auto& entry : header.at("parts")) {
    const auto name = entry.at("part").get<std::string>();
    const NamedTensors* have = root ? &*mine->part(name)->tensors : nullptr;
    NamedTensors got;
    for (size_t i = 0; i < entry.at("tensors").size(); ++i) {
      const auto& t = entry.at("tensors")[i];
      const auto type = static_cast<c10::ScalarType>(t.at(1).get<int>());
      auto buffer = root ? have->at(i).second.to(rt.device()).contiguous()
                         : torch::empty(t.at(2).get<std::vector<int64_t>>(), torch::dtype(type).device(rt.device()));
      rt.broadcast(buffer);
      got.emplace_back(t.at(0).get<std::string>(), buffer.to(torch::kCPU));
    }
    auto it = std::find_if(snap.parts.begin(), snap.parts.end(), [&](const auto& p) { return p.first == name; });
    if (it == snap.parts.end()) it = snap.parts.insert(snap.parts.end(), {name, PartState{}});
    it->second.tensors = std::move(got);
    it->second.metadata = entry.at("metadata").get<std::map<std::string, std::string>>();
  }
  return snap;
}

}  // namespace sana::train
