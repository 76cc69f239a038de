#include "sana/model/trigflow.h"

#include <torch/csrc/autograd/autograd.h>

#include <mutex>

#include "sana/model/block_kernels.h"

namespace sana::model {

namespace {

// The flow model's time t [B, 1, 1, 1], its input x_f and sqrt(t^2 + (1 - t)^2) at (x_hat, s).
struct FlowInput {
  torch::Tensor t, x, norm;
};

FlowInput flow_input(const torch::Tensor& x_hat, const torch::Tensor& s) {
  const auto sin = torch::sin(s), cos = torch::cos(s);
  const auto t = (sin / (cos + sin)).view({-1, 1, 1, 1});  // upstream's order of the sum
  const auto norm = torch::sqrt(t * t + (1 - t) * (1 - t));
  return {t, x_hat * norm, norm};
}

}  // namespace

torch::Tensor trigflow_forward(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                               const Condition& cond, torch::Tensor* logvar) {
  const auto in = flow_input(x_hat, s);
  const auto& t = in.t;
  const auto v = model.forward(in.x, t.flatten() * 1000, cond, logvar);
  return ((1 - 2 * t) * in.x + (1 - 2 * t + 2 * t * t) * v) / in.norm;
}

std::vector<torch::Tensor> trigflow_block_outputs(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                                                  const Condition& cond, const std::vector<int64_t>& ids) {
  const auto in = flow_input(x_hat, s);
  return model.block_outputs(in.x, in.t.flatten() * 1000, cond, ids);
}

namespace {

// One forward-mode level, left however the forward ends (the level's tangents go with it).
class DualLevel {
 public:
  DualLevel() : id_(torch::autograd::forward_ad::enter_dual_level()) {}
  ~DualLevel() { torch::autograd::forward_ad::exit_dual_level(id_); }
  DualLevel(const DualLevel&) = delete;
  DualLevel& operator=(const DualLevel&) = delete;
  uint64_t id() const { return id_; }

 private:
  uint64_t id_;
};

}  // namespace

TrigflowJvp trigflow_jvp(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                         const Condition& cond, const torch::Tensor& dx_hat, const torch::Tensor& ds) {
  TORCH_CHECK(dx_hat.sizes() == x_hat.sizes() && ds.sizes() == s.sizes(),
              "trigflow_jvp: the tangents take the shapes of x_hat and s");
  torch::NoGradGuard no_grad;
  ComposedKernels composed;
  TrigflowJvp r;
  // LibTorch's forward-mode levels are one per process, not per thread ("Nested forward
  // mode AD is not supported"): one JVP at a time in a process.
  static std::mutex one_at_a_time;
  const std::lock_guard<std::mutex> lock(one_at_a_time);
  DualLevel level;
  const auto x = at::_make_dual(x_hat, dx_hat.to(x_hat.scalar_type()), static_cast<int64_t>(level.id()));
  const auto t = at::_make_dual(s, ds.to(s.scalar_type()), static_cast<int64_t>(level.id()));
  torch::Tensor logvar;
  const auto out = trigflow_forward(model, x, t, cond, model.spec().logvar ? &logvar : nullptr);
  auto [primal, tangent] = at::_unpack_dual(out, static_cast<int64_t>(level.id()));
  TORCH_CHECK(tangent.defined(), "trigflow_jvp: the forward lost its tangent (an operator without a forward derivative)");
  r.out = primal.clone();
  r.tangent = tangent.clone();
  if (logvar.defined()) r.logvar = std::get<0>(at::_unpack_dual(logvar, static_cast<int64_t>(level.id()))).clone();
  return r;
}

}  // namespace sana::model
