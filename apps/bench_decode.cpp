// Benchmark: decode + bucket transform of real photos on one core. Ours (reduced JPEG
// decoding, resize to cover, center-crop, RGB, float CHW in [-1, 1]) against a plain
// full-resolution OpenCV decode of the same files. scripts/bench/decode.sh runs it next to
// the torchvision pipeline.
// Prints the rates for all files and per format (JPEG, PNG).
//   bench_decode DIR [ROUNDS=3] [BASE=512]   (a BASE without an upstream table: a generated
//                                              one, bucket step 8)
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <map>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <vector>

#include "sana/data/buckets.h"
#include "sana/data/decode.h"
#include "sana/data/image_header.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_decode DIR [ROUNDS=3] [BASE=512]\n");
    return 2;
  }
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const int base = argc > 3 ? std::atoi(argv[3]) : 512;
  cv::setNumThreads(1);
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(argv[1])) {
    const auto ext = e.path().extension().string();
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  const auto table = [&] {
    try {
      return sana::data::BucketTable::upstream(fmt::format("ASPECT_RATIO_{}", base));
    } catch (const std::invalid_argument&) {
      return sana::data::BucketTable::generated(base, 8);
    }
  }();
  std::vector<sana::data::ImageSize> sizes;
  for (const auto& f : files) sizes.push_back(sana::data::read_image_size(f));

  using Clock = std::chrono::steady_clock;
  std::vector<float> chw;
  // Seconds and images per format: ours, the plain decode, images, ours with
  // data.jpeg_reduced_decode.
  std::map<std::string, std::array<double, 4>> by_format;
  sana::data::DecodeOptions reduced;
  reduced.reduced_decode = true;
  int64_t pixels = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < files.size(); ++i) {
      const auto& b = table.buckets()[static_cast<size_t>(table.closest(sizes[i].height, sizes[i].width))];
      auto t0 = Clock::now();
      const auto d = sana::data::decode_to_bucket(files[i], b.height, b.width, false, {},
                                                  sizes[i].width, sizes[i].height);
      chw.resize(static_cast<size_t>(3 * b.height * b.width));
      sana::data::to_chw_normalized(d.rgb, chw.data());
      const double ours = std::chrono::duration<double>(Clock::now() - t0).count();
      t0 = Clock::now();
      const auto r = sana::data::decode_to_bucket(files[i], b.height, b.width, false, reduced, sizes[i].width,
                                                  sizes[i].height);
      sana::data::to_chw_normalized(r.rgb, chw.data());
      const double ours_reduced = std::chrono::duration<double>(Clock::now() - t0).count();
      t0 = Clock::now();
      pixels += cv::imread(files[i], cv::IMREAD_COLOR).total();
      const double plain = std::chrono::duration<double>(Clock::now() - t0).count();
      const std::string ext = std::filesystem::path(files[i]).extension() == ".png" ? "PNG" : "JPEG";
      for (const std::string& key : {std::string("all"), ext}) {
        auto& [o, p, n, q] = by_format[key];
        o += ours;
        p += plain;
        n += 1;
        q += ours_reduced;
      }
    }
  }
  fmt::print("{} files x {} rounds, {}-pixel buckets, 1 thread\n", files.size(), rounds, base);
  const auto& [ours, plain, n, ours_reduced] = by_format["all"];
  fmt::print("sana-train decode+bucket transform: {:7.1f} images/s (whole JPEGs, PIL's filter: the default)\n",
             n / ours);
  fmt::print("  with data.jpeg_reduced_decode:   {:7.1f} images/s\n", n / ours_reduced);
  fmt::print("plain OpenCV full-resolution decode: {:7.1f} images/s ({:.1f} Mpixel/image)\n",
             n / plain, static_cast<double>(pixels) / n / 1e6);
  for (const auto& [format, t] : by_format) {
    if (format != "all") {
      fmt::print("  {:4} {:3.0f} images: ours {:7.1f} images/s (reduced {:7.1f}), plain {:7.1f}\n", format,
                 t[2] / rounds, t[2] / t[0], t[2] / t[3], t[2] / t[1]);
    }
  }
  return 0;
}
