// Hugging Face Qwen3-Next checkpoint -> `qwen3next` GGUF, with llama.cpp's tensor names, metadata
// keys and transformations (docs/MODEL.md §1-2):
//   - zero-centred RMSNorm weights w are stored as 1+w (every *norm* except the GDN output norm
//     linear_attn.norm); A_log as ssm_a = -exp(A_log); dt_bias as ssm_dt.bias; conv1d squeezed to
//     {kk, c_dim};
//   - in_proj_qkvz (rows grouped per key head as [q | k | v | z]) split into attn_qkv (all q, all
//     k, all v) and attn_gate (z); in_proj_ba kept grouped per key head as ssm_ba;
//   - experts (per-expert mlp.experts.E.*_proj, or transformers 5's fused gate_up_proj /
//     down_proj) stacked into {h, I, E} / {I, h, E}; the shared expert and its {h, 1} gate;
//   - mtp.* kept as the nextn layer blk.L.* (block_count counts it, nextn_predict_layers = 1);
//   - the tokenizer (hf_tokenizer.h).
// Norms, ssm_a/ssm_dt, conv1d and the routers are always F32 (as llama.cpp writes them); other
// matrices take `type` (experts `expert_type`), falling back to F16 when a row is not a whole
// number of the type's blocks. Every source tensor is checked (presence, shape, dtype) before the
// output file is created; tensors are then converted one at a time (experts one expert at a time)
// and streamed to the writer, so memory stays at about one expert matrix in f32.
#ifndef TANDEM_COMMON_CONVERT_QWEN3NEXT_CONVERTER_H_
#define TANDEM_COMMON_CONVERT_QWEN3NEXT_CONVERTER_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/weights/weight_types.h"

namespace tandem {

struct ConvertOptions {
  WeightType type = WeightType::kF16;
  std::optional<WeightType> expert_type;  // absent: `type`
  bool keep_mtp = true;                   // false: drop mtp.* (nextn_predict_layers absent)
  bool progress = true;                   // a progress line on stderr
};

// Reads the checkpoint in `hf_dir` and writes `out_path` (atomically: a failed run leaves no file).
// Errors: NotFound / InvalidArgument naming the file and the tensor or field at fault; every
// missing or mis-shaped tensor is listed at once.
absl::Status ConvertQwen3NextCheckpoint(const std::string& hf_dir, const std::string& out_path,
                                        const ConvertOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONVERT_QWEN3NEXT_CONVERTER_H_
