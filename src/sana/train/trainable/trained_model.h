// The model a run trains, as Trainer::start builds it: its shape (the spec), the network
// with rank 0's weights agreed, the frozen encoders that feed it, and what of it trains
// (trainable.h: every weight, LoRA adapters, a ControlNet's blocks).
//
// Owns: those four, built once per trainer, and which blocks swap (train.offload_blocks).
// Never: reduces, steps or checkpoints them (the update and the Checkpointer do, through
// trainable's parameters() and checkpoint_part()).
#pragma once

#include <memory>

#include "sana/model/sana_ms.h"
#include "sana/model/spec.h"
#include "sana/model/swapped_blocks.h"
#include "sana/train/input/run_encoders.h"
#include "sana/train/trainable/trainable.h"

namespace sana::train {

struct TrainedModel {
  model::ModelSpec spec;
  model::SanaMS net{nullptr};
  Encoders encoders;
  std::unique_ptr<Trainable> trainable;  // the model, or adapters on it (train.lora)
  std::unique_ptr<model::SwappedBlocks> swapped;  // train.offload_blocks: the blocks in host memory
};

}  // namespace sana::train
