// `tandem`: the project's tool binary. Each subcommand lives with the code that owns its logic;
// this table lists them.
#include <cstdio>
#include <cstring>
#include <string>

#include "common/tool_command.h"
#include "common/gguf/inspect_command.h"
#include "common/model/generate_command.h"
#include "common/convert/convert_command.h"
#include "common/convert/logits_command.h"
#include "common/model_gen/gen_model_command.h"
#include "host_expert_worker/bench/bench_command.h"

namespace {

constexpr tandem::ToolCommand kCommands[] = {
    {"inspect", "print a GGUF file's metadata and tensor table (--json for scripts)",
     tandem::RunInspectCommand},
    {"gen-model", "write a synthetic qwen3next / qwen4exp GGUF from a preset (--help for presets)",
     tandem::RunGenModelCommand},
    {"generate", "offline generation on the CPU reference engine",
     tandem::RunGenerateCommand},
    {"convert", "convert a Qwen3-Next Hugging Face checkpoint to a qwen3next GGUF",
     tandem::RunConvertCommand},
    {"logits", "dump the CPU reference's logits for token ids (for parity scripts)",
     tandem::RunLogitsCommand},
    {"bench", "benchmarks: `tandem bench worker` (expert kernels vs DRAM, channel round trips)",
     tandem::RunBenchCommand},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(stderr, "usage: tandem COMMAND [flags]\n\ncommands:\n");
    for (const tandem::ToolCommand& c : kCommands) {
      std::fprintf(stderr, "  %-10s %s\n", std::string(c.name).c_str(),
                   std::string(c.summary).c_str());
    }
    return argc < 2 ? 2 : 0;
  }
  for (const tandem::ToolCommand& c : kCommands) {
    if (c.name == argv[1]) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "tandem: unknown command '%s' (try 'tandem help')\n", argv[1]);
  return 2;
}
