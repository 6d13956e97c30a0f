// Q3_K: super-blocks of 256 as 16 sub-blocks of 16, 3-bit signed levels (two low bits in qs, the
// high bit in hmask) with a signed 6-bit scale per sub-block, quantized by ggml's reference
// algorithm (quantize_row_q3_K_ref).
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

void DequantizeQ3_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ3_K block;
    std::memcpy(&block, src + b * sizeof(BlockQ3_K), sizeof(block));
    const float d = Fp16ToFp32(block.d);
    float* out = dst + b * kSuperBlockElems;
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const float dl = d * UnpackQ3KScale(e / 16, block.scales);
      const int low = (block.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const bool high = (block.hmask[e % 32] >> (e / 32)) & 1;
      out[e] = dl * (low - (high ? 0 : 4));
    }
  }
}

void QuantizeQ3_K(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    const float* x = src + b * kSuperBlockElems;
    int8_t levels[kSuperBlockElems];  // 0..7 standing for -4..3
    float scales[kSubBlocks];
    float max_scale = 0;  // the signed scale of largest magnitude
    float amax = 0;
    for (int j = 0; j < kSubBlocks; ++j) {
      scales[j] = kquant::MakeQ3Quants(16, 4, x + 16 * j, levels + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }

    BlockQ3_K block;
    if (max_scale) {
      // The sub-block scales become 6-bit signed values; the largest maps to -32.
      const float iscale = -32.f / max_scale;
      uint8_t biased[kSubBlocks];
      for (int j = 0; j < kSubBlocks; ++j) {
        const int8_t l = static_cast<int8_t>(kquant::NearestInt(iscale * scales[j]));
        biased[j] = static_cast<uint8_t>(std::max<int>(-32, std::min<int>(31, l)) + 32);
      }
      PackQ3KScales(biased, block.scales);
      block.d = Fp32ToFp16(1 / iscale);
    } else {
      std::fill(block.scales, block.scales + kKScaleBytes, uint8_t{0});
      block.d = Fp32ToFp16(0.f);
    }

    for (int j = 0; j < kSubBlocks; ++j) {
      const float d = Fp16ToFp32(block.d) * UnpackQ3KScale(j, block.scales);
      if (!d) continue;
      for (int i = 0; i < 16; ++i) {
        const int l = kquant::NearestInt(x[16 * j + i] / d);
        levels[16 * j + i] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }

    std::fill(block.hmask, block.hmask + kSuperBlockElems / 8, uint8_t{0});
    uint8_t low_bits[kSuperBlockElems];
    for (int e = 0; e < kSuperBlockElems; ++e) {
      if (levels[e] > 3) block.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
      low_bits[e] = static_cast<uint8_t>(levels[e] & 3);
    }
    PackTwoBitValues(low_bits, block.qs);
    std::memcpy(dst + b * sizeof(BlockQ3_K), &block, sizeof(block));
  }
}

}  // namespace tandem::kernels
