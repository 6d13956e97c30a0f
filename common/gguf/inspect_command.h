// `tandem inspect FILE.gguf [--json]`: prints a GGUF file's version, alignment, metadata (arrays
// summarised), tensor table and per-type totals, as text or as one JSON object (inspect_format.h).
#ifndef TANDEM_COMMON_GGUF_INSPECT_COMMAND_H_
#define TANDEM_COMMON_GGUF_INSPECT_COMMAND_H_

namespace tandem {

// argv[0] is "inspect". Output goes to stdout; a file that cannot be opened or is not valid GGUF
// prints the error to stderr and returns 1; bad usage returns 2.
int RunInspectCommand(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_COMMON_GGUF_INSPECT_COMMAND_H_
