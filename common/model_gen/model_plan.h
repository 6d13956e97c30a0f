// The tensor plan of a synthetic model: every tensor's name, ggml type, shape (docs/MODEL.md §2)
// and how its values are drawn, in file order. The generator streams exactly this list; tests and
// size estimates read it without writing anything.
#ifndef TANDEM_COMMON_MODEL_GEN_MODEL_PLAN_H_
#define TANDEM_COMMON_MODEL_GEN_MODEL_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_gen/model_spec.h"

namespace tandem {

inline constexpr uint32_t kGgmlTypeI32 = 26;  // ggml's GGML_TYPE_I32 (engram_token_map)

// How a tensor's values are drawn (docs/GEN_MODEL.md); `scale` is the parameter named here.
enum class TensorInit {
  kGaussian,   // N(0, scale²) per element
  kEmbedding,  // N(0, scale²), plus the routing-skew offset along the skew direction when zipf > 0
  kRouter,     // N(0, scale²), plus the expert's popularity bias along the skew direction
  kNearOne,    // 1 + U(−scale, scale): RMS-norm weights (the baked 1 + w)
  kSsmA,       // −U(1, 16): −exp(A_log) with A_log = log U(1, 16), as Qwen3-Next initialises
  kDtBias,     // softplus⁻¹(dt) with dt log-uniform in [1e-3, 0.1]
  kTokenMap,   // i32 Engram token map: id → a compressed id in [0, scale·V)
};

struct PlannedTensor {
  std::string name;
  uint32_t ggml_type = 0;        // a WeightType id, or kGgmlTypeI32
  std::vector<int64_t> ne;       // ggml order
  TensorInit init = TensorInit::kGaussian;
  float scale = 0.0f;
  int64_t layer = -1;            // kRouter: the layer (its popularity permutation)
  // Expert tensors of a quantized type: blocks are drawn directly (direct_quant.h) instead of
  // quantizing Gaussian rows, so 45 GB of experts take minutes, not hours.
  bool direct_quant = false;
  uint64_t n_bytes = 0;          // the tensor's data bytes (unpadded)

  int64_t cols() const { return ne[0]; }
  int64_t rows() const;          // product of ne[1..]
};

// The tensors of `spec` in file order. Errors: the spec fails CheckGenModelSpec.
absl::StatusOr<std::vector<PlannedTensor>> PlanTensors(const GenModelSpec& spec);

// Bytes of the tensor data section: each tensor's bytes padded to `alignment`.
uint64_t PlannedDataBytes(const std::vector<PlannedTensor>& plan, uint32_t alignment = 32);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_MODEL_PLAN_H_
