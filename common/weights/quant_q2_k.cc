// Q2_K: super-blocks of 256 as 16 sub-blocks of 16, 2-bit levels with a 4-bit scale and a 4-bit
// min per sub-block, quantized by ggml's reference algorithm (quantize_row_q2_K_ref).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/weights/block_layouts.h"
#include "common/weights/k_quant_search.h"
#include "common/weights/row_kernels.h"

namespace tandem::kernels {
namespace {

constexpr int kSubBlocks = kSuperBlockElems / 16;

}  // namespace

void DequantizeQ2_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ2_K block;
    std::memcpy(&block, src + b * sizeof(BlockQ2_K), sizeof(block));
    const float d = Fp16ToFp32(block.d);
    const float dmin = Fp16ToFp32(block.dmin);
    float* out = dst + b * kSuperBlockElems;
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const uint8_t sc = block.scales[e / 16];
      const float dl = d * (sc & 0xF);
      const float ml = dmin * (sc >> 4);
      const int q = (block.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      out[e] = dl * q - ml;
    }
  }
}

void QuantizeQ2_K(const float* src, uint8_t* dst, int64_t n) {
  constexpr float kScaleLevels = 15.f;  // 4-bit sub-block scales and mins
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    const float* x = src + b * kSuperBlockElems;
    uint8_t levels[kSuperBlockElems];
    uint8_t scratch[16];
    float weights[16];
    float scales[kSubBlocks];
    float mins[kSubBlocks];
    float max_scale = 0;  // scales are positive since the min is subtracted
    float max_min = 0;
    for (int j = 0; j < kSubBlocks; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = kquant::MakeAsymmetricQuants(16, 3, x + 16 * j, weights, levels + 16 * j, &mins[j], scratch, -0.5f,
                                               0.1f, 15, /*use_mad=*/true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }

    BlockQ2_K block;
    if (max_scale > 0) {
      const float iscale = kScaleLevels / max_scale;
      for (int j = 0; j < kSubBlocks; ++j) {
        block.scales[j] = static_cast<uint8_t>(kquant::NearestInt(iscale * scales[j]));
      }
      block.d = Fp32ToFp16(max_scale / kScaleLevels);
    } else {
      std::fill(block.scales, block.scales + kSubBlocks, uint8_t{0});
      block.d = Fp32ToFp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = kScaleLevels / max_min;
      for (int j = 0; j < kSubBlocks; ++j) {
        block.scales[j] |= static_cast<uint8_t>(kquant::NearestInt(iscale * mins[j]) << 4);
      }
      block.dmin = Fp32ToFp16(max_min / kScaleLevels);
    } else {
      block.dmin = Fp32ToFp16(0.f);
    }

    // Re-quantize every element against the scales as stored (rounded to 4 bits and f16).
    for (int j = 0; j < kSubBlocks; ++j) {
      const float d = Fp16ToFp32(block.d) * (block.scales[j] & 0xF);
      if (!d) continue;
      const float dm = Fp16ToFp32(block.dmin) * (block.scales[j] >> 4);
      for (int i = 0; i < 16; ++i) {
        const int l = kquant::NearestInt((x[16 * j + i] + dm) / d);
        levels[16 * j + i] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    PackTwoBitValues(levels, block.qs);
    std::memcpy(dst + b * sizeof(BlockQ2_K), &block, sizeof(block));
  }
}

}  // namespace tandem::kernels
