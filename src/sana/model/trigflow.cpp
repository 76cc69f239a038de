#include "sana/model/trigflow.h"

namespace sana::model {

torch::Tensor trigflow_forward(SanaMSImpl& model, const torch::Tensor& x_hat, const torch::Tensor& s,
                               const Condition& cond, torch::Tensor* logvar) {
  const auto sin = torch::sin(s), cos = torch::cos(s);
  const auto t = sin / (cos + sin);  // upstream's order of the sum
  const auto flow_time = t * 1000;
  const auto tt = t.view({-1, 1, 1, 1});
  const auto norm = torch::sqrt(tt * tt + (1 - tt) * (1 - tt));
  const auto x = x_hat * norm;
  const auto v = model.forward(x, flow_time, cond, logvar);
  return ((1 - 2 * tt) * x + (1 - 2 * tt + 2 * tt * tt) * v) / norm;
}

}  // namespace sana::model
