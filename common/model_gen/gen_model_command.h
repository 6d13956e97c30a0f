// `tandem gen-model --out FILE.gguf [--preset NAME] [--seed N] [overrides]`: writes a synthetic
// model (docs/GEN_MODEL.md lists the presets and flags).
#ifndef TANDEM_COMMON_MODEL_GEN_GEN_MODEL_COMMAND_H_
#define TANDEM_COMMON_MODEL_GEN_GEN_MODEL_COMMAND_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/model_gen/model_spec.h"

namespace tandem {

struct GenModelArgs {
  GenModelSpec spec;     // the preset with every override applied (not yet checked)
  std::string out;       // --out
  bool dry_run = false;  // --dry-run: print the plan's size, write nothing
  bool quiet = false;    // --quiet: no progress line
  bool help = false;     // --help
  int threads = 0;       // --threads: tensors drawn at once (0: one per hardware thread)
};

// Parses argv[1..] (argv[0] is "gen-model"). Flags take "--flag value" or "--flag=value"; the
// preset is applied first, whatever the flag order. Errors: InvalidArgument naming the flag
// (unknown flag, missing or malformed value, unknown preset or weight type, no --out).
absl::StatusOr<GenModelArgs> ParseGenModelArgs(int argc, char** argv);

// The usage text.
std::string GenModelUsage();

// Runs the subcommand: 0 on success, 1 when generation fails, 2 on bad usage (message to stderr).
int RunGenModelCommand(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_GEN_MODEL_COMMAND_H_
