// `sana-train index --input SRC... --output FILE`: builds a dataset index.
#include <fmt/format.h>

#include <iostream>

#include "command.h"
#include "sana/data/index_builder.h"

namespace sana::app {

namespace {

class Index : public PlainSubcommand {
 public:
  explicit Index(CLI::App& app)
      : PlainSubcommand(app, "index", "build a dataset index from folders, JSONL/CSV metadata or other indexes") {
    cli_->add_option("--input", inputs_, "a source (repeat for several)")->required();
    cli_->add_option("--output", output_, "the index file to write")->required();
    cli_->add_option("--threads", options_.threads, "threads reading image headers (0: all cores)");
  }

  int run() override {
    const auto r = data::build_index(inputs_, output_, options_);
    std::cout << fmt::format(
        "index: {} samples -> {} ({} bytes, {:.1f} bytes/sample) in {:.2f} s; {} sizes read from "
        "image headers, {} unreadable; fingerprint {}\n",
        r.rows, output_, r.bytes, r.rows ? static_cast<double>(r.bytes) / r.rows : 0.0, r.seconds,
        r.sizes_read, r.unreadable, r.fingerprint);
    return 0;
  }

 private:
  std::vector<std::string> inputs_;
  std::string output_;
  data::IndexBuildOptions options_;
};

}  // namespace

std::unique_ptr<PlainCommand> index_command(CLI::App& app) { return std::make_unique<Index>(app); }

}  // namespace sana::app
