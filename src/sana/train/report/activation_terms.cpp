// The activations' measurement (report/activation_terms.h): small forwards and backwards on
// the CPU, counted by the allocator.
#include "sana/train/report/activation_terms.h"

#include <algorithm>

#include "sana/model/sana_ms.h"
#include "sana/torch_compat.h"
#include "sana/train/report/counting_allocator.h"

namespace sana::train {

namespace {

model::Condition measured_condition(const model::ModelSpec& spec, int64_t batch) {
  model::Condition cond;
  if (spec.conditioning == model::Conditioning::caption) {
    cond.y = torch::randn({batch, spec.caption_tokens, spec.caption_channels});
    cond.mask = torch::ones({batch, spec.caption_tokens}, torch::kInt64);
  } else if (spec.conditioning == model::Conditioning::class_label) {
    cond.y = torch::zeros({batch}, torch::kInt64);
  }
  if (spec.cfg_embed) cond.cfg_scale = torch::full({batch}, 4.5);  // a SANA-Sprint student's guidance input
  return cond;
}

// The most bytes `count` held above its start during one forward and backward of `batch`
// samples of h x w tokens, every `checkpoint_every`-th block checkpointed (0: none). The
// gradients exist before (as the reducer's buckets do in a run), so the backward
// accumulates into them.
double step_bytes(model::SanaMS& net, CountingScope& count, int64_t h_tokens, int64_t w_tokens, int64_t batch,
                  int64_t checkpoint_every) {
  const auto& spec = net->spec();
  torch::NoGradGuard setup;  // only the forward below records a graph
  const auto x = torch::randn({batch, spec.in_channels, h_tokens * spec.patch, w_tokens * spec.patch});
  const auto t = torch::full({batch}, 500.0);
  const auto cond = measured_condition(spec, batch);
  net->set_grad_checkpointing(checkpoint_every > 0, checkpoint_every);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const int64_t before = count.held();
  count.reset_peak();
  {
    torch::AutoGradMode grad(true);
    const auto target = torch::randn_like(x);
    (net->forward(x, t, cond) - target).square().mean().backward();
  }
  return static_cast<double>(count.peak() - before);
}

model::SanaMS build(model::ModelSpec spec, int64_t depth) {
  spec.depth = depth;
  spec.control_blocks = 0;  // a ControlNet's copied blocks count as blocks (estimate_memory)
  torch::NoGradGuard no_grad;
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, 0});
  net->train();
  return net;
}

// SANA-Sprint's stage 2 at one depth: student and teacher cut to it, one head on each of the
// teacher's blocks `blocks`, and the step over them.
struct SprintModels {
  model::SanaMS student{nullptr};
  model::LaddHeads heads{nullptr};
  std::unique_ptr<SprintObjective> step;

  SprintModels(const model::ModelSpec& spec, const MemoryEstimateOptions::Sprint& sprint, int64_t depth,
               std::vector<int64_t> blocks) {
    student = build(spec, depth);
    auto teacher = build(sprint.teacher, depth);
    heads = model::LaddHeads(sprint.teacher.hidden, static_cast<int64_t>(blocks.size()), 0);
    auto o = sprint.step;
    o.head_blocks = std::move(blocks);
    o.exact = false;
    step = std::make_unique<SprintObjective>(o, student, teacher, heads, nullptr);
  }

  // A generator step then a discriminator step of `batch` samples: the most bytes above the start.
  double bytes(CountingScope& count, int64_t h_tokens, int64_t w_tokens, int64_t batch, int64_t checkpoint_every) {
    const auto& spec = student->spec();
    SprintShare share;
    {
      torch::NoGradGuard setup;
      std::vector<uint64_t> ids(static_cast<size_t>(batch));
      std::iota(ids.begin(), ids.end(), 0);
      share.micro.push_back({torch::randn({batch, spec.in_channels, h_tokens * spec.patch, w_tokens * spec.patch}) * 0.5,
                             measured_condition(spec, batch), ids});
      share.global_batch = batch;
      student->set_grad_checkpointing(checkpoint_every > 0, checkpoint_every);
      for (auto& p : student->parameters()) p.mutable_grad() = torch::zeros_like(p);
      for (auto& p : heads->parameters()) p.mutable_grad() = torch::zeros_like(p);
    }
    const int64_t before = count.held();
    count.reset_peak();
    step->generator(share);
    share.step = 1;
    step->discriminator(share);
    return static_cast<double>(count.peak() - before);
  }
};

}  // namespace

namespace activation_terms {

// A step's activations from the measured terms: every block run (a ControlNet's copies
// too, each kept like a base block) keeps all its activations, or with gradient
// checkpointing (gc_step > 0) every gc_step-th block only its inputs (the recompute of one
// block at a time is in `kept`'s outside terms), the others all of theirs.
double step_activations(const PerSample& plain, const PerSample& kept, const model::ModelSpec& spec, int64_t tokens,
                        int64_t micro_batch, int64_t gc_step) {
  const int64_t blocks_run = spec.depth + spec.control_blocks;
  if (gc_step <= 0) return plain.bytes(blocks_run, tokens, micro_batch);
  PerSample plain_blocks = plain;
  plain_blocks.outside = plain_blocks.outside_per_token = 0;
  const auto every = [&](int64_t n) { return (n + gc_step - 1) / gc_step; };
  const int64_t checkpointed = every(spec.depth) + every(spec.control_blocks);
  return kept.bytes(checkpointed, tokens, micro_batch) +
         plain_blocks.bytes(blocks_run - checkpointed, tokens, micro_batch);
}

PerSample per_sample_of(const std::map<std::string, double>& terms) {
  const auto at = [&](const char* k) {
    const auto it = terms.find(k);
    return it == terms.end() ? 0.0 : it->second;
  };
  return {at("outside"), at("outside_per_token"), at("block"), at("block_per_token")};
}

// From the model at depth 1 and 2, each on 8 x 8 and 8 x 16 tokens: the four terms are the
// differences. Both modes (without and with gradient checkpointing) from the same two builds.
std::pair<PerSample, PerSample> measure(const model::ModelSpec& spec) {
  constexpr int64_t side = 8, n1 = side * side, n2 = 2 * side * side;
  double at[2][2][2];  // [checkpointing][depth - 1][grid]
  CountingScope count;
  model::DeviceProducts as_on_a_gpu;  // the same figures at any number of threads
  for (int64_t depth : {1, 2}) {
    auto net = build(spec, depth);
    for (int kept : {0, 1}) {
      at[kept][depth - 1][0] = step_bytes(net, count, side, side, 1, kept);
      at[kept][depth - 1][1] = step_bytes(net, count, side, 2 * side, 1, kept);
    }
  }
  const auto terms = [&](const double (&a)[2][2]) {
    const double dn = static_cast<double>(n2 - n1);
    PerSample p;
    p.block_per_token = std::max(0.0, (a[1][1] - a[0][1] - a[1][0] + a[0][0]) / dn);
    p.block = std::max(0.0, a[1][0] - a[0][0] - p.block_per_token * n1);
    p.outside_per_token = std::max(0.0, (a[0][1] - a[0][0]) / dn - p.block_per_token);
    p.outside = std::max(0.0, a[0][0] - p.block - (p.block_per_token + p.outside_per_token) * n1);
    return p;
  };
  return {terms(at[0]), terms(at[1])};
}

// SANA-Sprint's stage 2 from the student's flow terms: a generator step holds the student's
// sCM graph (with train.train_largest_timestep also its x0 prediction's) and the teacher's
// up to its last head at once, the teacher's blocks each kept as a student block (its
// gradients reach only its input, so this is above it). Its backward runs through the
// teacher first, so with gradient checkpointing the student's recompute comes after the
// teacher's graph is gone: the larger of the student's checkpointed step and the teacher's
// graph with the student's kept block inputs. On the tiny presets against stage 2's steps
// measured whole (sprint_step_peak_bytes, tests/unit/train/test_memory_estimate.cpp): from
// 4% under to 13% over (2026-11-29).
void add_stage2_graphs(const MemoryEstimateOptions::Sprint& sprint, const PerSample& plain, const PerSample& kept,
                       int64_t depth, MemoryEstimate& e) {
  const double graphs = sprint.step.draws.largest_timestep ? 2 : 1;
  const auto& blocks = sprint.step.head_blocks;
  const int64_t teacher_blocks = blocks.empty() ? sprint.teacher.depth : *std::max_element(blocks.begin(), blocks.end()) + 1;
  const auto blocks_only = [](PerSample p) {
    p.outside = p.outside_per_token = 0;
    return p;
  };
  const double teacher = blocks_only(plain).bytes(teacher_blocks, e.tokens, e.micro_batch);
  const double student_kept = blocks_only(kept).bytes(depth, e.tokens, e.micro_batch);
  e.activations = graphs * e.activations + teacher;
  e.activations_checkpointed = std::max(e.activations_checkpointed, graphs * student_kept + teacher);
}

}  // namespace activation_terms

double sprint_step_peak_bytes(const model::ModelSpec& spec, const MemoryEstimateOptions::Sprint& sprint, int64_t depth,
                              int64_t h_tokens, int64_t w_tokens, int64_t batch, int64_t checkpoint_every) {
  SprintModels models(spec, sprint, depth, sprint.step.head_blocks);
  CountingScope count;
  model::DeviceProducts as_on_a_gpu;
  return models.bytes(count, h_tokens, w_tokens, batch, checkpoint_every);
}

double step_peak_bytes(const model::ModelSpec& spec, int64_t depth, int64_t h_tokens, int64_t w_tokens, int64_t batch,
                       int64_t checkpoint_every) {
  auto net = build(spec, depth);
  CountingScope count;
  model::DeviceProducts as_on_a_gpu;
  return step_bytes(net, count, h_tokens, w_tokens, batch, checkpoint_every);
}

}  // namespace sana::train
