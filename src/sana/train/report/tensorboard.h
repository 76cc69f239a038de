// TensorBoard event files (train.report_to: tensorboard): what TensorBoard reads from a
// run folder, written without TensorFlow. A file is a sequence of TFRecords (the length,
// its masked CRC-32C, the data, its masked CRC-32C), each an Event message of our own
// tensorboard_event.proto (TensorFlow's field numbers): first the file version, then
// summaries of scalars and PNG images. Rank 0 writes work_dir/tensorboard/
// events.out.tfevents.<seconds>.<host>.<pid>.sana; write errors are said once and end the
// writing, never the training. No torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace sana::train {

// CRC-32C (Castagnoli), continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's masked form of it.
uint32_t masked_crc32c(const void* data, size_t size);
// `data` framed as one TFRecord.
std::string tfrecord(const std::string& data);

class EventWriter {
 public:
  // Creates `dir` and a new event file in it; throws RunError when it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One event with every (tag, value) at `step`.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // One event with a PNG image (its bytes, as a file holds them) at `step`.
  void image(int64_t step, const std::string& tag, const std::string& png, int height, int width);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
  bool failed_ = false;
};

}  // namespace sana::train
