// ProcessSwitch (gpu_service/backends/cuda/env_switch.h): the A/B switches' value from the
// environment on first use, overridden by set(). Host code only: runs without a GPU.
#include "gpu_service/backends/cuda/env_switch.h"

#include <cstdlib>

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

}  // namespace
}  // namespace tandem::cuda
