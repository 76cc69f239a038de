// A part of a run whose state a checkpoint carries (as torchtitan's Stateful): it names
// itself, says what it holds (JSON, and named CPU tensors when it has any) and takes it
// back. The trainer registers its parts with the Checkpointer, which walks them; a part
// never writes files itself and never calls a collective in save_state(). A part whose
// state is spread over ranks (ZeRO's shares, parallel/zero.h) gathers it in gather_state(),
// which every rank calls.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "sana/util/safetensors.h"

namespace sana {

struct PartState {
  nlohmann::json json;                  // null: the part keeps nothing as JSON
  std::optional<NamedTensors> tensors;  // a value, even empty: the checkpoint has <name>.safetensors
  std::map<std::string, std::string> metadata;  // more of that file's metadata (diffusers' LoRA settings)

  // The tensors a checkpoint holds of a part (`saved` may be null): none when it has none.
  static const NamedTensors& tensors_of(const PartState* saved) {
    static const NamedTensors none;
    return saved != nullptr && saved->tensors ? *saved->tensors : none;
  }
};

class Stateful {
 public:
  virtual ~Stateful() = default;
  // Unique in a run: the key under trainer_state.json's "parts" and the tensor file's name.
  virtual std::string state_name() const = 0;
  // Owned CPU copies: the checkpoint is written in the background while training goes on.
  virtual PartState save_state() const = 0;
  // save_state() of only the tensors `keep` accepts (by entry name): this rank's share of a
  // checkpoint every rank writes (format 3, ckpt/shards.h). This default copies everything
  // first; a part whose tensors may lack memory on this rank (ZeRO stage 3's parameters)
  // copies only what it keeps.
  virtual PartState save_state_of(const std::function<bool(const std::string&)>& keep) const {
    auto state = save_state();
    if (state.tensors) {
      NamedTensors kept;
      for (auto& entry : *state.tensors) {
        if (keep(entry.first)) kept.push_back(std::move(entry));
      }
      state.tensors = std::move(kept);
    }
    return state;
  }
  // restore_state() needs only the entries of this rank's share (ZeRO's sharded parts), so
  // a sharded checkpoint's other entries are not even read; false: every entry.
  virtual bool restores_share() const { return false; }
  // The part's whole state for a checkpoint on the writing rank (`writer`); nothing on the
  // others. Every rank calls it for every part, in the same order: a part whose state is
  // spread over ranks gathers it here (a collective).
  virtual std::optional<PartState> gather_state(bool writer) const {
    return writer ? std::optional<PartState>(save_state()) : std::nullopt;
  }
  // What save_state() wrote. `saved` is null when the checkpoint holds nothing of this part
  // (written before the part existed); `source` names the checkpoint in messages.
  virtual void restore_state(const PartState* saved, const std::string& source) = 0;
};

}  // namespace sana
