// `tandem generate`: offline generation on the CPU reference engine.
#ifndef TANDEM_COMMON_MODEL_GENERATE_COMMAND_H_
#define TANDEM_COMMON_MODEL_GENERATE_COMMAND_H_

namespace tandem {

// tandem generate --model F --prompt TEXT [--chat] [-n N] [--temperature T] [--top-k K]
//                 [--top-p P] [--seed S] [--threads N] [--ids]
// Prints the generated text as it is produced (stdout), then prefill and decode tokens/s (stderr).
// --ids also prints the prompt and generated token ids (one line each, for scripts and tests).
int RunGenerateCommand(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GENERATE_COMMAND_H_
