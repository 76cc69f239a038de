// `sana-train launch --nproc-per-node N [...] -- ARGS...`: starts the workers of this node
// with a torchrun-style environment (sana/distributed/launcher.h does the work).
#include "command.h"
#include "sana/distributed/launcher.h"
#include "sana/train/test_hooks.h"
#include "sana/util/error.h"

#include <cstdlib>

namespace sana::app {

namespace {

class Launch : public PlainSubcommand {
 public:
  Launch(CLI::App& app, const LaunchArgs& args, const train::TestHooks& hooks)
      : PlainSubcommand(app, "launch", "start workers with a torchrun-style environment: launch [OPTIONS] -- ARGS..."),
        args_(args),
        hooks_(hooks) {
    cli_->add_option("--nproc-per-node", opts_.nproc_per_node, "workers on this node")->required();
    cli_->add_option("--nnodes", opts_.nnodes, "nodes in the job");
    cli_->add_option("--node-rank", opts_.node_rank, "this node's index");
    cli_->add_option("--master-addr", opts_.master_addr, "node 0's address");
    cli_->add_option("--master-port", opts_.master_port, "rendezvous port; 0 = a free one");
    cli_->add_option("--max-restarts", opts_.max_restarts,
                     "restart all workers after a failure up to this many times");
    cli_->add_option("--grace-seconds", opts_.grace_s,
                     "time between SIGTERM and SIGKILL when stopping workers");
  }

  int run() override {
    // "launch -- check-dist ..." runs sana-train; "launch -- ./tool args" runs ./tool.
    opts_.worker_args = args_.worker_args;
    if (!opts_.worker_args.empty() && opts_.worker_args.front().find('/') != std::string::npos) {
      opts_.program = opts_.worker_args.front();
      opts_.worker_args.erase(opts_.worker_args.begin());
    } else if (!opts_.worker_args.empty()) {
      opts_.program = args_.self;
    }
    const std::string& pause = hooks_.spawn_pause;  // "local_rank:ms"
    if (!pause.empty() && pause.find(':') != std::string::npos) {
      opts_.pause_local_rank = std::atoi(pause.c_str());
      opts_.pause_before_exec_ms = std::atoi(pause.c_str() + pause.find(':') + 1);
    }
    const std::string problem = dist::check_launch_options(opts_);
    if (!problem.empty()) throw UsageError("launch: " + problem);
    return dist::run_launcher(opts_);
  }

 private:
  const LaunchArgs& args_;
  const train::TestHooks& hooks_;
  dist::LaunchOptions opts_;
};

}  // namespace

std::unique_ptr<PlainCommand> launch_command(CLI::App& app, const LaunchArgs& args, const train::TestHooks& hooks) {
  return std::make_unique<Launch>(app, args, hooks);
}

}  // namespace sana::app
