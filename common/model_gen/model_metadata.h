// The GGUF metadata of a synthetic model: the general.*, <arch>.* (docs/MODEL.md §1, §4.3) and
// tokenizer.* keys (§7), in the order they are written.
#ifndef TANDEM_COMMON_MODEL_GEN_MODEL_METADATA_H_
#define TANDEM_COMMON_MODEL_GEN_MODEL_METADATA_H_

#include <string>
#include <utility>
#include <vector>

#include "common/gguf/gguf_value.h"
#include "common/model_gen/model_spec.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

using MetadataList = std::vector<std::pair<std::string, GgufValue>>;

// Every key for `spec` (which must pass CheckGenModelSpec) with `tokenizer` (spec.vocab tokens).
// Counts are u32, floats f32, the layer kinds a bool array, Engram multipliers u64; generator
// provenance goes under tandem.generator.* (seed, routing_zipf).
MetadataList BuildModelMetadata(const GenModelSpec& spec, const TokenizerSpec& tokenizer);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_MODEL_METADATA_H_
