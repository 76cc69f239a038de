// Preview sampling and model weights on disk: the samplers solve the flow ODE (exactly
// for a single data point, DPM-Solver++ closer than Euler at equal steps), previews are
// deterministic PNG grids, weights round-trip through safetensors and a Python
// torch.save'd state dict, and strict loading names what does not fit.
#include "catch.h"
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>

#include "sana/train/previews/sampling.h"
#include "sana/diffusion/sampler.h"
#include "sana/model/sana_ms.h"
#include "sana/model/encoders.h"
#include "sana/model/weights.h"
#include "model_specs.h"
#include "test_support.h"

using namespace sana;

namespace {

model::ModelSpec preview_spec(model::Conditioning cond) {
  auto s = sana::test::small_spec(cond);
  s.num_classes = 3;
  s.caption_channels = 8;
  s.caption_tokens = 4;
  return s;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("flow samplers land on the data", "[sampling]") {
  // Data = one point c: the exact velocity is (x - c) / sigma, and both samplers end on c.
  const auto c = torch::tensor({0.3, -1.2, 2.0}, torch::kFloat64);
  const diffusion::Velocity to_point = [&](const torch::Tensor& x, double sigma) { return (x - c) / sigma; };
  const auto noise = torch::tensor({1.0, -0.5, 0.25}, torch::kFloat64);
  for (const char* sampler : {"flow_euler", "flow_dpm-solver"}) {
    for (double shift : {1.0, 3.0}) {
      INFO(sampler << " shift " << shift);
      CHECK(torch::allclose(diffusion::sample_flow(to_point, noise, 7, shift, sampler), c, 0, 1e-9));
    }
  }
  // Data ~ N(mu, s^2): the flow maps noise z to mu + s z. The exact velocity is
  // (x - E[x0 | x]) / sigma with E[x0 | x] = mu + (1-sigma) s^2 (x - (1-sigma) mu) / ((1-sigma)^2 s^2 + sigma^2).
  const double mu = 0.5, s = 0.2;
  const diffusion::Velocity gauss = [&](const torch::Tensor& x, double sigma) {
    const double a = 1 - sigma;
    const auto x0 = mu + a * s * s * (x - a * mu) / (a * a * s * s + sigma * sigma);
    return (x - x0) / sigma;
  };
  const auto z = torch::linspace(-2, 2, 9, torch::kFloat64);
  auto err = [&](const char* sampler, int steps) {
    // The flow is linear: from x at sigma0 it ends at mu + s (x - (1-sigma0) mu) / sqrt((1-sigma0)^2 s^2 + sigma0^2).
    const double s0 = diffusion::sigma_schedule(steps, 1.0, sampler).front(), a0 = 1 - s0;
    const auto exact = mu + s * (z - a0 * mu) / std::sqrt(a0 * a0 * s * s + s0 * s0);
    return (diffusion::sample_flow(gauss, z, steps, 1.0, sampler) - exact).abs().max().item<double>();
  };
  // Euler is first order (4x the steps: about 1/4 the error), DPM-Solver++(2M) second
  // order (about 1/16), and closer at equal steps.
  const double euler10 = err("flow_euler", 10), euler40 = err("flow_euler", 40);
  const double dpm10 = err("flow_dpm-solver", 10), dpm40 = err("flow_dpm-solver", 40);
  INFO("Euler 10/40 steps " << euler10 << " / " << euler40 << ", DPM-Solver++ " << dpm10 << " / " << dpm40);
  CHECK(dpm10 < euler10);
  CHECK(euler10 / euler40 > 2.5);
  CHECK(euler10 / euler40 < 6);
  CHECK(dpm10 / dpm40 > 8);
  CHECK(dpm40 < euler40 / 3);
  CHECK_THROWS_WITH(diffusion::sample_flow(gauss, z, 4, 1.0, "ddpm"), Catch::Contains("flow_euler"));
}

TEST_CASE("samplers visit upstream's noise levels in upstream's orders", "[sampling]") {
  auto shift3 = [](double t) { return 3 * t / (1 + 2 * t); };
  // DPM-Solver (upstream's time_uniform_flow): shift(linspace(0.999, 0, N + 1)), from shift(0.999).
  const auto dpm = diffusion::sigma_schedule(20, 3.0, "flow_dpm-solver");
  REQUIRE(dpm.size() == 21);
  CHECK(dpm.front() == Approx(0.999667).epsilon(1e-6));
  CHECK(dpm[10] == Approx(shift3(0.4995)));
  CHECK(dpm.back() == 0.0);
  // Euler (diffusers): shift(linspace(1, shift(0.001), N)), then 0: the last level shifted twice.
  const auto euler = diffusion::sigma_schedule(28, 3.0, "flow_euler");
  REQUIRE(euler.size() == 29);
  CHECK(euler.front() == 1.0);
  CHECK(euler[27] == Approx(0.008929).epsilon(1e-4));
  CHECK(euler.back() == 0.0);
  CHECK_THROWS_WITH(diffusion::sigma_schedule(4, 1.0, "ddpm"), Catch::Contains("flow_dpm-solver"));

  // Orders: a velocity whose data prediction changes with sigma, three DPM steps by hand.
  // Step 1 is first order (DDIM), step 2 second order with r = h_prev / h, step 3 lands on x0.
  const diffusion::Velocity v = [](const torch::Tensor& x, double sigma) { return x * (1 + sigma); };
  const auto x_T = torch::tensor({0.7, -1.1}, torch::kFloat64);
  const auto sig = diffusion::sigma_schedule(3, 3.0, "flow_dpm-solver");
  auto lambda = [](double s) { return std::log((1 - s) / s); };
  auto x0_at = [&](const torch::Tensor& x, double s) { return x - s * v(x, s); };
  const auto m0 = x0_at(x_T, sig[0]);
  const double h1 = lambda(sig[1]) - lambda(sig[0]), h2 = lambda(sig[2]) - lambda(sig[1]);
  const auto x1 = sig[1] / sig[0] * x_T - (1 - sig[1]) * std::expm1(-h1) * m0;
  const auto m1 = x0_at(x1, sig[1]);
  const auto d = m1 + 0.5 * (h2 / h1) * (m1 - m0);
  const auto x2 = sig[2] / sig[1] * x1 - (1 - sig[2]) * std::expm1(-h2) * d;
  const auto expected = x0_at(x2, sig[2]);
  CHECK(torch::allclose(diffusion::sample_flow(v, x_T, 3, 3.0, "flow_dpm-solver"), expected, 0, 1e-12));
}

TEST_CASE("SANA-Sprint's sampler: upstream's times, and a perfect student gives the data", "[sampling][sprint]") {
  CHECK(diffusion::scm_times(1) == std::vector<double>{1.5708f, 0.0});
  CHECK(diffusion::scm_times(2, 1.5708, 1.3) == std::vector<double>{1.5708, 1.3, 0.0});
  const auto four = diffusion::scm_times(4);
  REQUIRE(four.size() == 5);
  CHECK(four[2] == Approx(0.7854).epsilon(1e-6));
  // A student whose x0 prediction is always the data point: F = (cos s x - x0) / (sin s sigma_d).
  torch::manual_seed(4);
  const double sd = 0.5;
  const auto data = torch::randn({2, 3, 4, 4}, torch::kFloat64) * sd;
  const auto perfect = [&](const torch::Tensor& x_hat, double s) {
    return (std::cos(s) * x_hat * sd - data) / (std::sin(s) * sd);
  };
  const auto noise = torch::randn_like(data);
  std::vector<torch::Tensor> fresh;
  for (int i = 0; i < 4; ++i) fresh.push_back(torch::randn_like(data));
  for (int steps : {1, 2, 4}) {
    const auto x0 = diffusion::sample_scm(perfect, noise, fresh, diffusion::scm_times(steps, 1.5708, 1.0), sd);
    CHECK(torch::allclose(x0, data / sd, 1e-9, 1e-9));
  }
  // A student that predicts zero data instead: the output follows the prediction, not the noise.
  const auto blind = [&](const torch::Tensor& x_hat, double s) { return std::cos(s) * x_hat / std::sin(s); };
  CHECK(diffusion::sample_scm(blind, noise, fresh, diffusion::scm_times(2), sd).abs().max().item<double>() < 1e-9);
}

TEST_CASE("a SANA-Sprint student previews in its few steps, guided by its embedding", "[sampling][preview][sprint]") {
  auto spec = preview_spec(model::Conditioning::caption);
  spec.trigflow = spec.cfg_embed = spec.logvar = true;
  spec.cfg_embed_scale = 0.1;
  spec.timestep_norm_scale = 1000;
  model::SanaMS net(spec, model::BuildOptions{torch::kFloat32, false, 5});
  train::PreviewOptions o;
  o.images = 2;
  o.caption_features = torch::randn({2, spec.caption_tokens, spec.caption_channels});
  int calls = 0;
  o.on_step = [&] { ++calls; };
  const std::vector<train::PreviewBucket> buckets = {{16, 16}};
  for (int steps : {1, 2, 4}) {
    o.steps = steps;
    calls = 0;
    const auto grids = train::sample_previews(net, buckets, o);
    CHECK(calls == steps);  // one evaluation a step, no doubled batch for guidance
    CHECK(grids.front().sizes() == torch::IntArrayRef{2, 3, 16, 16});
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->cfg_embedder->parameters()) p.add_(0.1);  // its last layer starts at zero
  }
  o.steps = 2;
  const auto a = train::sample_previews(net, buckets, o).front(), b = train::sample_previews(net, buckets, o).front();
  CHECK(torch::equal(a, b));
  o.cfg_scale = 2.0;  // another guidance scale reaches the model through cfg_embedder
  CHECK_FALSE(torch::equal(train::sample_previews(net, buckets, o).front(), a));
}

TEST_CASE("previews are deterministic PNG grids, one per bucket", "[sampling][preview]") {
  sana::test::TempDir dir;
  for (auto cond : {model::Conditioning::class_label, model::Conditioning::none}) {
    model::SanaMS net(preview_spec(cond), model::BuildOptions{torch::kFloat32, false, 3});
    train::PreviewOptions o;
    o.steps = 3;
    o.images = 3;
    o.seed = 9;
    const std::vector<train::PreviewBucket> buckets = {{16, 16}, {32, 8}};
    net->train();
    const auto a = train::render_previews(net, buckets, o, dir.path("a"), "p");
    CHECK(net->is_training());  // sampling does not leave the model in eval mode
    const auto b = train::render_previews(net, buckets, o, dir.path("b"), "p");
    o.seed = 10;
    const auto c = train::render_previews(net, buckets, o, dir.path("c"), "p");
    REQUIRE(a.size() == 2);
    CHECK(std::filesystem::path(a[1]).filename() == "p_32x8.png");
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(file_bytes(a[i]) == file_bytes(b[i]));
      CHECK(file_bytes(a[i]) != file_bytes(c[i]));
    }
    // 3 images: a 2 x 2 grid with 2-pixel gaps.
    const auto img = cv::imread(a[1]);
    CHECK(img.rows == 2 * 32 + 2);
    CHECK(img.cols == 2 * 8 + 2);
  }
}

TEST_CASE("weights round-trip through safetensors and torch.save, strict loads name misfits", "[weights]") {
  sana::test::TempDir dir;
  const auto spec = preview_spec(model::Conditioning::caption);
  model::SanaMS a(spec, model::BuildOptions{torch::kFloat32, false, 1});
  model::SanaMS b(spec, model::BuildOptions{torch::kFloat32, false, 2});
  const auto path = dir.path("w.safetensors");
  model::save_weights(*a, path);
  auto report = model::load_weights(*b, path);
  CHECK(report.clean());
  const auto pa = a->named_parameters();
  for (const auto& p : b->named_parameters()) CHECK(torch::equal(p.value(), pa[p.key()]));
  CHECK(torch::equal(a->named_buffers()["y_embedder.y_embedding"], b->named_buffers()["y_embedder.y_embedding"]));

  // A Python training checkpoint: {"state_dict": {"module.<name>": tensor}, "step": 7}.
  const auto pt = dir.path("w.pt");
  const auto r = sana::test::run_command(SANA_PYTHON " " + std::string(SANA_SOURCE_DIR) +
                                         "/tests/reference/resave_with_torch.py " + path + " " + pt);
  REQUIRE(r.exit_code == 0);
  model::SanaMS c(spec, model::BuildOptions{torch::kFloat32, false, 3});
  CHECK(model::load_weights(*c, pt).clean());
  for (const auto& p : c->named_parameters()) CHECK(torch::equal(p.value(), pa[p.key()]));

  // As upstream's save_checkpoint writes it (python3-torch): state_dict with the persistent
  // pos_embed buffer, state_dict_ema, optimizer, epoch, step. A strict load takes it, names
  // pos_embed as ignored (this model has no absolute position embedding), and no misfit.
  const auto up = dir.path("upstream.pth");
  const auto ru = sana::test::run_command(SANA_PYTHON " " + std::string(SANA_SOURCE_DIR) +
                                          "/tests/reference/resave_with_torch.py --upstream " + path + " " + up);
  REQUIRE(ru.exit_code == 0);
  model::SanaMS u(spec, model::BuildOptions{torch::kFloat32, false, 5});
  const auto upstream_report = model::load_weights(*u, up);
  CHECK(upstream_report.clean());
  CHECK(upstream_report.ignored == std::vector<std::string>{"pos_embed"});
  for (const auto& p : u->named_parameters()) CHECK(torch::equal(p.value(), pa[p.key()]));

  // Another shape: strict names every misfit and changes nothing; non-strict takes what fits.
  auto deeper = spec;
  deeper.depth = 3;
  deeper.hidden = 64;
  deeper.caption_channels = 16;
  model::SanaMS d(deeper, model::BuildOptions{torch::kFloat32, false, 4});
  const auto before = d->named_parameters()["blocks.0.attn.qkv.weight"].clone();
  try {
    model::load_weights(*d, path);
    FAIL("strict load of a misfit succeeded");
  } catch (const model::WeightsError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("missing from the file") && Catch::Contains("blocks.2.") &&
                         Catch::Contains("y_embedder.y_proj.fc1.weight (file 64x8, model 64x16)"));
  }
  CHECK(torch::equal(d->named_parameters()["blocks.0.attn.qkv.weight"], before));
  report = model::load_weights(*d, path, /*strict=*/false);
  CHECK_FALSE(report.clean());
  CHECK(report.loaded > 10);
  CHECK(torch::equal(d->named_parameters()["blocks.0.attn.qkv.weight"], pa["blocks.0.attn.qkv.weight"]));
  CHECK_THROWS_AS(model::load_weights(*d, dir.write("junk.pt", "not a pickle")), model::WeightsError);
}

TEST_CASE("TorchScript encoders load, are checked against the config, and drive previews", "[encoders]") {
  const auto& fx = sana::test::reference_fixtures("make_torchscript_encoders.py");
  model::VaeOptions vc;
  vc.vae_pretrained = fx.path("vae.pt");
  vc.vae_latent_dim = 4;
  vc.vae_downsample_rate = 4;
  vc.scale_factor = 0.5;
  auto vae = model::FrozenVae::load(vc, torch::kCPU);
  const auto images = torch::rand({2, 3, 16, 24}) * 2 - 1;
  const auto z = vae.encode(images);
  CHECK(z.sizes() == torch::IntArrayRef({2, 4, 4, 6}));
  CHECK_FALSE(z.requires_grad());
  REQUIRE(vae.can_decode());
  CHECK(vae.decode(z).sizes() == images.sizes());
  // vae.tile_size: tiles of 8 px overlapping by 4, or 12 by 4 (the last tile of a row
  // moved back to the edge); this VAE's latent cell sees only its own 4 x 4 pixels, so the
  // blended tiles give the whole image's latents.
  for (const auto& [tile, overlap] : std::vector<std::pair<int64_t, int64_t>>{{8, 4}, {12, 4}}) {
    auto tiled = vc;
    tiled.tile_size = tile;
    tiled.tile_overlap = overlap;
    const auto zt = model::FrozenVae::load(tiled, torch::kCPU).encode(images);
    INFO("tiles of " << tile << " px, overlap " << overlap);
    CHECK(zt.sizes() == z.sizes());
    CHECK(((zt - z).abs().mean() / z.abs().mean()).item<double>() < 1e-6);
  }
  auto wrong = vc;
  wrong.vae_pretrained = fx.path("vae_wrong.pt");
  CHECK_THROWS_WITH(model::FrozenVae::load(wrong, torch::kCPU),
                    Catch::Contains("vae.vae_latent_dim 4") && Catch::Contains("[1, 3, 16, 16]"));
  wrong.vae_pretrained = fx.path("text.pt");
  CHECK_THROWS_WITH(model::FrozenVae::load(wrong, torch::kCPU), Catch::Contains("no method encode"));
  // An export carrying its own factor (as DC-AE's cfg.scaling_factor, which upstream uses)
  // must agree with vae.scale_factor; then its latents are scaled by it.
  auto scaled = vc;
  scaled.vae_pretrained = fx.path("vae_scaled.pt");
  CHECK_THROWS_WITH(model::FrozenVae::load(scaled, torch::kCPU),
                    Catch::Contains("vae.scale_factor is 0.5") && Catch::Contains("own scaling_factor 0.3") &&
                        Catch::Contains("set vae.scale_factor: 0.3"));
  scaled.scale_factor = 0.3;
  auto own = model::FrozenVae::load(scaled, torch::kCPU);
  CHECK(torch::allclose(own.encode(images), z * (0.3 / 0.5)));

  model::TextEncoderOptions tc;
  tc.text_encoder_name = "torchscript";
  tc.text_encoder_path = fx.path("text.pt");
  tc.caption_channels = 8;
  tc.model_max_length = 6;
  auto text = model::FrozenTextEncoder::load(tc, torch::kCPU);
  const auto [features, mask] = text.encode({"ab", "a longer one"});
  CHECK(features.sizes() == torch::IntArrayRef({2, 6, 8}));
  CHECK(mask.sum(1).equal(torch::tensor({2, 6}, torch::kInt64)));
  tc.caption_channels = 16;
  CHECK_THROWS_WITH(model::FrozenTextEncoder::load(tc, torch::kCPU),
                    Catch::Contains("text_encoder.caption_channels 16"));
  tc.text_encoder_path = fx.write("garbage.pt", "nope");
  CHECK_THROWS_WITH(model::FrozenTextEncoder::load(tc, torch::kCPU), Catch::Contains("cannot load"));

  // A latent, caption-conditioned config: previews encode the prompts and decode to pixels.
  sana::test::TempDir dir;
  const auto cfg = dir.write("latent.yaml", "work_dir: " + dir.path("run") + R"(
data: {data_dir: [.], image_size: 32, aspect_ratio_type: generated, bucket_step: 8}
model: {model: SanaMS_tiny_P2_D4, image_size: 32}
vae: {vae_type: torchscript, vae_pretrained: )" + fx.path("vae.pt") + R"(, vae_latent_dim: 4, vae_downsample_rate: 4}
text_encoder: {text_encoder_name: torchscript, text_encoder_path: )" + fx.path("text.pt") + R"(, caption_channels: 8, model_max_length: 6}
train: {validation_prompts: [a red sky, two birds], preview_steps: 3, preview_images: 2, global_batch_size: 8, micro_batch_size: 4}
)");
  const auto r = sana::test::run_command(std::string(SANA_TRAIN_BIN) + " preview --config " + cfg);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto grid = cv::imread(dir.path("run/previews/preview_64x16.png"));
  CHECK(grid.rows == 64);  // two pixel-space images side by side, decoded from 16x4 latents
  CHECK(grid.cols == 2 * 16 + 2);
}
