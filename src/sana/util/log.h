// Process-wide logging: fmt formatting, levels, a rank prefix once distributed, to
// stderr and (once opened) a log file in work_dir. Thread-safe. Never includes torch.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>

namespace sana::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

std::optional<Level> parse_level(std::string_view name);
void set_level(Level level);
bool enabled(Level level);

// Lines get an "r<rank>/<world>" prefix when world > 1.
void set_rank(int rank, int world_size);

// Appends every following line to `path` too (creating folders). Returns false and
// sets `error` when the file cannot be opened.
bool open_file(const std::string& path, std::string* error);
void close_file();

void write(Level level, std::string_view message);

template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::debug)) write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::info)) write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::warn)) write(Level::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::error)) write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace sana::log
