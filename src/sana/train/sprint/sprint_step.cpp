#include "sana/train/sprint/sprint_step.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "sana/data/epoch_plan.h"
#include "sana/data/sample_cache.h"
#include "sana/model/frozen_storage.h"
#include "sana/train/trainable/initial_model.h"
#include "sana/util/error.h"
#include "sana/util/log.h"

namespace sana::train {

namespace {

// A part under another name: the heads' optimizer beside the student's ("optimizer").
class RenamedPart : public Stateful {
 public:
  RenamedPart(Stateful& part, std::string name) : part_(part), name_(std::move(name)) {}
  std::string state_name() const override { return name_; }
  PartState save_state() const override { return part_.save_state(); }
  void restore_state(const PartState* saved, const std::string& source) override {
    part_.restore_state(saved, source);
  }

 private:
  Stateful& part_;
  std::string name_;
};

bool student_only(const std::string& name) {
  return name.rfind("cfg_embedder.", 0) == 0 || name.rfind("logvar_linear.", 0) == 0;
}

// model.teacher_model's weights: a flow model's file (the stage-1 fine-tune), or a
// student's, whose guidance embedding and log-variance head the teacher leaves out.
model::SanaMS load_teacher(const SprintStepOptions& o, dist::Runtime& rt) {
  const auto& path = o.teacher_model;
  const auto& spec = o.teacher;
  if (!std::filesystem::exists(path)) {
    throw UsageError(fmt::format("model.teacher_model: '{}' does not exist (rank {}); point it at the stage-1 "
                                 "teacher's weights (.safetensors or upstream's .pth) on every node",
                                 path, rt.rank()),
                     "config error");
  }
  model::SanaMS teacher(spec, model::BuildOptions{torch::kFloat32, false, o.seed});
  model::LoadReport report;
  try {
    report = model::load_weights(*teacher, path, /*strict=*/false);
  } catch (const model::WeightsError& e) {
    throw model::WeightsError(fmt::format("model.teacher_model: {}", e.what()));
  }
  std::vector<std::string> misfits = report.missing;
  misfits.insert(misfits.end(), report.mismatched.begin(), report.mismatched.end());
  for (const auto& u : report.unexpected) {
    if (!student_only(u)) misfits.push_back(u);
  }
  if (!misfits.empty()) {
    throw model::WeightsError(fmt::format("model.teacher_model: {} does not fit the teacher {} ({}): {}; name the "
                                          "teacher's preset in model.teacher",
                                          path, spec.name, report.summary(), fmt::join(misfits.begin(),
                                          misfits.begin() + std::min<size_t>(misfits.size(), 4), ", ")));
  }
  for (auto& p : teacher->parameters()) p.requires_grad_(false);
  const auto stored = model::store_frozen_layers(*teacher, o.frozen_dtype, [](const std::string&) {
    return true;
  });
  if (stored.layers > 0) {
    log::info("train.frozen_base_dtype {}: the teacher's {} Linear and Conv2d weights take {} ({} in fp32)",
              model::storage_dtype_name(o.frozen_dtype), stored.layers,
              data::size_text(static_cast<uint64_t>(stored.bytes_after)),
              data::size_text(static_cast<uint64_t>(stored.bytes_before)));
  }
  teacher->to(rt.device());
  teacher->eval();
  return teacher;
}

}  // namespace

SprintStep::SprintStep(SprintStepOptions o, StepParts& parts) : rt_(parts.rt), student_reducer_(parts.reducer) {
  auto& rt = parts.rt;
  teacher_ = load_teacher(o, rt);
  teacher_source_ = o.teacher_model;
  rt.agree("the teacher's weights (model.teacher_model)", weights_checksum(*teacher_));
  heads_ = model::LaddHeads(o.teacher.hidden, static_cast<int64_t>(o.step.head_blocks.size()), o.seed ^ 0x4c414444u,
                            torch::TensorOptions().device(rt.device()));
  NamedParams params;
  for (const auto& p : heads_->named_parameters()) params.emplace_back(p.key(), p.value());
  auto reducer = o.reducer;
  reducer.average = false;  // each rank's loss is its part of the step's: the sum is the gradient
  reducer.shard_gradients = reducer.gradients_on_host = false;
  exact_ = reducer.exact;
  micro_batch_size_ = o.micro_batch_size;
  heads_reducer_ = parallel::make_reducer(rt, params, reducer);
  heads_optimizer_ = make_optimizer(o.optimizer, params);
  heads_part_ = std::make_unique<model::ModuleState>(*heads_, "discriminator");
  optimizer_part_ = std::make_unique<RenamedPart>(*heads_optimizer_, "discriminator_optimizer");
  reducer_part_ = std::make_unique<RenamedPart>(*heads_reducer_, "discriminator_reducer");
  SprintObjective::AllReduce all_reduce;
  if (rt.world_size() > 1) all_reduce = [&rt](torch::Tensor& t) { rt.all_reduce(t); };
  o.step.exact = exact_;
  step_ = std::make_unique<SprintObjective>(std::move(o.step), parts.model, teacher_, heads_, std::move(all_reduce));
}

std::vector<Stateful*> SprintStep::parts() { return {heads_part_.get(), optimizer_part_.get(), reducer_part_.get()}; }

std::string SprintStep::describe() const {
  const auto& blocks = step_->options().head_blocks;
  const auto heads = model::ladd_heads_parameters(teacher_->spec().hidden, static_cast<int64_t>(blocks.size()));
  return fmt::format("SANA-Sprint stage 2 (sCM + LADD): teacher {} ({:.2f} M parameters, frozen, from {}); {} discriminator head{} on its block{} {} "
                     "({:.2f} M parameters, optimizer {})",
                     teacher_->spec().name, static_cast<double>(teacher_->parameter_count()) / 1e6, teacher_source_,
                     blocks.size(), blocks.size() == 1 ? "" : "s", blocks.size() == 1 ? "" : "s",
                     fmt::join(blocks, ", "), static_cast<double>(heads) / 1e6, heads_optimizer_->name()) +
         "; even steps train the student, odd ones the heads";
}

std::optional<OwnTarget> SprintStep::own_target(int64_t global_step) {
  if (generator_phase(global_step)) return std::nullopt;
  return OwnTarget{*heads_reducer_, *heads_optimizer_};
}

void SprintStep::check_agreement(dist::Runtime& rt, int64_t global_step) {
  const auto heads = rt.all_gather("final discriminator checksum", weights_checksum(*heads_));
  if (std::adjacent_find(heads.begin(), heads.end(), std::not_equal_to<>()) != heads.end()) {
    throw dist::Disagreement(fmt::format("the discriminator heads differ between ranks after step {}: checksums {}",
                                         global_step, fmt::join(heads, ", ")));
  }
  const int world = rt.world_size();
  log::info("discriminator heads identical on all {} rank{} (checksum {})", world, world == 1 ? "" : "s",
            heads.front());
}

torch::Tensor SprintStep::previous_x0(const SprintShare& share, dist::Runtime& rt) const {
  const int world = rt.world_size(), rank = rt.rank();
  if (world == 1) return {};
  const auto& last = share.micro.back().x0;
  auto all = torch::zeros({world, 1, last.size(1), last.size(2), last.size(3)}, last.options());
  all[rank].copy_(last.narrow(0, last.size(0) - 1, 1));
  rt.all_reduce(all);
  return all[(rank + world - 1) % world];
}

StepOutput SprintStep::run(TrainStep& micro, data::Loader& loader, const StepAt& at, BadSampleGuard& guard,
                           PhaseLosses& losses) {
  StepOutput out;
  const int64_t global_step = at.global_step;
  const auto prepared = micro.prepare(loader, at.epoch, at.step_in_epoch, guard, out);
  const double sd = step_->options().sigma_data;
  SprintShare share;
  for (const auto& p : prepared) {
    share.micro.push_back({p.x0 * sd, p.cond, std::vector<uint64_t>(p.ids.begin(), p.ids.end())});
  }
  share.global_batch = out.samples;
  share.first = data::rank_share_of(out.samples, micro_batch_size_, rt_.rank(), rt_.world_size(), exact_).first;
  share.step = global_step;
  const bool generator = generator_phase(global_step);
  if (!generator) share.previous_x0 = previous_x0(share, rt_);
  const auto parts = run_phase(share, generator ? student_reducer_ : *heads_reducer_, out, micro.autocast());
  const auto device = rt_.device();
  out.loss_sum = parts.parts[0].to(device, torch::kFloat64).clone();
  // The named parts, summed over ranks (one small all-reduce; the total goes through the
  // step's agreement as any run's loss).
  auto sums = parts.parts.to(device, torch::kFloat64).clone();
  rt_.all_reduce(sums);
  sums = sums.cpu();
  const auto names = generator ? std::vector<std::string>{"loss_G", "loss_scm", "loss_adv"}
                               : std::vector<std::string>{"loss_D", "loss_D_real", "loss_D_fake"};
  losses.clear();
  for (int64_t i = 0; i < 3; ++i) losses.emplace_back(names[static_cast<size_t>(i)], sums[i].item<double>());
  return out;
}

SprintLosses SprintStep::run_phase(const SprintShare& share, parallel::Reducer& reducer, StepOutput& out,
                                       const model::AutocastState& autocast) {
  const bool generator = generator_phase(share.step);
  std::vector<torch::Tensor> power_iteration;  // the heads' spectral-norm vectors before the phase
  if (exact_ && !generator) {
    for (const auto& b : heads_->buffers()) power_iteration.push_back(b.clone());
  }
  step_->before_backward([&reducer](bool last) { reducer.begin_backward(last); });
  SprintLosses parts;
  for (int again = 0;; ++again) {
    {
      PhaseTimer compute(out.times, &StepTimes::forward_backward);
      model::AutocastGuard guard(autocast);
      parts = generator ? step_->generator(share) : step_->discriminator(share);
    }
    {
      PhaseTimer waiting(out.times, &StepTimes::allreduce);
      reducer.finalize();
    }
    if (!reducer.overflowed()) return parts;
    // train.deterministic: a gradient too large for the integer sums on some rank; every rank
    // runs the phase again at the smaller scale the reducer chose (TrainStep's rule).
    if (again == 8) {
      throw RunError(fmt::format("train.deterministic: step {}: the {}'s gradients overflow the fixed-point sums even "
                                 "at a 2^-96 smaller scale; check the learning rate and the data",
                                 share.step + 1, generator ? "student" : "discriminator heads"));
    }
    log::info("train.deterministic: step {}: a gradient overflowed the integer sums; the {} phase runs again at a "
              "smaller scale ({})", share.step + 1, generator ? "generator" : "discriminator", again + 1);
    torch::NoGradGuard no_grad;
    auto buffers = heads_->buffers();
    for (size_t i = 0; i < power_iteration.size(); ++i) buffers[i].copy_(power_iteration[i]);
  }
}

}  // namespace sana::train
