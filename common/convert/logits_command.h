// `tandem logits --model F.gguf --ids 1,2,3 [--out F.bin] [--greedy N] [--draft K --draft-out F]`:
// the CPU reference engine's raw numbers for comparison with other implementations (the parity
// scripts). It prefills the ids in one chunk and writes the logits of every prompt position, then
// decodes N greedy tokens one at a time, appending the logits of each step that fed a token
// (rows T .. T+N-2). Files are little-endian f32, row-major, vocab floats per row. With --draft,
// a fresh sequence prefills the ids and the MTP head drafts K tokens after the prompt's greedy
// next token (ReferenceModel::DraftGreedy), K rows to --draft-out. Prints one JSON line:
// {"positions":T,"vocab":V,"greedy":[...],"draft_next":t,"draft":[...]}.
#ifndef TANDEM_COMMON_CONVERT_LOGITS_COMMAND_H_
#define TANDEM_COMMON_CONVERT_LOGITS_COMMAND_H_

namespace tandem {

// argv[0] is "logits". Returns 0 on success, 1 on a model error, 2 on bad flags.
int RunLogitsCommand(int argc, char** argv);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONVERT_LOGITS_COMMAND_H_
