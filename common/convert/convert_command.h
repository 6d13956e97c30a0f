// `tandem convert --hf DIR --out F.gguf [--type T] [--expert-type T] [--no-mtp] [--quiet]`:
// a Hugging Face Qwen3-Next checkpoint to a qwen3next GGUF (qwen3next_converter.h).
#ifndef TANDEM_COMMON_CONVERT_CONVERT_COMMAND_H_
#define TANDEM_COMMON_CONVERT_CONVERT_COMMAND_H_

namespace tandem {

// argv[0] is "convert". Returns 0 on success, 1 on a conversion error, 2 on bad flags.
int RunConvertCommand(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONVERT_CONVERT_COMMAND_H_
