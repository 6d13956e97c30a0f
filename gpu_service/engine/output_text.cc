#include "gpu_service/engine/output_text.h"

#include <algorithm>

namespace tandem {

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop_sequences)
    : tokenizer_(&tokenizer), decoder_(tokenizer), stops_(std::move(stop_sequences)) {}

OutputText::Piece OutputText::Push(int32_t id, bool check_stops) {
  Piece piece;
  if (tokenizer_->IsControl(id)) return piece;
  absl::StatusOr<std::string> text = decoder_.Push(id);
  if (!text.ok() || text->empty()) return piece;
  const size_t old_size = text_.size();
  text_ += *text;
  if (check_stops) {
    // The earliest-ending match that ends inside the new piece.
    size_t best_end = std::string::npos;
    for (const std::string& s : stops_) {
      const size_t from = old_size >= s.size() ? old_size - s.size() + 1 : 0;
      const size_t at = text_.find(s, from);
      if (at == std::string::npos) continue;
      const size_t end = at + s.size();
      if (end < best_end) {
        best_end = end;
        piece.stop = &s;
      }
    }
    if (piece.stop != nullptr) text_.resize(best_end);
  }
  piece.text = text_.substr(old_size);
  return piece;
}

std::string OutputText::Finish() {
  std::string tail = decoder_.Finish();
  text_ += tail;
  return tail;
}

}  // namespace tandem
