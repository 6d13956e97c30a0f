// Streaming detokenization: text for token ids that arrive one at a time (generation output).
#ifndef TANDEM_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_
#define TANDEM_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace tandem {

// Turns token ids into valid UTF-8 text as they arrive. A token may end inside a multi-byte
// character (byte-level BPE splits characters freely); those bytes are held back until a later
// token completes the character, so no piece ever ends in half a character. Invalid byte
// sequences become U+FFFD by the maximal-subpart rule of utf8.h. For any ids, the concatenation of
// all Push() results and Finish() equals Tokenizer::DecodeToText(ids).
// Control tokens are included as their literal text; callers that hide them skip those ids.
// Holds a reference to the tokenizer, which must outlive it. Not thread-safe.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // The text completed by this token (possibly empty). Fails with InvalidArgument for an id
  // outside the vocabulary, leaving the state unchanged.
  absl::StatusOr<std::string> Push(int32_t id);

  // Flushes the held-back bytes (an incomplete character becomes one U+FFFD) and resets the
  // decoder for a new stream.
  std::string Finish() { return sanitizer_.Finish(); }

  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return sanitizer_.pending_bytes(); }

 private:
  const Tokenizer* tokenizer_;
  Utf8StreamSanitizer sanitizer_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_INCREMENTAL_DECODER_H_
