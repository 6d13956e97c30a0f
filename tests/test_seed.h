// The random engine of the randomized GPU tests: a fresh seed every run (the inputs keep varying,
// so a tolerance that holds only for some inputs fails sooner or later), printed and recorded in
// the test's XML properties, so that a failure can be run again with the same inputs:
// TANDEM_TEST_SEED=N repeats seed N.
#ifndef TANDEM_TESTS_TEST_SEED_H_
#define TANDEM_TESTS_TEST_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace tandem::testing {

inline std::mt19937 SeededRng() {
  uint32_t seed = 0;
  if (const char* v = std::getenv("TANDEM_TEST_SEED"); v != nullptr && *v != '\0') {
    seed = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
  } else {
    seed = std::random_device{}();
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed     ] %u (TANDEM_TEST_SEED=%u repeats it)\n", seed, seed);
  return std::mt19937(seed);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TEST_SEED_H_
