// The one error hierarchy. Every error a user can act on derives from sana::Error and
// carries the process exit code it means, so the same problem exits the same way from
// every command and every rank; apps/sana_train.cpp maps exceptions to the exit in one
// place. Library code throws, it never chooses an exit code itself. No torch here.
#pragma once

#include <stdexcept>
#include <string>

#include "sana/util/exit_codes.h"

namespace sana {

class Error : public std::runtime_error {
 public:
  // kind: what the user reads before the message, e.g. "config error", "data error".
  Error(const std::string& what, int exit_code, std::string kind)
      : std::runtime_error(what), exit_code_(exit_code), kind_(std::move(kind)) {}
  int exit_code() const noexcept { return exit_code_; }
  const std::string& kind() const noexcept { return kind_; }

  // What the user reads, every line after `line_prefix` (e.g. "[rank 3] "): "<kind>: <what>".
  // An error that lists several problems (a config) says each on its own line.
  virtual std::string report(const std::string& line_prefix = "") const {
    return line_prefix + kind_ + ": " + what() + "\n";
  }

 private:
  int exit_code_;
  std::string kind_;
};

// Exit 2: the user must change how the program is called or configured (command line,
// config, data description, launch environment, device map, a start-up disagreement).
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what, std::string kind = "usage error")
      : Error(what, kExitUsage, std::move(kind)) {}
};

// Exit 1: the run itself failed (I/O, a corrupt file, non-finite training, a timeout).
class RunError : public Error {
 public:
  explicit RunError(const std::string& what, std::string kind = "error")
      : Error(what, kExitFailure, std::move(kind)) {}
};

// Exit 3: this process stops because another rank failed first (it already said why).
class PeerFailedError : public Error {
 public:
  explicit PeerFailedError(const std::string& what, std::string kind = "stopping because another rank failed")
      : Error(what, kExitPeerFailed, std::move(kind)) {}
};

// The exit code an exception means: an Error's own code, 1 for anything else.
inline int exit_code_of(const std::exception& e) noexcept {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->exit_code();
  return kExitFailure;
}

// What the user reads for an exception: an Error's report, "failed: <what>" for any other.
inline std::string report_of(const std::exception& e, const std::string& line_prefix = "") {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->report(line_prefix);
  return line_prefix + "failed: " + e.what() + "\n";
}

}  // namespace sana
