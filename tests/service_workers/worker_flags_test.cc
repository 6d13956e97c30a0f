// tandem-host-worker's start-up: each bad flag fails the start with exit status 1 and a message that
// names it, before any shared memory is touched or the model is read (the channel named here does
// not exist and the model is not a file).
#include <stdio.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

struct WorkerExit {
  int code = -1;
  std::string output;  // stdout and stderr
};

WorkerExit RunWorker(const std::string& args) {
  const std::string command = std::string(TANDEM_BINARY_DIR) +
                              "/host_expert_worker/tandem-host-worker --model=/no/such/model.gguf "
                              "--channel=/tandem-0123456789abcdef0123456789abcdef " +
                              args + " 2>&1";
  WorkerExit out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[512];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) out.code = WEXITSTATUS(status);
  return out;
}

TEST(WorkerFlagsTest, EachBadFlagFailsTheStartNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--threads=-1", "--threads: -1 is outside [0, "},
      {"--threads=100000", "--threads: 100000 is outside [0, "},
      {"--share=2/1", "--share '2/1' must be K/N"},
      {"--cpus=abc", "--cpus: bad item 'abc'"},
      {"--isa=foo", "unknown kernel ISA 'foo'"},
      {"--numa-node=4096", "4096"},  // no such node, or no NUMA support at all
  };
  for (const auto& [flag, message] : cases) {
    const WorkerExit run = RunWorker(flag);
    EXPECT_EQ(run.code, 1) << flag << ": " << run.output;
    EXPECT_THAT(run.output, HasSubstr(message)) << flag;
    EXPECT_THAT(run.output, ::testing::Not(HasSubstr("shared segment"))) << flag;
  }
}

}  // namespace
}  // namespace tandem
