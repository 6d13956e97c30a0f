// Views of a model's tensors, bound by name from a GGUF file and checked against the config
// (docs/MODEL.md §2). Binding never copies a matrix: views point into the file's mapping. The
// only copies are small f32 conversions of norm vectors stored in another float type.
#ifndef TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_
#define TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/reference/attention.h"
#include "common/reference/engram.h"
#include "common/reference/gdn.h"
#include "common/reference/moe.h"
#include "common/reference/mtp.h"
#include "common/reference/streams.h"

namespace tandem {

struct LayerWeights {
  LayerKind kind = LayerKind::kGdn;
  HcWeights attn_read;   // attn_hc_* (S > 1) or attn_norm
  HcWeights ffn_read;    // ffn_hc_* or post_attention_norm
  GdnWeights gdn;        // kind == kGdn
  AttnWeights attn;      // kind == kAttention
  MoeWeights moe;
  bool has_engram = false;
  EngramWeights engram;
  // MTP layers only.
  MtpInputWeights mtp_in;
  HcWeights mtp_head_read;   // nextn.shared_head_norm, or nextn.hc_* when S > 1
  MatrixView mtp_embed;      // nextn.embed_tokens; absent: the main embedding
  MatrixView mtp_head;       // nextn.shared_head_head; absent: the main output matrix
};

struct ModelWeights {
  MatrixView token_embd;           // {h, V}
  MatrixView output;               // {h, V} (token_embd when tied)
  HcWeights output_read;           // output_hc_* or output_norm
  std::vector<LayerWeights> layers;  // n_layers main layers, then nextn MTP layers
  std::vector<int32_t> engram_token_map;  // empty: identity
  std::deque<std::vector<float>> owned;   // f32 copies of non-f32 vectors (stable addresses)
};

// Binds every tensor the config needs. Errors: InvalidArgument listing every missing tensor and
// every tensor with a wrong shape or an unsupported type, each by name.
absl::StatusOr<ModelWeights> BindModelWeights(const GgufFile& file, const ModelConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_MODEL_WEIGHTS_H_
