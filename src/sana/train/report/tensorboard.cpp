#include "sana/train/report/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "sana/util/error.h"
#include "sana/util/log.h"
#include "tensorboard_event.pb.h"

namespace sana::train {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    t[i] = c;
  }
  return t;
}

constexpr auto kCrcTable = crc32c_table();

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  std::string length;
  put_le(length, data.size(), 8);
  out += length;
  put_le(out, masked_crc32c(length.data(), length.size()), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // TensorBoard finds files by "tfevents" in the name and reads them in name order.
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{:010d}.{}.{}.sana", static_cast<int64_t>(wall_time()), host, getpid()))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw RunError(fmt::format("train.report_to tensorboard: cannot create '{}': {}", path_, std::strerror(errno)));
  }
  tensorboard::Event first;
  first.set_wall_time(wall_time());
  first.set_file_version("brain.Event:2");
  write(first.SerializeAsString());
  flush();
}

EventWriter::~EventWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  tensorboard::Event e;
  e.set_wall_time(wall_time());
  e.set_step(step);
  for (const auto& [tag, v] : values) {
    auto* value = e.mutable_summary()->add_value();
    value->set_tag(tag);
    value->set_simple_value(static_cast<float>(v));
  }
  write(e.SerializeAsString());
}

void EventWriter::image(int64_t step, const std::string& tag, const std::string& png, int height, int width) {
  tensorboard::Event e;
  e.set_wall_time(wall_time());
  e.set_step(step);
  auto* value = e.mutable_summary()->add_value();
  value->set_tag(tag);
  auto* img = value->mutable_image();
  img->set_height(height);
  img->set_width(width);
  img->set_colorspace(3);
  img->set_encoded_image_string(png);
  write(e.SerializeAsString());
}

void EventWriter::write(const std::string& event) {
  if (failed_) return;
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    failed_ = true;
    log::warn("train.report_to tensorboard: writing '{}' failed ({}); no more TensorBoard events this run "
              "(metrics.jsonl goes on)",
              path_, std::strerror(errno));
  }
}

void EventWriter::flush() {
  if (!failed_ && std::fflush(file_) != 0) {
    failed_ = true;
    log::warn("train.report_to tensorboard: writing '{}' failed ({}); no more TensorBoard events this run", path_,
              std::strerror(errno));
  }
}

}  // namespace sana::train
