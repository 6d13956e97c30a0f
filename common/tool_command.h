// A subcommand of the `tandem` tool binary. Each lives with the code that owns its logic and is
// listed in gpu_service/tandem_main.cc.
#ifndef TANDEM_COMMON_TOOL_COMMAND_H_
#define TANDEM_COMMON_TOOL_COMMAND_H_

#include <string_view>

namespace tandem {

struct ToolCommand {
  std::string_view name;
  std::string_view summary;
  // argv[0] is the subcommand's name; returns the process exit code.
  int (*run)(int argc, char** argv);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOOL_COMMAND_H_
