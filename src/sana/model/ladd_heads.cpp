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

// `fn` over x's rows: with train.deterministic's rows, over each canonical micro-batch's
// rows alone (chunk i), else over all of them at once (chunk 0).
torch::Tensor per_chunk(const torch::Tensor& x, const BatchGroups* groups,
                        const std::function<torch::Tensor(const torch::Tensor&, size_t)>& fn) {
  if (groups == nullptr || !groups->exact) return fn(x, 0);
  const auto& chunks = groups->exact->chunks;
  std::vector<torch::Tensor> out;
  int64_t first = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    out.push_back(fn(x.narrow(0, first, chunks[i]), i));
    first += chunks[i];
  }
  TORCH_CHECK(first == x.size(0), "ExactRows: chunks of ", first, " rows for ", x.size(0));
  return torch::cat(out);
}

// What stands for parameter `p` in chunk `chunk`: its replica, or `p`.
const torch::Tensor& parameter(const torch::Tensor& p, const BatchGroups* groups, size_t chunk) {
  if (groups == nullptr || !groups->exact || groups->exact->replicas == nullptr) return p;
  return groups->exact->replicas->of(p, chunk);
}

// Conv1d's layers (Sequential's "0") followed by BatchNormLocal ("1") and LeakyReLU(0.2).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t channels, int64_t kernel, at::Generator& gen, const torch::TensorOptions& o) {
    conv = register_module("0", SpectralConv1d(channels, channels, kernel, gen, o));
    norm = register_module("1", BatchNormLocal(channels, o));
  }
  torch::Tensor forward(const torch::Tensor& x, const BatchGroups* groups) {
    return torch::leaky_relu(norm->forward(conv->forward(x, groups), groups), 0.2);
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

torch::Tensor SpectralConv1dImpl::forward(const torch::Tensor& x, const BatchGroups* groups) {
  auto u = weight_u, v = weight_v;
  if (is_training()) {
    torch::NoGradGuard no_grad;
    const auto w = weight_orig.reshape({weight_orig.size(0), -1});
    weight_v.copy_(normalize(torch::mv(w.t(), weight_u)));
    weight_u.copy_(normalize(torch::mv(w, weight_v)));
    // As torch: the step's u and v are copies, so a later update cannot touch a saved tensor.
    u = weight_u.clone();
    v = weight_v.clone();
  }
  const int64_t pad = kernel / 2, n = x.size(-1);
  if (pad > n) throw std::invalid_argument(fmt::format("a circular padding of {} needs {} or more tokens, got {}", pad, pad, n));
  return per_chunk(x, groups, [&](const torch::Tensor& rows, size_t chunk) {
    const auto& w_orig = parameter(weight_orig, groups, chunk);
    const auto sigma = torch::dot(u, torch::mv(w_orig.reshape({w_orig.size(0), -1}), v));
    // padding_mode "circular"
    const auto input = pad > 0 ? torch::cat({rows.narrow(-1, n - pad, pad), rows, rows.narrow(-1, 0, pad)}, -1) : rows;
    return torch::conv1d(input, w_orig / sigma, parameter(bias, groups, chunk));
  });
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

BatchGroups exact_batch_groups(const std::vector<int64_t>& positions, int64_t total, int64_t virtual_bs,
                               std::vector<int64_t> chunks, std::function<void(torch::Tensor&)> add_over_ranks,
                               const HeadReplicas* replicas) {
  auto g = batch_groups(positions, total, virtual_bs);
  auto e = std::make_shared<ExactRows>();
  e->chunks = std::move(chunks);
  e->positions = torch::tensor(positions, torch::kInt64);
  e->all_groups = torch::div(torch::arange(total, torch::kInt64) * g.count, total, "floor");
  e->add_over_ranks = std::move(add_over_ranks);
  e->replicas = replicas;
  g.exact = std::move(e);
  return g;
}

HeadReplicas::HeadReplicas(torch::nn::Module& heads, size_t chunks) {
  params_ = heads.parameters();
  for (size_t i = 0; i < params_.size(); ++i) index_.emplace(params_[i].unsafeGetTensorImpl(), i);
  leaves_.resize(chunks);
  for (auto& set : leaves_) {
    for (const auto& p : params_) set.push_back(p.detach().requires_grad_(p.requires_grad()));
  }
}

const torch::Tensor& HeadReplicas::of(const torch::Tensor& parameter, size_t chunk) const {
  const auto it = index_.find(parameter.unsafeGetTensorImpl());
  return it == index_.end() ? parameter : leaves_.at(chunk)[it->second];
}

std::vector<torch::Tensor> HeadReplicas::gradients(size_t chunk) const {
  std::vector<torch::Tensor> out;
  for (const auto& leaf : leaves_.at(chunk)) out.push_back(leaf.grad().defined() ? leaf.grad() : torch::zeros_like(leaf));
  return out;
}

namespace {

// Per group and channel, the sum of x [B, C, N] over the group's rows and tokens: [G, C],
// added over the processes by `sum` where there is one.
torch::Tensor group_sums(const torch::Tensor& x, const torch::Tensor& members, const BatchGroups& g) {
  auto s = torch::matmul(members.t(), x.sum(2));  // [G, B] x [B, C]
  return g.sum ? g.sum(s) : s;
}

// Each row's group total of rows [b, C] under train.deterministic's rows: every process's
// rows placed in a [total, C] tensor of zeros and added over the processes (exact), then
// summed per group in one order, the same on every process at any split. Its own adjoint:
// the backward takes the same total of the rows' gradients.
torch::Tensor exact_group_totals(const torch::Tensor& rows, const BatchGroups& g) {
  const auto& e = *g.exact;
  auto all = torch::zeros({e.all_groups.size(0), rows.size(1)}, rows.options());
  all.index_copy_(0, e.positions.to(rows.device()), rows);
  if (e.add_over_ranks) e.add_over_ranks(all);
  all = all + 0.0;  // -0 (one row) and +0 (another process's zeros) make +0 there: alike here
  const auto members = torch::one_hot(e.all_groups.to(rows.device()), g.count).to(rows.scalar_type());
  return torch::matmul(members.t(), all).index_select(0, g.group.to(rows.device()));
}

struct ExactGroupTotal : public torch::autograd::Function<ExactGroupTotal> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& rows,
                               const BatchGroups* g) {
    ctx->saved_data["groups"] = reinterpret_cast<int64_t>(g);  // lives until the phase's backward is done
    ctx->saved_data["like"] = torch::zeros({1, rows.size(1)}, rows.options());
    return exact_group_totals(rows, *g);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* g = reinterpret_cast<const BatchGroups*>(ctx->saved_data["groups"].toInt());
    // Every process runs this collective, with or without a gradient of its own.
    const auto like = ctx->saved_data["like"].toTensor();
    const auto grad = grads[0].defined() ? grads[0] : like.expand({g->group.size(0), like.size(1)}).contiguous();
    return {exact_group_totals(grad, *g), torch::Tensor()};
  }
};

// BatchNormLocal's normalisation over `g`'s groups: two passes (mean, then the variance of
// the differences), as upstream's x.var, not E[x^2] - E[x]^2.
torch::Tensor normalise_in_groups(const torch::Tensor& x, const BatchGroups& g, double eps) {
  TORCH_CHECK(g.group.dim() == 1 && g.group.size(0) == x.size(0), "BatchGroups: one group per row, ", x.size(0),
              " rows, got ", g.group.sizes());
  if (g.exact) {  // per row: its group's total over the whole batch, then the same arithmetic
    const auto counts = torch::bincount(g.exact->all_groups, {}, g.count).index_select(0, g.group);
    const auto count = (counts.to(x.scalar_type()) * static_cast<double>(x.size(2))).to(x.device()).unsqueeze(1);
    const auto mean = ExactGroupTotal::apply(x.sum(2), &g) / count;  // [b, C]
    const auto d = x - mean.unsqueeze(2);
    const auto var = ExactGroupTotal::apply((d * d).sum(2), &g) / count;
    return d / torch::sqrt(var + eps).unsqueeze(2);
  }
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
    const auto normed = normalise_in_groups(x, *across, eps);
    return per_chunk(normed, across, [&](const torch::Tensor& rows, size_t chunk) {
      return rows * parameter(weight, across, chunk).view({1, -1, 1}) + parameter(bias, across, chunk).view({1, -1, 1});
    });
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
  return children["cls"]->as<SpectralConv1dImpl>()->forward(h, groups);
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
