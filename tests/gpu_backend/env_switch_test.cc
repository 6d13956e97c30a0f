// ProcessSwitch and ProcessInteger (gpu_service/backends/cuda/env_switch.h): the A/B switches' and
// numeric settings' values from the environment on first use, overridden by set(); EnvInteger's and
// EnvChoice's readings, and what they say of a value they cannot take. Host code only: runs
// without a GPU.
#include "gpu_service/backends/cuda/env_switch.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace tandem::cuda {
namespace {

TEST(ProcessSwitchTest, ReadsTheEnvironmentOnFirstUse) {
  ::unsetenv("TANDEM_TEST_SWITCH_A");
  ::unsetenv("TANDEM_TEST_SWITCH_B");
  ProcessSwitch off_by_default([] { return EnvSwitch("TANDEM_TEST_SWITCH_A"); });
  ProcessSwitch on_by_default([] { return EnvSwitchDefaultOn("TANDEM_TEST_SWITCH_B"); });
  // Set after construction, before the first on(): the first on() reads them.
  ::setenv("TANDEM_TEST_SWITCH_A", "1", 1);
  ::setenv("TANDEM_TEST_SWITCH_B", "0", 1);
  EXPECT_TRUE(off_by_default.on());
  EXPECT_FALSE(on_by_default.on());
  // Read once: later changes to the environment do not move it.
  ::setenv("TANDEM_TEST_SWITCH_A", "0", 1);
  ::unsetenv("TANDEM_TEST_SWITCH_B");
  EXPECT_TRUE(off_by_default.on());
  EXPECT_FALSE(on_by_default.on());
  ::unsetenv("TANDEM_TEST_SWITCH_A");
}

TEST(ProcessSwitchTest, DefaultsWhenUnset) {
  ::unsetenv("TANDEM_TEST_SWITCH_C");
  ProcessSwitch off_by_default([] { return EnvSwitch("TANDEM_TEST_SWITCH_C"); });
  ProcessSwitch on_by_default([] { return EnvSwitchDefaultOn("TANDEM_TEST_SWITCH_C"); });
  ProcessSwitch negated([] { return !EnvSwitch("TANDEM_TEST_SWITCH_C"); });
  EXPECT_FALSE(off_by_default.on());
  EXPECT_TRUE(on_by_default.on());
  EXPECT_TRUE(negated.on());
}

TEST(ProcessSwitchTest, SetOverridesTheEnvironmentBeforeAndAfterTheFirstRead) {
  ::setenv("TANDEM_TEST_SWITCH_D", "1", 1);
  ProcessSwitch set_first([] { return EnvSwitch("TANDEM_TEST_SWITCH_D"); });
  set_first.set(false);  // before any read: the environment is never consulted
  EXPECT_FALSE(set_first.on());
  ProcessSwitch read_first([] { return EnvSwitch("TANDEM_TEST_SWITCH_D"); });
  EXPECT_TRUE(read_first.on());
  read_first.set(false);
  EXPECT_FALSE(read_first.on());
  read_first.set(true);
  EXPECT_TRUE(read_first.on());
  ::unsetenv("TANDEM_TEST_SWITCH_D");
}

TEST(ProcessIntegerTest, ReadsTheEnvironmentOnFirstUseWithinItsRange) {
  ::unsetenv("TANDEM_TEST_INT_A");
  ::unsetenv("TANDEM_TEST_INT_B");
  ProcessInteger in_range([] { return EnvInteger("TANDEM_TEST_INT_A", 3, 0, 4); });
  ProcessInteger out_of_range([] { return EnvInteger("TANDEM_TEST_INT_B", 3, 0, 4); });
  // Set after construction, before the first value(): the first value() reads them.
  ::setenv("TANDEM_TEST_INT_A", "1", 1);
  ::setenv("TANDEM_TEST_INT_B", "9", 1);
  EXPECT_EQ(in_range.value(), 1);
  EXPECT_EQ(out_of_range.value(), 3);  // past the range: the default
  // Read once: later changes to the environment do not move it.
  ::setenv("TANDEM_TEST_INT_A", "2", 1);
  EXPECT_EQ(in_range.value(), 1);
  ::unsetenv("TANDEM_TEST_INT_A");
  ::unsetenv("TANDEM_TEST_INT_B");
}

TEST(ProcessIntegerTest, DefaultsWhenUnsetEmptyOrNotANumber) {
  ::unsetenv("TANDEM_TEST_INT_C");
  ProcessInteger unset([] { return EnvInteger("TANDEM_TEST_INT_C", 7, 0, 100); });
  EXPECT_EQ(unset.value(), 7);
  ::setenv("TANDEM_TEST_INT_C", "", 1);
  ProcessInteger empty([] { return EnvInteger("TANDEM_TEST_INT_C", 7, 0, 100); });
  EXPECT_EQ(empty.value(), 7);
  ::setenv("TANDEM_TEST_INT_C", "12x", 1);
  ProcessInteger trailing([] { return EnvInteger("TANDEM_TEST_INT_C", 7, 0, 100); });
  EXPECT_EQ(trailing.value(), 7);
  ::unsetenv("TANDEM_TEST_INT_C");
}

TEST(ProcessIntegerTest, SetOverridesTheEnvironmentBeforeAndAfterTheFirstRead) {
  ::setenv("TANDEM_TEST_INT_D", "5", 1);
  ProcessInteger set_first([] { return EnvInteger("TANDEM_TEST_INT_D", 0, 0, 10); });
  set_first.set(2);  // before any read: the environment is never consulted
  EXPECT_EQ(set_first.value(), 2);
  ProcessInteger read_first([] { return EnvInteger("TANDEM_TEST_INT_D", 0, 0, 10); });
  EXPECT_EQ(read_first.value(), 5);
  read_first.set(0);
  EXPECT_EQ(read_first.value(), 0);
  read_first.set(int64_t{1} << 40);  // set() is not bound by the reader's range
  EXPECT_EQ(read_first.value(), int64_t{1} << 40);
  ::unsetenv("TANDEM_TEST_INT_D");
}

TEST(EnvIntegerTest, NamesTheVariableWhenItsValueIsNotTaken) {
  ::setenv("TANDEM_TEST_INT_E", "12x", 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(EnvInteger("TANDEM_TEST_INT_E", 7, 0, 100), 7);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "TANDEM_TEST_INT_E=12x is not an integer in [0, 100]: using 7\n");
  ::setenv("TANDEM_TEST_INT_E", "101", 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(EnvInteger("TANDEM_TEST_INT_E", 7, 0, 100), 7);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "TANDEM_TEST_INT_E=101 is not an integer in [0, 100]: using 7\n");
  ::setenv("TANDEM_TEST_INT_E", "99999999999999999999", 1);  // past long long: strtoll's ERANGE
  testing::internal::CaptureStderr();
  EXPECT_EQ(EnvInteger("TANDEM_TEST_INT_E", 7, 0, std::numeric_limits<long long>::max()), 7);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("TANDEM_TEST_INT_E=99999999999999999999"), std::string::npos);
  // A value taken, and an unset or empty one, say nothing.
  ::setenv("TANDEM_TEST_INT_E", "-3", 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(EnvInteger("TANDEM_TEST_INT_E", 7, -5, 5), -3);
  ::setenv("TANDEM_TEST_INT_E", "", 1);
  EXPECT_EQ(EnvInteger("TANDEM_TEST_INT_E", 7, -5, 5), 7);
  ::unsetenv("TANDEM_TEST_INT_E");
  EXPECT_EQ(EnvInteger("TANDEM_TEST_INT_E", 7, -5, 5), 7);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

enum class Terms { kA, kB, kC };

TEST(EnvChoiceTest, TakesTheNamedValuesAndTheFallbackOtherwise) {
  auto read = [] { return EnvChoice<Terms>("TANDEM_TEST_CHOICE", {{"a", Terms::kA}, {"b", Terms::kB}}, Terms::kC); };
  ::unsetenv("TANDEM_TEST_CHOICE");
  testing::internal::CaptureStderr();
  EXPECT_EQ(read(), Terms::kC);
  ::setenv("TANDEM_TEST_CHOICE", "", 1);
  EXPECT_EQ(read(), Terms::kC);
  ::setenv("TANDEM_TEST_CHOICE", "a", 1);
  EXPECT_EQ(read(), Terms::kA);
  ::setenv("TANDEM_TEST_CHOICE", "b", 1);
  EXPECT_EQ(read(), Terms::kB);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  ::setenv("TANDEM_TEST_CHOICE", "B", 1);  // not a name it takes (names are matched exactly)
  testing::internal::CaptureStderr();
  EXPECT_EQ(read(), Terms::kC);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "TANDEM_TEST_CHOICE=B is not one of a, b: using the default\n");
  ::unsetenv("TANDEM_TEST_CHOICE");
}

}  // namespace
}  // namespace tandem::cuda
