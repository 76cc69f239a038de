// The gradient hooks the reducer and ZeRO 3 hang on each parameter (parallel/accumulator_hooks.h):
// every owner is called after the gradient is accumulated, in the order it hooked, an owner
// gone is never called, and the hooks still run after set_data() made autograd forget the
// parameter's accumulator (what block swapping does to a trained block's parameters each time
// they move between host and device; here a change of dtype, which does the same on the CPU).
#include "catch.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "sana/parallel/accumulator_hooks.h"

using sana::parallel::AccumulatorHooks;

TEST_CASE("accumulator hooks: each owner called after accumulation, and after autograd forgot the accumulator",
          "[torch][reducer]") {
  auto w = torch::ones({3}).requires_grad_(true);
  auto v = torch::ones({2}).requires_grad_(true);
  std::vector<std::string> calls;
  torch::Tensor seen;
  AccumulatorHooks first({w, v}, [&](size_t k) {
    calls.push_back(k == 0 ? "first w" : "first v");
    if (k == 0) seen = w.grad().clone();  // accumulated already
  });
  std::optional<AccumulatorHooks> second;
  second.emplace(std::vector<torch::Tensor>{w}, [&](size_t) { calls.push_back("second w"); });

  (w * 2).sum().backward();
  CHECK(calls == std::vector<std::string>{"first w", "second w"});
  CHECK(torch::equal(seen, torch::full({3}, 2.0)));

  // A new dtype (as a new device would): autograd drops the accumulator it had.
  const auto before = torch::autograd::impl::grad_accumulator(w);
  w.set_data(w.detach().to(torch::kDouble));
  w.mutable_grad() = torch::Tensor();
  const auto after = torch::autograd::impl::grad_accumulator(w);
  CHECK(before.get() != after.get());
  calls.clear();
  second.reset();
  ((w * 3).sum() + v.sum()).backward();
  std::sort(calls.begin(), calls.end());  // w's and v's accumulators run in either order
  CHECK(calls == std::vector<std::string>{"first v", "first w"});
  CHECK(torch::equal(seen, torch::full({3}, 3.0, torch::kDouble)));
}
