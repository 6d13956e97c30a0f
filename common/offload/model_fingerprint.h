// The model fingerprint: a 64-bit hash that lets the worker refuse a segment made for another
// model (or another conversion of the same one) before it computes a single wrong row.
#ifndef TANDEM_COMMON_OFFLOAD_MODEL_FINGERPRINT_H_
#define TANDEM_COMMON_OFFLOAD_MODEL_FINGERPRINT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"

namespace tandem {

// One expert tensor as the fingerprint sees it.
struct FingerprintTensor {
  std::string name;               // GGUF tensor name, e.g. "blk.3.ffn_up_exps.weight"
  uint32_t ggml_type = 0;         // ggml type id (WeightType's numeric value)
  std::vector<int64_t> shape;     // GGUF dims, fastest-varying first
};

// A pure function of the tensors' names, types and shapes. The order of `tensors` does not matter
// (they are hashed sorted by name), so two loaders that list tensors differently agree. Not a
// cryptographic hash: it detects mistakes, not adversaries.
uint64_t ModelFingerprint(std::span<const FingerprintTensor> tensors);

// The fingerprint of a model file's expert tensors (blk.i.ffn_{gate,up,down}_exps.weight for every
// layer i < layer_count: names, types, full shapes). The worker (for its share) and the GPU service
// compute it from the same file with this one function, so they agree by construction. NotFound
// naming the tensor when one is missing.
absl::StatusOr<uint64_t> ExpertTensorsFingerprint(const GgufFile& file, uint32_t layer_count);

}  // namespace tandem

#endif  // TANDEM_COMMON_OFFLOAD_MODEL_FINGERPRINT_H_
