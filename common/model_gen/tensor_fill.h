// Draws one planned tensor's values and hands its bytes out in pieces, so that a tensor of any
// size is made in constant memory (at most a few MiB of floats and bytes at a time).
#ifndef TANDEM_COMMON_MODEL_GEN_TENSOR_FILL_H_
#define TANDEM_COMMON_MODEL_GEN_TENSOR_FILL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model_gen/model_plan.h"
#include "common/model_gen/model_spec.h"

namespace tandem {

// Calls sink with consecutive pieces of t's bytes (t.n_bytes in all, in file order), stopping at
// the first error the sink returns. The bytes depend only on spec.seed, the spec fields named in
// docs/GEN_MODEL.md and t itself (each tensor draws from its own stream, seeded by its name).
absl::Status FillTensor(const GenModelSpec& spec, const PlannedTensor& t,
                        absl::FunctionRef<absl::Status(absl::Span<const uint8_t>)> sink);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_TENSOR_FILL_H_
