#include "sana/train/optim/lr_scheduler.h"

namespace sana::train {

PartState LrScheduler::save_state() const {
  PartState s;
  s.json = {{"offset", offset_}, {"position", position()}};
  return s;
}

void LrScheduler::restore_state(const PartState* saved, const std::string& /*source*/) {
  offset_ = saved != nullptr && saved->json.is_object() ? saved->json.value("offset", int64_t{0}) : 0;
}

int64_t LrScheduler::saved_position(const PartState* saved, int64_t global_step) {
  if (saved != nullptr && saved->json.is_object() && saved->json.contains("position")) {
    return saved->json.at("position").get<int64_t>();
  }
  return global_step;
}

}  // namespace sana::train
