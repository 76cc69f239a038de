// The YAML config loader with command-line overrides: the input is a YAML file, then
// optionally a line "#--" and one override word per line (`--train.lr=1e-4`). Loading
// either gives a config or throws a ConfigError listing the issues.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "sana/config/loader.h"
#include "sana/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t split = text.find("\n#--\n");
  const std::string yaml = text.substr(0, split);
  std::vector<std::string> words;
  if (split != std::string::npos) {
    size_t at = split + 5;
    while (at <= text.size()) {
      const size_t end = text.find('\n', at);
      words.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  const std::string path = sana::fuzz::as_file(reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size(), ".yaml");
  sana::config::ValidationContext ctx;
  ctx.check_paths = false;
  try {
    std::vector<sana::config::ConfigIssue> issues;
    const auto overrides = sana::config::parse_overrides(words, issues);
    const auto config = sana::config::load_config({path}, overrides, ctx, issues);
    (void)sana::config::to_yaml(config);
    (void)sana::config::config_fingerprint(config);
  } catch (const sana::Error&) {
  }
  return 0;
}
