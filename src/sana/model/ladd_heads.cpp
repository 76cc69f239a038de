#include "sana/model/ladd_heads.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace sana::model {

namespace {

// F.normalize(x, dim=0, eps): x / max(||x||, eps).
torch::Tensor normalize(const torch::Tensor& x, double eps = 1e-12) { return x / x.norm().clamp_min(eps); }

// A draw on the CPU from `gen`, in `options`' dtype and device.
torch::Tensor drawn(at::IntArrayRef shape, const torch::TensorOptions& options, at::Generator& gen, double bound) {
  auto t = torch::empty(shape, torch::TensorOptions().dtype(torch::kFloat64));
  if (bound > 0) {
    t.uniform_(-bound, bound, gen);
  } else {
    t.normal_(0, 1, gen);
  }
  return t.to(torch::TensorOptions().dtype(options.dtype()).device(options.device()));
}

// Conv1d's layers (Sequential's "0") followed by BatchNormLocal ("1") and LeakyReLU(0.2).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t channels, int64_t kernel, at::Generator& gen, const torch::TensorOptions& o) {
    conv = register_module("0", SpectralConv1d(channels, channels, kernel, gen, o));
    norm = register_module("1", BatchNormLocal(channels, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups) {
    return torch::leaky_relu(norm->forward(conv->forward(x), groups), 0.2);
  }
  SpectralConv1d conv{nullptr};
  BatchNormLocal norm{nullptr};
};
TORCH_MODULE(Block);

// ResidualBlock(fn): (fn(x) + x) / sqrt(2), fn registered as "fn".
class ResidualImpl : public torch::nn::Module {
 public:
  ResidualImpl(int64_t channels, at::Generator& gen, const torch::TensorOptions& o) {
    fn = register_module("fn", Block(channels, 9, gen, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups) {
    return (fn->forward(x, groups) + x) / std::sqrt(2.0);
  }
  Block fn{nullptr};
};
TORCH_MODULE(Residual);

// DiscHead.main: Sequential(block(k=1), ResidualBlock(block(k=9))).
class MainImpl : public torch::nn::Module {
 public:
  MainImpl(int64_t channels, at::Generator& gen, const torch::TensorOptions& o) {
    first = register_module("0", Block(channels, 1, gen, o));
    residual = register_module("1", Residual(channels, gen, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups) {
    return residual->forward(first->forward(x, groups), groups);
  }
  Block first{nullptr};
  Residual residual{nullptr};
};
TORCH_MODULE(Main);

}  // namespace

SpectralConv1dImpl::SpectralConv1dImpl(int64_t in, int64_t out, int64_t kernel_, at::Generator& gen,
                                       const torch::TensorOptions& o)
    : kernel(kernel_) {
  // nn.Conv1d's reset_parameters: kaiming_uniform(a = sqrt 5), i.e. U(+-1/sqrt(fan_in)), the
  // bias U(+-1/sqrt(fan_in)); then SpectralNorm.apply's u and v: normalize(N(0, 1)).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in * kernel));
  weight_orig = register_parameter("weight_orig", drawn({out, in, kernel}, o, gen, bound));
  bias = register_parameter("bias", drawn({out}, o, gen, bound));
  weight_u = register_buffer("weight_u", normalize(drawn({out}, o, gen, 0)));
  weight_v = register_buffer("weight_v", normalize(drawn({in * kernel}, o, gen, 0)));
}

torch::Tensor SpectralConv1dImpl::forward(const torch::Tensor& x) {
  const auto w = weight_orig.reshape({weight_orig.size(0), -1});
  auto u = weight_u, v = weight_v;
  if (is_training()) {
    torch::NoGradGuard no_grad;
    weight_v.copy_(normalize(torch::mv(w.t(), weight_u)));
    weight_u.copy_(normalize(torch::mv(w, weight_v)));
    // As torch: the step's u and v are copies, so a later update cannot touch a saved tensor.
    u = weight_u.clone();
    v = weight_v.clone();
  }
  const auto sigma = torch::dot(u, torch::mv(w, v));
  const auto weight = weight_orig / sigma;
  const int64_t pad = kernel / 2, n = x.size(-1);
  auto input = x;
  if (pad > 0) {  // padding_mode "circular"
    if (pad > n) throw std::invalid_argument(fmt::format("a circular padding of {} needs {} or more tokens, got {}", pad, pad, n));
    input = torch::cat({x.narrow(-1, n - pad, pad), x, x.narrow(-1, 0, pad)}, -1);
  }
  return torch::conv1d(input, weight, bias);
}

BatchNormLocalImpl::BatchNormLocalImpl(int64_t channels, const torch::TensorOptions& o) {
  weight = register_parameter("weight", torch::ones({channels}, o));
  bias = register_parameter("bias", torch::zeros({channels}, o));
}

BatchGroups batch_groups(const std::vector<int64_t>& positions, int64_t total, int64_t virtual_bs) {
  BatchGroups g;
  g.count = (total + virtual_bs - 1) / virtual_bs;
  std::vector<int64_t> group;
  for (const int64_t r : positions) {
    if (r < 0 || r >= total) throw std::out_of_range(fmt::format("row {} of a batch of {}", r, total));
    group.push_back(r * g.count / total);
  }
  g.group = torch::tensor(group, torch::kInt64);
  return g;
}

namespace {

// Per group and channel, the sum of x [B, C, N] over the group's rows and tokens: [G, C],
// added over the processes by `sum` where there is one.
torch::Tensor group_sums(const torch::Tensor& x, const torch::Tensor& members, const BatchGroups& g) {
  auto s = torch::matmul(members.t(), x.sum(2));  // [G, B] x [B, C]
  return g.sum ? g.sum(s) : s;
}

// BatchNormLocal's normalisation over `g`'s groups: two passes (mean, then the variance of
// the differences), as upstream's x.var, not E[x^2] - E[x]^2.
torch::Tensor normalise_in_groups(const torch::Tensor& x, const BatchGroups& g, double eps) {
  TORCH_CHECK(g.group.dim() == 1 && g.group.size(0) == x.size(0), "BatchGroups: one group per row, ", x.size(0),
              " rows, got ", g.group.sizes());
  const auto members = torch::one_hot(g.group.to(x.device()), g.count).to(x.scalar_type());  // [B, G]
  auto count = members.sum(0) * static_cast<double>(x.size(2));                          // [G]
  if (g.sum) count = g.sum(count);
  count = count.clamp_min(1).unsqueeze(1);  // a group with no rows anywhere is never read
  const auto mean = torch::matmul(members, group_sums(x, members, g) / count);  // [B, C]
  const auto d = x - mean.unsqueeze(2);
  const auto var = torch::matmul(members, group_sums(d * d, members, g) / count);
  return d / torch::sqrt(var + eps).unsqueeze(2);
}

}  // namespace

torch::Tensor BatchNormLocalImpl::forward(const torch::Tensor& x, const BatchGroups* across) {
  if (across != nullptr) {
    return normalise_in_groups(x, *across, eps) * weight.view({1, -1, 1}) + bias.view({1, -1, 1});
  }
  const int64_t b = x.size(0);
  const int64_t groups = (b + virtual_bs - 1) / virtual_bs;
  if (b % groups != 0) {
    throw std::invalid_argument(fmt::format(
        "BatchNormLocal: a batch of {} does not split into {} equal groups (ceil({} / {}))", b, groups, b, virtual_bs));
  }
  const auto g = x.view({groups, -1, x.size(-2), x.size(-1)});
  const auto mean = g.mean({1, 3}, true);
  const auto var = (g - mean).pow(2).mean({1, 3}, true);  // biased
  const auto normed = ((g - mean) / torch::sqrt(var + eps)).view(x.sizes());
  return normed * weight.view({1, -1, 1}) + bias.view({1, -1, 1});
}

DiscHeadImpl::DiscHeadImpl(int64_t channels, at::Generator& gen, const torch::TensorOptions& o) {
  register_module("main", Main(channels, gen, o));
  register_module("cls", SpectralConv1d(channels, 1, 1, gen, o));
}

torch::Tensor DiscHeadImpl::forward(const torch::Tensor& x, const BatchGroups* groups) {
  const auto children = named_children();
  const auto h = children["main"]->as<MainImpl>()->forward(x, groups);
  return children["cls"]->as<SpectralConv1dImpl>()->forward(h);
}

LaddHeadsImpl::LaddHeadsImpl(int64_t channels, int64_t count, uint64_t seed, const torch::TensorOptions& o) {
  auto gen = at::detail::createCPUGenerator(seed);
  heads = register_module("heads", torch::nn::ModuleList());
  for (int64_t i = 0; i < count; ++i) heads->push_back(DiscHead(channels, gen, o));
}

torch::Tensor LaddHeadsImpl::forward(const std::vector<torch::Tensor>& features, const BatchGroups* groups) {
  if (static_cast<int64_t>(features.size()) != static_cast<int64_t>(heads->size())) {
    throw std::invalid_argument(fmt::format("{} features for {} discriminator heads", features.size(), heads->size()));
  }
  std::vector<torch::Tensor> logits;
  for (size_t i = 0; i < features.size(); ++i) {
    const auto& f = features[i];  // [B, N, C]
    logits.push_back(heads[i]->as<DiscHeadImpl>()->forward(f.transpose(1, 2), groups).reshape({f.size(0), -1}));
  }
  return torch::cat(logits, 1);
}

int64_t ladd_heads_parameters(int64_t channels, int64_t count) {
  const int64_t c = channels;
  // k=1 conv C^2 + C, its norm 2C; k=9 conv 9 C^2 + C, its norm 2C; the logit conv C + 1.
  return count * (10 * c * c + 7 * c + 1);
}

torch::Tensor hinge_discriminator_loss(const torch::Tensor& real, const torch::Tensor& fake) {
  return 0.5 * (torch::relu(1 - real).mean() + torch::relu(1 + fake).mean());
}

torch::Tensor hinge_generator_loss(const torch::Tensor& fake) { return -fake.mean(); }

}  // namespace sana::model
