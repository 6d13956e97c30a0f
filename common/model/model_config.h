// The hyper-parameters of a qwen3next or qwen4exp model, read from GGUF metadata
// (docs/MODEL.md §1). Every missing or inconsistent key is reported at once, each named, so a bad
// file fails at load with the full list instead of crashing later.
#ifndef TANDEM_COMMON_MODEL_MODEL_CONFIG_H_
#define TANDEM_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/reference/attention.h"
#include "common/reference/engram.h"
#include "common/reference/gdn.h"
#include "common/reference/moe.h"

namespace tandem {

enum class LayerKind { kGdn, kAttention };

struct ModelConfig {
  std::string arch;          // general.architecture: "qwen3next" or "qwen4exp"
  std::string name;          // general.name (may be empty)
  int64_t h = 0;             // embedding_length
  int64_t n_layers = 0;      // main layers L = block_count - nextn
  int64_t nextn = 0;         // MTP layers (0 or 1), numbered L .. L+nextn-1
  int64_t vocab = 0;         // rows of token_embd
  int64_t context_length = 0;  // A.context_length; 0 when absent
  float eps = 1e-6f;
  std::vector<LayerKind> layer_kinds;  // n_layers + nextn entries (MTP layers: attention)

  int64_t n_streams = 1;     // S
  int64_t hc_rank = 0;       // lr (0: no hyper-connection low-rank read)

  AttnDims attn;             // full-attention and indexer dims
  GdnDims gdn;
  MoeDims moe;
  int64_t expert_ffn = 0;    // I
  int64_t shared_ffn = 0;    // Ish (0: no shared expert)

  // Engram: per Engram layer index, its config; empty when the model has none.
  std::vector<int64_t> engram_layers;
  std::vector<EngramConfig> engram;

  int64_t width() const { return n_streams * h; }  // w = S·h
  bool is_gdn(int64_t layer) const { return layer_kinds[layer] == LayerKind::kGdn; }
  // Index into `engram` for a layer, or -1.
  int64_t engram_index(int64_t layer) const;
};

// Reads and checks every hyper-parameter. The vocabulary size comes from the token_embd tensor's
// shape. Errors: InvalidArgument listing every problem found, one per line, each naming its key.
absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file);

// The metadata key "<arch>.<suffix>".
std::string ArchKey(const std::string& arch, const char* suffix);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_CONFIG_H_
