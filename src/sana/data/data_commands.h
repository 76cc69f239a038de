// `sana-train index` and `sana-train plan`: the dataset index and the epoch plan from the
// command line. Neither needs the network (torch only draws DistributedSampler permutations).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sana/config/config.h"

namespace sana::data {

struct IndexCommand {
  std::vector<std::string> inputs;
  std::string output;
  int threads = 0;
};
int run_index_command(const IndexCommand& cmd);

struct PlanCommand {
  int world_size = 1;
  int rank = 0;
  int64_t epoch = 0;
  bool json = false;
};
int run_plan_command(const config::Config& cfg, const PlanCommand& cmd);

}  // namespace sana::data
