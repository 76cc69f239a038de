#include "sana/train/step/training_step.h"

#include <mutex>

namespace sana::train {

namespace {

struct RegisteredStep {
  std::string name;
  StepMaker make;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<RegisteredStep>& registry() {
  static std::vector<RegisteredStep> kinds;
  return kinds;
}

}  // namespace

StepOutput FlowMatchingStep::run(TrainStep& micro, data::Loader& loader, const StepAt& at, BadSampleGuard& guard,
                                 PhaseLosses& /*losses*/) {
  return micro.run(loader, at.epoch, at.step_in_epoch, guard, at.loss_scale);
}

StepRegistration::StepRegistration(std::string name, StepMaker make) : name_(name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back({std::move(name), std::move(make)});
}

StepRegistration::~StepRegistration() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& kinds = registry();
  for (auto it = kinds.rbegin(); it != kinds.rend(); ++it) {
    if (it->name == name_) {
      kinds.erase(std::next(it).base());
      return;
    }
  }
}

std::unique_ptr<TrainingStep> registered_training_step(StepParts& parts, std::string& name) {
  std::vector<RegisteredStep> kinds;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    kinds = registry();
  }
  for (auto it = kinds.rbegin(); it != kinds.rend(); ++it) {
    if (auto step = it->make(parts)) {
      name = it->name;
      return step;
    }
  }
  return nullptr;
}

}  // namespace sana::train
