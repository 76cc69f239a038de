// Adafactor, Prodigy and schedule-free AdamW, each judged by the PyPI package users know
// (transformers' Adafactor, prodigyopt's Prodigy, schedulefree's AdamWScheduleFree) over 20 steps on the same gradients, in each package's option
// combinations; and each resumes its step from its state to the last bit.
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "catch.h"
#include "sana/train/optim/adafactor.h"
#include "sana/train/optim/prodigy.h"
#include "sana/train/optim/schedule_free.h"
#include "train/optim_case.h"

using namespace sana;
using namespace sana::test;

namespace {

const Shapes kShapes = {{"linear", {30, 20}}, {"conv", {8, 4, 3, 3}}, {"pointwise", {6, 5, 1, 1}}, {"bias", {9}}};

// 20 steps of `opt` at `lrs` on gradients pulling each parameter towards a random target,
// with noise, so that a step-size estimate has a direction to find; the gradients, our
// parameters and every state entry ("state.<param>/<state>") go into `file`.
void run_steps(train::Optimizer& opt, train::NamedParams& named, const std::vector<double>& lrs, NamedTensors& file) {
  std::vector<torch::Tensor> targets;
  for (const auto& [name, p] : named) targets.push_back(torch::randn(p.sizes()) * 0.5);
  for (size_t s = 0; s < lrs.size(); ++s) {
    for (size_t i = 0; i < named.size(); ++i) {
      auto& p = named[i].second;
      p.mutable_grad() = (p.detach() - targets[i]) * 0.3 + torch::randn(p.sizes()) * 0.02;
      file.emplace_back(fmt::format("g{}.{}", s, named[i].first), p.grad().clone());
    }
    opt.step(lrs[s]);
  }
  for (const auto& [name, t] : opt.state()) file.emplace_back("state." + name, t.clone());
  for (const auto& [name, p] : named) file.emplace_back("out." + name, p.detach().clone());
}

std::vector<double> varying(double base, bool first_zero = false) {
  std::vector<double> lrs;
  for (int s = 0; s < 20; ++s) lrs.push_back(s == 0 && first_zero ? 0.0 : base * (1.0 + 0.3 * std::sin(s)));
  return lrs;
}

}  // namespace

// transformers' defaults (relative_step, scale_parameter, no first moment), then an explicit
// learning rate with beta1 and weight decay, then warmup_init: parameters and state within
// 1e-6 of transformers.optimization.Adafactor's (tests/reference/adafactor_transformers_ref.py).
TEST_CASE("Adafactor computes what transformers' Adafactor computes, and resumes its step", "[train][optim]") {
  struct Case {
    const char* what;
    train::AdafactorOptions o;
    double lr;
  };
  train::AdafactorOptions explicit_lr;
  explicit_lr.relative_step = false;
  explicit_lr.scale_parameter = false;
  explicit_lr.beta1 = 0.9;
  explicit_lr.weight_decay = 0.01;
  explicit_lr.clip_threshold = 0.5;
  train::AdafactorOptions warmup;
  warmup.warmup_init = true;
  warmup.beta1 = 0.8;
  warmup.weight_decay = 0.1;
  warmup.decay_rate = -0.6;
  for (const auto& c : {Case{"defaults", {}, 0.0}, Case{"explicit lr", explicit_lr, 1e-2}, Case{"warmup_init", warmup, 0.0}}) {
    SECTION(c.what) {
      torch::manual_seed(9);
      NamedTensors file;
      auto named = initial_params(kShapes, file);
      train::Adafactor opt(named, c.o);
      CHECK(std::string(opt.name()) == "Adafactor");
      CHECK(train::Adafactor::factored({8, 4, 3, 3}));
      CHECK_FALSE(train::Adafactor::factored({9}));
      const auto lrs = varying(c.lr > 0 ? c.lr : 1.0);
      run_steps(opt, named, lrs, file);
      nlohmann::json options = {{"eps", c.o.eps},
                                {"clip_threshold", c.o.clip_threshold},
                                {"decay_rate", c.o.decay_rate},
                                {"beta1", c.o.beta1 ? nlohmann::json(*c.o.beta1) : nlohmann::json()},
                                {"weight_decay", c.o.weight_decay},
                                {"scale_parameter", c.o.scale_parameter},
                                {"relative_step", c.o.relative_step},
                                {"warmup_init", c.o.warmup_init}};
      check_with_reference("adafactor_transformers_ref.py", file, {{"lrs", lrs}, {"options", options}});
      const auto o = c.o;
      check_resume(opt, named, 1e-2, [&](const train::NamedParams& p) { return train::Adafactor(p, o); });
    }
  }
}

// prodigyopt's defaults with weight decay, then its other options: beta3, coupled weight
// decay, bias correction, safeguard_warmup, slice_p 3, a growth rate, and lr 0 at the first
// step (prodigyopt then updates nothing): parameters, state and d within 1e-6 of
// prodigyopt.Prodigy's (tests/reference/prodigyopt_ref.py), d grown past d0.
TEST_CASE("Prodigy computes what prodigyopt's Prodigy computes, and resumes its step", "[train][optim]") {
  struct Case {
    const char* what;
    train::ProdigyOptions o;
    bool first_zero;
  };
  train::ProdigyOptions defaults;
  defaults.weight_decay = 0.01;
  train::ProdigyOptions others;
  others.betas = {0.9, 0.99, 0.95};
  others.weight_decay = 0.05;
  others.decouple = false;
  others.use_bias_correction = true;
  others.safeguard_warmup = true;
  others.slice_p = 3;
  others.growth_rate = 1.5;
  others.d_coef = 2.0;
  train::ProdigyOptions no_first;
  no_first.betas = {0.0, 0.999};
  for (const auto& c : {Case{"defaults", defaults, false}, Case{"other options", others, true},
                        Case{"no first moment", no_first, false}}) {
    SECTION(c.what) {
      torch::manual_seed(10);
      NamedTensors file;
      auto named = initial_params(kShapes, file);
      train::Prodigy opt(named, c.o);
      CHECK(std::string(opt.name()) == "Prodigy");
      const auto lrs = varying(1.0, c.first_zero);
      run_steps(opt, named, lrs, file);
      CHECK(opt.d() > c.o.d0);
      nlohmann::json options = {{"betas", {c.o.betas[0], c.o.betas[1]}},
                                {"beta3", c.o.betas.size() == 3 ? nlohmann::json(c.o.betas[2]) : nlohmann::json()},
                                {"eps", c.o.eps},
                                {"weight_decay", c.o.weight_decay},
                                {"decouple", c.o.decouple},
                                {"use_bias_correction", c.o.use_bias_correction},
                                {"safeguard_warmup", c.o.safeguard_warmup},
                                {"d0", c.o.d0},
                                {"d_coef", c.o.d_coef},
                                {"growth_rate", std::isinf(c.o.growth_rate) ? nlohmann::json() : nlohmann::json(c.o.growth_rate)},
                                {"slice_p", c.o.slice_p}};
      check_with_reference("prodigyopt_ref.py", file, {{"lrs", lrs}, {"options", options}});
      const auto o = c.o;
      check_resume(opt, named, 1.0, [&](const train::NamedParams& p) { return train::Prodigy(p, o); });
    }
  }
}

// schedulefree's defaults with weight decay, then its warmup with a polynomial average (r)
// and another weighting power, then other betas and eps, at a varying learning rate (its lr_max
// takes the largest): the training weights y, z and the second moment within 1e-6 of
// schedulefree.AdamWScheduleFree's in train mode, the evaluation weights x within 1e-6 of its
// parameters in eval mode, k and the weight sum equal (tests/reference/schedulefree_ref.py);
// the step resumes to the last bit, and x differs from y.
TEST_CASE("ScheduleFreeAdamW computes what schedulefree's AdamWScheduleFree computes, x included", "[train][optim]") {
  struct Case {
    const char* what;
    train::ScheduleFreeOptions o;
  };
  train::ScheduleFreeOptions defaults;
  defaults.weight_decay = 0.01;
  train::ScheduleFreeOptions warmup;
  warmup.warmup_steps = 7;
  warmup.r = 1.0;
  warmup.weight_lr_power = 1.0;
  train::ScheduleFreeOptions others;
  others.betas = {0.95, 0.99};
  others.eps = 1e-6;
  others.weight_decay = 0.1;
  for (const auto& c : {Case{"defaults", defaults}, Case{"warmup and r", warmup}, Case{"other betas", others}}) {
    SECTION(c.what) {
      torch::manual_seed(11);
      NamedTensors file;
      auto named = initial_params(kShapes, file);
      train::ScheduleFreeAdamW opt(named, c.o);
      CHECK(std::string(opt.name()) == "ScheduleFreeAdamW");
      CHECK(opt.has_eval_weights());
      const auto lrs = varying(0.01);
      run_steps(opt, named, lrs, file);
      const auto x = opt.eval_weights();
      REQUIRE(x.size() == named.size());
      for (const auto& [name, t] : x) file.emplace_back("x." + name, t.clone());
      nlohmann::json options = {{"betas", c.o.betas},
                                {"eps", c.o.eps},
                                {"weight_decay", c.o.weight_decay},
                                {"warmup_steps", c.o.warmup_steps},
                                {"r", c.o.r},
                                {"weight_lr_power", c.o.weight_lr_power}};
      check_with_reference("schedulefree_ref.py", file, {{"lrs", lrs}, {"options", options}});
      const auto o = c.o;
      check_resume(opt, named, 0.01, [&](const train::NamedParams& p) { return train::ScheduleFreeAdamW(p, o); });
    }
  }
}
