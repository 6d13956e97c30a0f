// A request's generated text, built token by token, with stop-sequence detection.
//
// Text comes from the IncrementalDecoder (valid UTF-8, characters never split across pieces);
// control tokens (e.g. <|im_end|>) add no text. A stop sequence is searched only in text that
// ends in the newest piece, so each match is found at the token that completes it; the text is
// cut right after the match (the stop sequence stays in the output, as in TGIS). The pieces
// returned by Push (and Finish) concatenate to text().
#ifndef TANDEM_GPU_SERVICE_ENGINE_OUTPUT_TEXT_H_
#define TANDEM_GPU_SERVICE_ENGINE_OUTPUT_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

class OutputText {
 public:
  // The tokenizer must outlive this object.
  OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop_sequences);

  struct Piece {
    std::string text;           // new text
    const std::string* stop = nullptr;  // the stop sequence that matched, if any
  };
  // Appends a token (a valid id). Stop sequences are looked for only when check_stops.
  Piece Push(int32_t id, bool check_stops);
  // Flushes held-back bytes (an unfinished character becomes U+FFFD). Call once, at the end,
  // unless a stop sequence matched.
  std::string Finish();

  const std::string& text() const { return text_; }

 private:
  const Tokenizer* tokenizer_;
  IncrementalDecoder decoder_;
  std::vector<std::string> stops_;
  std::string text_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_ENGINE_OUTPUT_TEXT_H_
