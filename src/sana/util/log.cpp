#include "sana/util/log.h"

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>

namespace sana::log {

namespace {

struct Sink {
  std::mutex mutex;
  std::FILE* file = nullptr;
  std::string prefix;  // "r0/2 " once distributed
  int rank = 0;
};

Sink& sink() {
  static Sink s;
  return s;
}

std::atomic<int> g_level{static_cast<int>(Level::info)};
std::atomic<int> g_console_level{static_cast<int>(Level::debug)};
std::atomic<bool> g_console_rank0_only{false};

const char* level_letter(Level level) {
  switch (level) {
    case Level::debug: return "D";
    case Level::info: return "I";
    case Level::warn: return "W";
    default: return "E";
  }
}

std::string timestamp() {
  using clock = std::chrono::system_clock;
  const auto now = clock::now();
  const std::time_t t = clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:03d}", buf, static_cast<int>(ms));
}

}  // namespace

std::optional<Level> parse_level(std::string_view name) {
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn") return Level::warn;
  if (name == "error") return Level::error;
  return std::nullopt;
}

void set_level(Level level) { g_level = static_cast<int>(level); }

bool enabled(Level level) { return static_cast<int>(level) >= g_level.load(); }

void set_console_level(Level level) { g_console_level = static_cast<int>(level); }

void set_console_rank0_only(bool on) { g_console_rank0_only = on; }

bool is_log_line(std::string_view line) {
  // "[2026-11-25 06:02:50.861 ": the timestamp() format below.
  static constexpr std::string_view shape = "[dddd-dd-dd dd:dd:dd.ddd ";
  if (line.size() < shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const bool digit = line[i] >= '0' && line[i] <= '9';
    if (shape[i] == 'd' ? !digit : line[i] != shape[i]) return false;
  }
  return true;
}

void set_rank(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(sink().mutex);
  sink().prefix = world_size > 1 ? fmt::format("r{}/{} ", rank, world_size) : "";
  sink().rank = rank;
  if (g_console_rank0_only) set_console_level(rank == 0 ? Level::debug : Level::warn);
}

bool open_file(const std::string& path, std::string* error) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    if (error != nullptr) *error = fmt::format("cannot open log file '{}': {}", path, std::strerror(errno));
    return false;
  }
  std::lock_guard<std::mutex> lock(sink().mutex);
  if (sink().file != nullptr) std::fclose(sink().file);
  sink().file = f;
  return true;
}

void close_file() {
  std::lock_guard<std::mutex> lock(sink().mutex);
  if (sink().file != nullptr) std::fclose(sink().file);
  sink().file = nullptr;
}

void write(Level level, std::string_view message, bool shared) {
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string line =
      fmt::format("[{} {}{}] {}\n", timestamp(), s.prefix, level_letter(level), message);
  const Level on_terminal = shared && s.rank > 0 ? Level::info : level;
  if (static_cast<int>(on_terminal) >= g_console_level.load()) std::fputs(line.c_str(), stderr);
  if (s.file != nullptr) {
    std::fputs(line.c_str(), s.file);
    std::fflush(s.file);
  }
}

}  // namespace sana::log
