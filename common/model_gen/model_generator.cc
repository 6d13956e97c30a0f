#include "common/model_gen/model_generator.h"

#include <chrono>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_writer.h"
#include "common/model_gen/model_metadata.h"
#include "common/model_gen/model_plan.h"
#include "common/model_gen/tensor_fill.h"
#include "common/tokenizer/small_tokenizer.h"

namespace tandem {

absl::Status GenerateModel(const GenModelSpec& spec, const std::string& path,
                           const GenProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<PlannedTensor>> plan = PlanTensors(spec);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<TokenizerSpec> tokenizer = MakeSmallByteLevelTokenizer(static_cast<int>(spec.vocab));
  if (!tokenizer.ok()) return tokenizer.status();

  absl::StatusOr<std::unique_ptr<GgufWriter>> writer = GgufWriter::Create(path);
  if (!writer.ok()) return writer.status();
  GgufWriter& w = **writer;
  for (auto& [key, value] : BuildModelMetadata(spec, *tokenizer)) {
    if (absl::Status s = w.AddMetadata(key, std::move(value)); !s.ok()) return s;
  }
  tokenizer->tokens.clear();  // the header holds its own copy now
  tokenizer->merges.clear();
  for (const PlannedTensor& t : *plan) {
    if (absl::Status s = w.AddTensor(t.name, t.ggml_type, absl::MakeConstSpan(t.ne)); !s.ok()) {
      return s;
    }
  }

  GenProgress p;
  p.total_bytes = 0;
  for (const PlannedTensor& t : *plan) p.total_bytes += t.n_bytes;
  auto seconds = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (const PlannedTensor& t : *plan) {
    p.tensor = t.name;
    uint64_t tensor_written = 0;
    absl::Status s = FillTensor(spec, t, [&](absl::Span<const uint8_t> piece) -> absl::Status {
      if (absl::Status ws = w.WriteTensorData(t.name, piece); !ws.ok()) return ws;
      tensor_written += piece.size();
      p.bytes_written += piece.size();
      if (progress) {
        p.seconds = seconds();
        progress(p);
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    if (tensor_written != t.n_bytes) {
      return absl::InternalError(absl::StrCat("tensor '", t.name, "': generated ", tensor_written,
                                              " bytes, planned ", t.n_bytes));
    }
  }
  if (absl::Status s = w.Finish(); !s.ok()) return s;
  if (progress) {
    p.seconds = seconds();
    p.tensor = {};
    p.done = true;
    progress(p);
  }
  return absl::OkStatus();
}

}  // namespace tandem
