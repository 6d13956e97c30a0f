// A small, valid Qwen-style tokenizer for generated test models.
#ifndef TANDEM_COMMON_TOKENIZER_SMALL_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_SMALL_TOKENIZER_H_

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// 256 byte tokens + 3 special tokens + at least 32 learned merges.
inline constexpr int kSmallTokenizerMinVocab = 256 + 3 + 32;
inline constexpr int kSmallTokenizerMaxVocab = 1 << 22;

// The embedded training text (a few KB of English prose and code, UTF-8).
extern const char kSmallTokenizerCorpus[];

// Builds a TokenizerSpec of exactly `vocab_size` tokens that Tokenizer::Create() accepts, the same
// for the same vocab_size on every run and machine. Layout by id:
//   [0, 256)            the byte tokens, id = byte value, in GPT-2 mapped form (type normal);
//   [256, 256 + m)      tokens learned by byte-level BPE training on kSmallTokenizerCorpus with
//                       the Qwen2 pre-tokenizer: repeatedly merge the most frequent adjacent pair
//                       (ties: smallest left id, then smallest right id; pairs seen once count)
//                       until vocab_size - 3 normal tokens exist or every corpus word is one
//                       token (after 1108 merges, so up to vocab_size 1367 there is no padding);
//   next 3              <|endoftext|>, <|im_start|>, <|im_end|> (type control);
//   the rest            "[PAD<id>]" padding tokens (type unused), present only when the corpus
//                       runs out of pairs (as Qwen's files pad their vocabulary to the
//                       embedding rows).
// bos = pad = <|endoftext|>, eos = <|im_end|> (as Qwen chat models); chat_template is
// kChatMLTemplate (chatml.h). Fails with InvalidArgument if vocab_size is outside
// [kSmallTokenizerMinVocab, kSmallTokenizerMaxVocab].
absl::StatusOr<TokenizerSpec> MakeSmallByteLevelTokenizer(int vocab_size);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_SMALL_TOKENIZER_H_
