#include "sana/train/input/class_images.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "sana/data/index_fields.h"
#include "sana/train/previews/sampling.h"
#include "sana/util/error.h"
#include "sana/util/log.h"
#include "sana/util/random.h"

namespace fs = std::filesystem;

namespace sana::train {

namespace {

std::string generated_name(int64_t k) { return fmt::format("generated_{:05d}.png", k); }

// This rank's share of `todo` (every world_size-th), each written as one PNG.
void generate(const ClassImageOptions& o, const std::vector<int64_t>& todo, model::SanaMS& model,
              const Encoders& encoders, dist::Runtime& rt) {
  auto sources = o.sampling;
  sources.validation_prompts = {o.prompt};
  PreviewOptions options = preview_setup(sources, rt.device(), encoders, model->spec());
  options.images = 1;
  const std::vector<PreviewBucket> square{sources.buckets.front()};
  auto last_said = std::chrono::steady_clock::now();
  size_t done = 0;
  for (size_t i = static_cast<size_t>(rt.rank()); i < todo.size(); i += static_cast<size_t>(rt.world_size())) {
    options.seed = util::stream_key("class image", {o.sampling.sampling.seed, static_cast<uint64_t>(todo[i])});
    const auto images = sample_previews(model, square, options).front();
    write_grid_png(images.narrow(0, 0, 1), (fs::path(o.dir) / generated_name(todo[i])).string(), 1);
    ++done;
    const auto now = std::chrono::steady_clock::now();
    if (rt.rank() == 0 && now - last_said > std::chrono::seconds(30)) {
      log::info("data.class_data_dir: rank 0 made {} of its {} class images",
                done, (todo.size() + static_cast<size_t>(rt.world_size()) - 1) / static_cast<size_t>(rt.world_size()));
      last_said = now;
    }
  }
}

}  // namespace

std::vector<int64_t> missing_class_images(const std::string& dir, int64_t count) {
  int64_t others = 0;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const auto name = e.path().filename().string();
      if (e.is_regular_file() && data::fields::is_image_file(e.path()) && name.rfind("generated_", 0) != 0) ++others;
    }
  }
  std::vector<int64_t> missing;
  for (int64_t k = 0; k < count - others; ++k) {
    if (!fs::exists(fs::path(dir) / generated_name(k), ec)) missing.push_back(k);
  }
  return missing;
}

data::Dataset open_class_images(const ClassImageOptions& o, model::SanaMS& model, const Encoders& encoders,
                                dist::Runtime& rt) {
  std::vector<int64_t> todo;
  if (rt.rank() == 0) {
    std::error_code ec;
    fs::create_directories(o.dir, ec);
    if (ec) {
      throw UsageError(fmt::format("data.class_data_dir '{}': cannot create it ({}); name a folder this process "
                                   "can write, or fill it with class images",
                                   o.dir, ec.message()));
    }
    todo = missing_class_images(o.dir, o.count);
  }
  todo = nlohmann::json::parse(rt.broadcast_string(nlohmann::json(todo).dump())).get<std::vector<int64_t>>();
  if (!todo.empty()) {
    log::info("data.class_data_dir: generating {} class images (\"{}\", {} sampler steps, guidance {:g}) with the "
              "model before training, shared over {} process{}",
              todo.size(), o.prompt, o.sampling.sampling.steps, o.sampling.sampling.cfg_scale, rt.world_size(),
              rt.world_size() == 1 ? "" : "es");
    const auto start = std::chrono::steady_clock::now();
    generate(o, todo, model, encoders, rt);
    rt.all_gather("class images made", "done");  // every rank's share written
    log::info("data.class_data_dir: {} class images generated in {:.1f} s", todo.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  auto options = o.dataset;
  options.work = "class index";
  options.dataset.sources = {o.dir};
  options.dataset.filter = {};
  return open_dataset(options, rt);  // collective
}

}  // namespace sana::train
