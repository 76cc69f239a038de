// Log lines: levels filter, the rank prefix appears once distributed, the file gets
// the same lines as the terminal.
#include "catch.h"

#include <fstream>
#include <sstream>

#include "sana/util/log.h"
#include "test_support.h"

TEST_CASE("log lines carry level and rank and reach the log file", "[log]") {
  sana::test::TempDir dir;
  std::string err;
  REQUIRE(sana::log::open_file(dir.path("logs/train.log"), &err));  // creates the folder
  sana::log::set_level(sana::log::Level::info);
  sana::log::set_rank(1, 4);
  sana::log::debug("hidden {}", 1);
  sana::log::info("step {} loss {:.2f}", 3, 0.5);
  sana::log::set_rank(0, 1);
  sana::log::warn("single process");
  sana::log::close_file();
  sana::log::info("after close");

  std::ifstream f(dir.path("logs/train.log"));
  std::stringstream text;
  text << f.rdbuf();
  const std::string s = text.str();
  CHECK(s.find("hidden") == std::string::npos);
  CHECK(s.find("r1/4 I] step 3 loss 0.50\n") != std::string::npos);
  CHECK(s.find(" W] single process\n") != std::string::npos);
  CHECK(s.find("r0/1") == std::string::npos);
  CHECK(s.find("after close") == std::string::npos);
}

TEST_CASE("an unwritable log file is an error that names it", "[log]") {
  std::string err;
  CHECK_FALSE(sana::log::open_file("/proc/no/such/dir/train.log", &err));
  CHECK(err.find("/proc/no/such/dir/train.log") != std::string::npos);
}
