// The test runner's main, for Catch2 v2 and v3. The config checks that model/ and data/
// register are registered first, as sana-train's main does.
#if SANA_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include "sana/train/options/config_checks.h"

int main(int argc, char** argv) {
  sana::register_checks();
  return Catch::Session().run(argc, argv);
}
