// Random quantized blocks drawn directly, without quantizing float rows: the way the generator
// makes tens of gigabytes of expert weights quickly on a small machine.
//
// Each block gets random quants and random sub-block scales, with the super-block scale chosen so
// that the dequantized values have mean 0 and the requested standard deviation (in expectation
// over the blocks; a single row's sample std is within a few percent for rows of >= 256). The
// blocks are valid for every reader: quants are in range, f16 scales are finite and positive.
// How each type is centred is in docs/GEN_MODEL.md.
#ifndef TANDEM_COMMON_MODEL_GEN_DIRECT_QUANT_H_
#define TANDEM_COMMON_MODEL_GEN_DIRECT_QUANT_H_

#include <cstdint>

#include "common/model_gen/gen_random.h"
#include "common/weights/weight_types.h"

namespace tandem {

// Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
bool HasDirectQuant(WeightType type);

// Writes `n_blocks` consecutive blocks of `type` (HasDirectQuant) to dst, drawing from rng.
void FillDirectQuantBlocks(WeightType type, int64_t n_blocks, float std, GenRandom& rng,
                           uint8_t* dst);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_DIRECT_QUANT_H_
