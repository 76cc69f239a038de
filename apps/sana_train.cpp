// sana-train: the command line. Reads as the table of contents of a run:
// command line -> launch environment -> config (validated before anything else) ->
// logging -> the subcommand (train, launch, check-dist).
// Exit codes (util/exit_codes.h): 0 done, 1 the run failed, 2 usage/config/launch/device
// error, 3 stopped because another rank failed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "sana/ckpt/checkpoint.h"
#include "sana/config/loader.h"
#include "sana/config/schema.h"
#include "sana/data/check_data.h"
#include "sana/data/data_commands.h"
#include "sana/data/dataset_index.h"
#include "sana/dist/check_dist.h"
#include "sana/dist/devices.h"
#include "sana/dist/launch_env.h"
#include "sana/dist/launcher.h"
#include "sana/dist/run_guard.h"
#include "sana/model/model_command.h"
#include "sana/train/report.h"
#include "sana/train/trainer.h"
#include "sana/util/exit_codes.h"
#include "sana/util/log.h"

namespace {

using namespace sana;

// ---------------------------------------------------------------------------------------
// Help

std::string help_footer() {
  config::Config defaults;
  std::string out =
      "\nCommands:\n"
      "  sana-train --config FILE [--key.path=VALUE | --key.path VALUE]...   train\n"
      "  sana-train --config FILE --print-config    print the resolved config as YAML\n"
      "  sana-train --list-keys                     every config key with type and default\n"
      "  sana-train launch --nproc-per-node N -- ARGS...   start N local workers (torchrun-style)\n"
      "  sana-train check-dist [--seconds S] [--dist.KEY=VALUE]...   pre-flight check of a "
      "cluster\n"
      "  sana-train index --input SRC... --output FILE   build a dataset index\n"
      "  sana-train plan --config FILE [--world-size W --rank R --epoch E --json]   the epoch "
      "plan\n"
      "  sana-train check-data --config FILE [--limit N]   decode every sample, count bad ones\n"
      "  sana-train model --config FILE [--json]   parameters per module and FLOPs per bucket\n"
      "  sana-train preview --config FILE [--weights F] [--out DIR]   sample preview grids\n"
      "  sana-train report WORK_DIR   plots and a summary of a run's metrics\n"
      "  sana-train inspect CHECKPOINT|WORK_DIR   what a checkpoint holds, checksums verified\n"
      "\nMost used keys (override any key of the YAML the same way):\n";
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

void print_keys() {
  config::Config defaults;
  config::resolve_defaults(defaults);
  for (const auto& f : config::fields_of(defaults)) {
    std::string line = fmt::format("{:<40} {:<17} {:<24} {}", f.key, config::type_name(f.ref),
                                   config::value_text(f.ref), f.help);
    if (!f.choices.empty()) line += fmt::format(" [{}]", fmt::join(f.choices, "|"));
    std::cout << line << "\n";
  }
}

// ---------------------------------------------------------------------------------------
// Config

config::Config load(const std::string& path, const std::vector<std::string>& extras,
                    const config::ValidationContext& ctx) {
  config::ConfigLoader loader;
  std::vector<config::ConfigIssue> cli_issues;
  const auto overrides = config::parse_overrides(extras, cli_issues);
  for (auto& issue : cli_issues) loader.add_issue(std::move(issue));
  if (!path.empty()) loader.add_file(path);
  for (const auto& o : overrides) loader.add_override(o);
  return loader.build(ctx);
}

// Our launcher puts "[rank N] " before every worker line already.
std::string rank_prefix(const dist::LaunchEnv& env) {
  return env.world_size > 1 && env.launcher != "sana-launch" ? fmt::format("[rank {}] ", env.rank)
                                                             : "";
}

// ---------------------------------------------------------------------------------------
// Training

int run_training(const config::Config& cfg, const dist::LaunchEnv& env) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.work_dir, ec);
  if (ec) {
    log::error("cannot create work_dir '{}': {}", cfg.work_dir, ec.message());
    return kExitFailure;
  }
  const std::string log_name =
      env.rank == 0 ? "train.log" : fmt::format("train.rank{}.log", env.rank);
  std::string err;
  if (!log::open_file((fs::path(cfg.work_dir) / log_name).string(), &err)) {
    log::error("{}", err);
    return kExitFailure;
  }
  if (env.rank == 0) {
    std::ofstream(fs::path(cfg.work_dir) / "config.yaml") << config::to_yaml(cfg);
  }
  log::info("sana-train {}: launcher {}, rank {} of {}, work_dir {}", SANA_VERSION, env.launcher,
            env.rank, env.world_size, cfg.work_dir);
  return train::train(cfg, env);
}

// ---------------------------------------------------------------------------------------
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

// A subcommand that reads a config (required) and takes --key.path overrides after it.
CLI::App* config_subcommand(CLI::App& app, const char* name, const char* description,
                            std::string& config_path) {
  auto* sub = app.add_subcommand(name, description);
  sub->allow_extras();
  sub->add_option("-c,--config", config_path, "YAML config file")->required();
  return sub;
}

std::string self_executable(const char* argv0) {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

}  // namespace

int main(int argc, char** argv) {
  // --- Command line -------------------------------------------------------------------
  const std::vector<std::string> worker_args = split_at_double_dash(argc, argv);
  CLI::App app{"sana-train: train Sana-style multi-scale linear diffusion transformers"};
  app.allow_extras();
  app.require_subcommand(0, 1);
  app.footer(help_footer());
  std::string config_path;
  bool print_config = false;
  bool list_keys = false;
  app.add_option("-c,--config", config_path, "YAML config file (its base: files load first)");
  app.add_flag("--print-config", print_config, "print the fully resolved config as YAML and exit");
  app.add_flag("--list-keys", list_keys, "list every config key and exit");

  dist::LaunchOptions launch_opts;
  auto* launch = app.add_subcommand(
      "launch", "start workers with a torchrun-style environment: launch [OPTIONS] -- ARGS...");
  launch->add_option("--nproc-per-node", launch_opts.nproc_per_node, "workers on this node")
      ->required();
  launch->add_option("--nnodes", launch_opts.nnodes, "nodes in the job");
  launch->add_option("--node-rank", launch_opts.node_rank, "this node's index");
  launch->add_option("--master-addr", launch_opts.master_addr, "node 0's address");
  launch->add_option("--master-port", launch_opts.master_port, "rendezvous port; 0 = a free one");
  launch->add_option("--max-restarts", launch_opts.max_restarts,
                     "restart all workers after a failure up to this many times");
  launch->add_option("--grace-seconds", launch_opts.grace_s,
                     "time between SIGTERM and SIGKILL when stopping workers");

  dist::CheckDistOptions check_opts;
  auto* check = app.add_subcommand("check-dist", "pre-flight check: rendezvous, devices, "
                                                 "agreement, all-reduce bandwidth");
  check->allow_extras();
  check->add_option("-c,--config", config_path, "optional config (its dist section is used)");
  check->add_option("--seconds", check_opts.soak_seconds,
                    "keep all-reducing this many seconds after the table (a soak)");
  data::IndexCommand index_cmd;
  auto* index = app.add_subcommand("index", "build a dataset index from folders, JSONL/CSV "
                                            "metadata or other indexes");
  index->add_option("--input", index_cmd.inputs, "a source (repeat for several)")->required();
  index->add_option("--output", index_cmd.output, "the index file to write")->required();
  index->add_option("--threads", index_cmd.threads, "threads reading image headers (0: all cores)");

  data::PlanCommand plan_cmd;
  auto* plan = config_subcommand(app, "plan",
                                 "the epoch plan: bucket histogram, steps per epoch, and with "
                                 "--json a rank's sample ids per step",
                                 config_path);
  plan->add_option("--world-size", plan_cmd.world_size, "world size to slice the plan for");
  plan->add_option("--rank", plan_cmd.rank, "the rank whose slices --json lists");
  plan->add_option("--epoch", plan_cmd.epoch, "epoch number (from 0)");
  plan->add_flag("--json", plan_cmd.json, "print JSON: steps_per_epoch, num_samples, steps, ...");
  int64_t check_data_limit = 0;
  auto* check_data = config_subcommand(
      app, "check-data", "decode every sample through the real loader; count bad ones by reason",
      config_path);
  check_data->add_option("--limit", check_data_limit, "decode only this many samples");
  model::ModelCommand model_cmd;
  auto* model_sub = config_subcommand(
      app, "model", "the config's model: parameters per module, FLOPs per sample for a few buckets",
      config_path);
  model_sub->add_flag("--json", model_cmd.json, "print JSON");
  model::PreviewCommand preview_cmd;
  auto* preview_sub = config_subcommand(
      app, "preview", "sample preview grids (square, tallest, widest bucket) from initial or given weights",
      config_path);
  preview_sub->add_option("--weights", preview_cmd.weights, "model weights (.safetensors or torch.save'd)");
  preview_sub->add_option("--out", preview_cmd.out, "output folder (default: <work_dir>/previews)");
  std::string inspect_path;
  auto* inspect_sub = app.add_subcommand("inspect", "what a checkpoint holds; verifies its checksums (exit 1 if bad)");
  inspect_sub->add_option("checkpoint", inspect_path, "a checkpoint folder, or a work_dir (its latest)")->required();
  std::string report_dir;
  auto* report_sub = app.add_subcommand("report", "plots (PNG) and a summary of a run from its metrics.jsonl");
  report_sub->add_option("work_dir", report_dir, "the run's work_dir")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  if (list_keys) {
    print_keys();
    return kExitOk;
  }

  if (launch->parsed()) {
    // "launch -- check-dist ..." runs sana-train; "launch -- ./tool args" runs ./tool.
    launch_opts.worker_args = worker_args;
    if (!worker_args.empty() && worker_args.front().find('/') != std::string::npos) {
      launch_opts.program = worker_args.front();
      launch_opts.worker_args.erase(launch_opts.worker_args.begin());
    } else if (!worker_args.empty()) {
      launch_opts.program = self_executable(argv[0]);
    }
    const std::string problem = dist::check_launch_options(launch_opts);
    if (!problem.empty()) {
      std::cerr << "usage error: launch: " << problem << "\n";
      return kExitUsage;
    }
    return dist::run_launcher(launch_opts);
  }
  if (!worker_args.empty()) {
    std::cerr << "usage error: '--' separates worker arguments for 'sana-train launch' only\n";
    return kExitUsage;
  }
  if (report_sub->parsed()) return train::run_report_command(report_dir);
  if (inspect_sub->parsed()) return ckpt::run_inspect_command(inspect_path);
  if (index->parsed()) {
    try {
      return data::run_index_command(index_cmd);
    } catch (const data::IndexError& e) {
      std::cerr << "index error: " << e.what() << "\n";
      return kExitUsage;
    }
  }

  // --- Launch environment -------------------------------------------------------------
  dist::exit_with_launcher();
  dist::LaunchEnv env;
  try {
    env = dist::detect_launch_env();
  } catch (const dist::LaunchEnvError& e) {
    std::cerr << "launch error: " << e.what() << "\n";
    return kExitUsage;
  }
  log::set_rank(env.rank, env.world_size);

  // --- Config: every mistake is reported here, before any process could wait ----------
  const bool checking = check->parsed();
  const bool planning = plan->parsed();
  const bool checking_data = check_data->parsed();
  const bool describing = model_sub->parsed();
  const bool previewing = preview_sub->parsed();
  if (config_path.empty() && !print_config && !checking) {
    std::cerr << "usage error: --config FILE is required (sana-train --help)\n";
    return kExitUsage;
  }
  config::Config cfg;
  try {
    const auto extras = checking        ? check->remaining()
                        : planning      ? plan->remaining()
                        : checking_data ? check_data->remaining()
                        : describing    ? model_sub->remaining()
                        : previewing    ? preview_sub->remaining()
                                        : app.remaining();
    config::ValidationContext ctx;
    ctx.world_size = planning ? plan_cmd.world_size : env.world_size;
    ctx.check_paths = !print_config && !checking && !describing && !previewing;  // no data read
    ctx.check_batch = !checking && !describing && !previewing;
    cfg = load(config_path, extras, ctx);
  } catch (const config::ConfigError& e) {
    std::cerr << e.report(rank_prefix(env));
    dist::report_startup_failure(env, "", 0, e.issues().front().format());
    return kExitUsage;
  }
  if (print_config) {
    std::cout << config::to_yaml(cfg);
    return kExitOk;
  }
  log::set_level(*log::parse_level(cfg.log_level));
  if (describing) return model::run_model_command(cfg, model_cmd);
  if (previewing) return model::run_preview_command(cfg, preview_cmd);
  if (planning || checking_data) {
    try {
      return planning ? data::run_plan_command(cfg, plan_cmd)
                      : data::run_check_data(cfg, check_data_limit);
    } catch (const data::IndexError& e) {
      log::error("data error: {}", e.what());
      return kExitUsage;
    } catch (const std::exception& e) {
      log::error("failed: {}", e.what());
      return kExitFailure;
    }
  }

  // --- The subcommand -----------------------------------------------------------------
  return dist::run_guarded(env, [&] {
    if (checking) return dist::run_check_dist(cfg, env, check_opts);
    return run_training(cfg, env);
  });
}
