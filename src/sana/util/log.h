// Process-wide logging: fmt formatting, levels, a rank prefix once distributed, to
// stderr and (once opened) a log file in work_dir. The terminal may take fewer lines
// than the file (set_console_level: ranks other than 0 show only warnings and errors
// while training). Thread-safe. Never includes torch.
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
// Lines below `level` go to the log file only, not to stderr (default: every line).
void set_console_level(Level level);

// Whether `line` is one of ours ("[YYYY-MM-DD hh:mm:ss.mmm ..."): the launcher passes
// such worker lines through as they are and puts "[rank N] " before any other.
bool is_log_line(std::string_view line);

// Only rank 0 shows every line on the terminal, the others warnings and errors
// (log_console: rank0); set_rank then moves that with the rank (a regroup's new rank 0).
void set_console_rank0_only(bool on);

// Lines get an "r<rank>/<world>" prefix when world > 1.
void set_rank(int rank, int world_size);

// Appends every following line to `path` too (creating folders). Returns false and
// sets `error` when the file cannot be opened.
bool open_file(const std::string& path, std::string* error);
void close_file();

// shared: a line every rank writes alike (from the config, the epoch plan, a checkpoint):
// ranks other than 0 treat it as info for the terminal, so it is shown once.
void write(Level level, std::string_view message, bool shared = false);

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
// A warning that every rank reaches alike: every rank's log file has it, the terminal
// shows it once (rank 0's), unless every rank's lines go to the terminal.
template <class... Args>
void warn_shared(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::warn)) write(Level::warn, fmt::format(f, std::forward<Args>(args)...), true);
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::error)) write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace sana::log
