// sana-train: the command line. Reads as the table of contents of a run:
// command line -> launch environment -> config (validated before anything else) ->
// logging -> the command (apps/commands/: one file each).
// Every failure is an exception; main maps it to the message and the exit code in one
// place (sana/util/error.h): 0 done, 1 the run failed, 2 usage/config/data/launch/device
// error, 3 stopped because another rank failed.
#include <CLI/CLI.hpp>
#include <c10/util/Logging.h>
#include <fmt/format.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>

#include "commands/command.h"
#include "sana/config/schema.h"
#include "sana/distributed/flight_recorder.h"
#include "sana/distributed/launcher.h"
#include "sana/distributed/launcher_link.h"
#include "sana/train/options/config_checks.h"
#include "sana/util/error.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace {

using namespace sana;

// The usual arguments of a subcommand, for the help's command list (`--help` after the
// subcommand lists them all). A subcommand missing here is listed with its description alone.
const std::map<std::string, std::string>& synopses() {
  static const std::map<std::string, std::string> s = {
      {"launch", "--nproc-per-node N -- ARGS..."},
      {"check-dist", "[--seconds S] [--dist.KEY=VALUE]..."},
      {"index", "--input SRC... --output FILE"},
      {"plan", "--config FILE [--world-size W --rank R --epoch E --json]"},
      {"check-data", "--config FILE [--limit N] [--fill-cache]"},
      {"model", "--config FILE [--json] [--device-memory GIB]"},
      {"preview", "--config FILE [--weights F] [--out DIR]"},
      {"export", "--config FILE --from F --out DIR [--format diffusers|upstream] [--merge-lora]"},
      {"prepare-features", "--config FILE [--out DIR] [--batch-size N]"},
      {"inspect", "CHECKPOINT|WORK_DIR"},
      {"report", "WORK_DIR"},
  };
  return s;
}

// The help's footer: every command (the top level's and each subcommand `cli` has), the
// most used keys, examples.
std::string help_footer(const CLI::App& cli) {
  config::Config defaults;
  std::string out =
      "\nCommands:\n"
      "  sana-train --config FILE [--key.path=VALUE | --key.path VALUE]...   train\n"
      "  sana-train --config FILE --print-config    print the resolved config as YAML\n"
      "  sana-train --list-keys                     every config key with type and default\n";
  for (const CLI::App* sub : cli.get_subcommands([](const CLI::App*) { return true; })) {
    const auto synopsis = synopses().find(sub->get_name());
    out += fmt::format("  sana-train {}{}   {}\n", sub->get_name(),
                       synopsis == synopses().end() ? "" : " " + synopsis->second, sub->get_description());
  }
  out += "\nMost used keys (override any key of the YAML the same way):\n";
  for (const auto& f : config::fields_of(defaults)) {
    if (!f.common) continue;
    out += fmt::format("  --{:<34} {} (default {})\n", f.key, f.help, config::value_text(f.ref));
  }
  out +=
      "\nExamples:\n"
      "  sana-train --config configs/sana_tiny_cpu.yaml --train.max_steps=20\n"
      "  sana-train --config configs/Sana_600M_img512.yaml --train.optimizer.lr 2e-5 "
      "--resume_from=latest\n"
      "  sana-train launch --nproc-per-node 2 -- check-dist --dist.timeout_s=30\n";
  return out;
}

// The launcher's own arguments end at "--"; what follows is the worker's command line.
std::vector<std::string> split_at_double_dash(int& argc, char** argv) {
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") != 0) continue;
    for (int j = i + 1; j < argc; ++j) rest.emplace_back(argv[j]);
    argc = i;
    break;
  }
  return rest;
}

std::string self_executable(const char* argv0) {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

// Every command, registered on the command line. The configured ones are tried in order:
// training, the top level, comes last.
struct Commands {
  app::TopLevelOptions top;
  app::LaunchArgs launch;
  // The tests' fault injection (test_hooks.h), read here once and passed to what uses it.
  const train::TestHooks hooks = train::TestHooks::from_environment();
  std::vector<std::unique_ptr<app::PlainCommand>> plain;
  std::vector<std::unique_ptr<app::ConfigCommand>> configured;

  Commands(CLI::App& app, int& argc, char** argv) {
    launch = {split_at_double_dash(argc, argv), self_executable(argv[0])};
    app::add_top_level_options(app, top);
    plain.push_back(app::list_keys_command(top));
    plain.push_back(app::launch_command(app, launch, hooks));
    configured.push_back(app::check_dist_command(app, hooks));
    plain.push_back(app::index_command(app));
    configured.push_back(app::plan_command(app));
    configured.push_back(app::check_data_command(app));
    configured.push_back(app::model_command(app));
    configured.push_back(app::preview_command(app));
    configured.push_back(app::export_command(app));
    configured.push_back(app::prepare_features_command(app, hooks));
    plain.push_back(app::inspect_command(app));
    plain.push_back(app::report_command(app));
    configured.push_back(app::print_config_command(app, top));
    configured.push_back(app::train_command(app, top, hooks));
  }
  app::PlainCommand* chosen_plain() const {
    for (const auto& c : plain) {
      if (c->chosen()) return c.get();
    }
    return nullptr;
  }
  app::ConfigCommand& chosen_configured() const {
    for (const auto& c : configured) {
      if (c->chosen()) return *c;
    }
    return *configured.back();
  }
};

// Where failures are reported: plain lines on stderr (after the rank prefix a launcher
// other than ours needs) until logging is set up, then the log (stderr and the log file).
struct FailureOutput {
  std::string line_prefix;
  bool to_log = false;
};

// The one mapping from an exception to what the user reads and the exit code.
int report_failure(const std::exception& e, const FailureOutput& out) {
  if (out.to_log) {
    std::istringstream lines(report_of(e));
    for (std::string line; std::getline(lines, line);) log::error("{}", line);
  } else {
    std::cerr << report_of(e, out.line_prefix);
  }
  return exit_code_of(e);
}

dist::LaunchEnv launch_environment(FailureOutput& failures) {
  dist::exit_with_launcher();
  const dist::LaunchEnv env = dist::detect_launch_env();
  log::set_rank(env.rank, env.world_size);
  // Our launcher puts "[rank N] " before every worker line already.
  if (env.world_size > 1 && env.launcher != "sana-launch") failures.line_prefix = fmt::format("[rank {}] ", env.rank);
  return env;
}

}  // namespace

int main(int argc, char** argv) {
  register_checks();  // what config validation needs from model/ and data/ (presets, buckets)
  sana::train::register_lora_check();  // train.lora's targets against the model
  dist::FlightRecorder::install_sigusr1();  // kill -USR1 writes the flight record, never kills
  // A write to the socket of a rank that died must fail with EPIPE, which the backend turns
  // into "another rank failed" (exit 3), instead of killing this rank with SIGPIPE (141).
  std::signal(SIGPIPE, SIG_IGN);
  // LibTorch's errors carry a C++ backtrace in their message; users read our messages.
  c10::SetStackTraceFetcher(std::function<std::string()>([] { return std::string(); }));
  CLI::App cli{"sana-train: train Sana-style multi-scale linear diffusion transformers"};
  FailureOutput failures;
  try {
    // --- Command line ------------------------------------------------------------------
    const Commands commands(cli, argc, argv);
    cli.require_subcommand(0, 1);
    cli.footer(help_footer(cli));
    cli.parse(argc, argv);
    if (!commands.launch.worker_args.empty() && !cli.got_subcommand("launch")) {
      throw UsageError("'--' separates worker arguments for 'sana-train launch' only");
    }
    if (auto* command = commands.chosen_plain()) return command->run();

    // --- Launch environment --------------------------------------------------------------
    const dist::LaunchEnv env = launch_environment(failures);

    // --- Config: every mistake is reported here, before any process could wait -----------
    app::ConfigCommand& command = commands.chosen_configured();
    const config::Config cfg = app::load_config(command, env);
    log::set_level(*log::parse_level(cfg.log_level));
    failures.to_log = true;

    // --- The command ---------------------------------------------------------------------
    return command.run(env, cfg);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const std::exception& e) {
    return report_failure(e, failures);
  }
}
