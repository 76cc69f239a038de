// The CUDA-only parts of training on a GPU: the device feed's side-stream copies, the
// allocator peak that memory.json reports, the device name MFU's peak is looked up by.
// Built in every build; ctest runs the [cuda] cases as one entry (torch.cuda,
// tests/unit/cuda_cases.sh), Skipped where no GPU is visible; scripts/gpu_check.sh runs them
// (row cuda-tests) on a GPU machine. Run by hand without a GPU, they fail.
#include "catch.h"

#include <torch/torch.h>

#include <string>
#include <tuple>

#include "sana/diffusion/flow_matching.h"
#include "sana/model/sana_ms.h"
#include "sana/train/loop/cuda_modes.h"
#include "sana/train/step/device_timeline.h"
#include "sana/train/step/device_feed.h"
#include "sana/train/report/device_peak.h"
#include "sana/train/report/memory_use.h"

using sana::train::DeviceFeed;
using sana::train::PeakProbe;

namespace {
constexpr int64_t kMiB = int64_t{1} << 20;

bool no_gpu() {
  if (torch::cuda::is_available()) return false;
  FAIL("no CUDA device: the [cuda] cases need one (ctest skips them)");
  return true;
}
}  // namespace

TEST_CASE("DeviceFeed on CUDA: pinned batches arrive whole, in order, behind a busy stream", "[cuda][train]") {
  if (no_gpu()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  DeviceFeed feed(gpu);
  CHECK(feed.pinned());
  // 128 MiB of distinct values, so a copy read before it finished would show.
  const auto images = feed.host_tensor(torch::arange(int64_t{16} << 20, torch::kInt64));
  const auto labels = feed.host_tensor(torch::arange(32, torch::kInt64) * 7);
  CHECK(images.is_pinned());
  CHECK(labels.is_pinned());
  // The compute stream is kept busy, so the side stream's copy runs beside it.
  auto busy = torch::randn({4096, 4096}, torch::device(gpu)) / 64;
  for (int i = 0; i < 20; ++i) busy = busy.mm(busy).tanh();
  const auto out = feed.to_device({images, torch::Tensor(), labels});
  REQUIRE(out.size() == 3);
  CHECK(out[0].device() == gpu);
  CHECK_FALSE(out[1].defined());
  // Read on the compute stream (the current one): it waited for the copy, not the host.
  CHECK(out[0].sum().item<int64_t>() == images.sum().item<int64_t>());
  CHECK(torch::equal(out[0].cpu(), images));
  CHECK(torch::equal(out[2].cpu(), labels));
}

TEST_CASE("PeakProbe on CUDA: a region's growth is the allocator's peak above its start", "[cuda][train]") {
  if (no_gpu()) return;
  const torch::Device gpu(torch::kCUDA, 0);
  const auto before = torch::empty({32 * kMiB / 4}, torch::device(gpu));  // held: not growth
  PeakProbe probe(gpu);
  probe.begin();
  {
    const auto a = torch::empty({64 * kMiB / 4}, torch::device(gpu));
    const auto b = torch::empty({16 * kMiB / 4}, torch::device(gpu));
  }  // both freed: the peak remembers 80 MiB above the start
  const auto c = torch::empty({8 * kMiB / 4}, torch::device(gpu));
  probe.end();
  CHECK(probe.growth() == 80 * kMiB);
  CHECK(std::string(probe.source()) == "cuda allocator peak");
}

TEST_CASE("cuda_device_name names the GPU MFU's peak is looked up by", "[cuda][train]") {
  if (no_gpu()) return;
  const std::string name = sana::train::cuda_device_name(0);
  INFO(name);
  CHECK_FALSE(name.empty());
  // The GPUs this project borrows (H100, H200) have a known dense bf16 peak.
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) {
    CHECK(sana::train::peak_tflops_for(name, true) > 700);
  }
}

TEST_CASE("train.cudnn_benchmark and train.cuda_sync_debug set cuDNN's and c10::cuda's modes", "[cuda][train]") {
  if (no_gpu()) return;
  const auto before = sana::train::current_cuda_modes();
  sana::train::apply_cuda_modes({true, "error"});
  CHECK(sana::train::current_cuda_modes().cudnn_benchmark);
  CHECK(sana::train::current_cuda_modes().sync_debug == "error");
  // A read of a device value waits for the device: the error mode says so.
  const auto x = torch::ones({4}, torch::device(torch::kCUDA));
  CHECK_THROWS(x.sum().item<float>());
  sana::train::apply_cuda_modes({false, "off"});
  CHECK_FALSE(sana::train::current_cuda_modes().cudnn_benchmark);
  CHECK(x.sum().item<float>() == 4.0F);
  sana::train::apply_cuda_modes(before);
}

TEST_CASE("a flow batch reaches the GPU without a host wait, equal to the CPU's", "[cuda][train]") {
  if (no_gpu()) return;
  // Before: five pageable copies per micro-batch, each a wait (the sync-debug mode's error
  // here). Now pinned, non-blocking: the same numbers, and no error.
  const auto x0 = torch::randn({3, 4, 8, 8});
  const auto cpu = sana::diffusion::make_flow_batch(x0, {7, 8, 9}, 5, 0, sana::diffusion::TimestepOptions{}, 0.5);
  const auto on_gpu = x0.to(torch::kCUDA);
  torch::cuda::synchronize();
  const auto before = sana::train::current_cuda_modes();
  sana::train::apply_cuda_modes({before.cudnn_benchmark, "error"});
  sana::diffusion::FlowBatch gpu;
  CHECK_NOTHROW(gpu = sana::diffusion::make_flow_batch(on_gpu, {7, 8, 9}, 5, 0, sana::diffusion::TimestepOptions{},
                                                      0.5));
  // The timestep embedding's frequencies are made on the device too.
  torch::Tensor features;
  CHECK_NOTHROW(features = sana::model::timestep_features(gpu.timesteps));
  sana::train::apply_cuda_modes(before);
  for (const auto& [name, a, b] : {std::tuple{"noisy", cpu.noisy, gpu.noisy}, std::tuple{"target", cpu.target, gpu.target},
                                   std::tuple{"sigmas", cpu.sigmas, gpu.sigmas},
                                   std::tuple{"timesteps", cpu.timesteps, gpu.timesteps},
                                   std::tuple{"dropped", cpu.dropped, gpu.dropped}}) {
    INFO(name);
    CHECK(b.is_cuda());
    CHECK(torch::equal(a, b.cpu()));
  }
  // exp on the device against the host's: the last bit may differ.
  CHECK(torch::allclose(features.cpu(), sana::model::timestep_features(cpu.timesteps), 0.0, 1e-5));
}

TEST_CASE("The device timeline's CUDA events time the GPU's work, not the host's launches", "[cuda][train]") {
  if (no_gpu()) return;
  using sana::train::StepTimes;
  const auto a = torch::randn({4096, 4096}, torch::kCUDA);
  torch::cuda::synchronize();
  sana::train::DeviceTimeline timeline(sana::train::DeviceTimeline::cuda_events());
  StepTimes host;
  const auto start = std::chrono::steady_clock::now();
  {
    const sana::train::DeviceTimeline::Active active(timeline);
    {
      sana::train::PhaseTimer compute(host, &StepTimes::forward_backward);
      auto x = a;
      for (int i = 0; i < 40; ++i) x = torch::mm(x, a).mul_(1e-3);  // queued: the host returns at once
    }
    { sana::train::PhaseTimer update(host, &StepTimes::optimizer); }
    timeline.end_step(1);
  }
  torch::cuda::synchronize();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto done = timeline.take_finished();
  REQUIRE(done.size() == 1);
  const auto& d = done[0].times;
  // 40 products of 4096^3 (5.5 TFLOP): milliseconds on any GPU, far more than the launches.
  CHECK(d.forward_backward > 2 * host.forward_backward);
  CHECK(d.forward_backward <= wall);
  CHECK(d.optimizer < 0.1 * d.forward_backward);
  CHECK(d.total == Approx(d.forward_backward + d.optimizer + d.other()));
}
