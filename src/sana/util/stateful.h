// A part of a run whose state a checkpoint carries (as torchtitan's Stateful): it names
// itself, says what it holds (JSON, and named CPU tensors when it has any) and takes it
// back. The trainer registers its parts with the Checkpointer, which walks them; a part
// never writes files itself and never calls a collective in save_state(). A part whose
// state is spread over ranks (ZeRO's shares, train/zero.h) gathers it in gather_state(),
// which every rank calls.
#pragma once

#include <nlohmann/json.hpp>

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
