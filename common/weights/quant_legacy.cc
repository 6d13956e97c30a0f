// Q4_0 and Q8_0: blocks of 32 with one f16 scale, quantized by ggml's reference amax scaling
// (quantize_row_q4_0_ref / quantize_row_q8_0_ref).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/weights/block_layouts.h"
#include "common/weights/row_kernels.h"

namespace tandem::kernels {

void DequantizeQ4_0(const uint8_t* src, float* dst, int64_t n) {
  constexpr int kHalf = kLegacyBlockElems / 2;
  for (int64_t b = 0; b < n / kLegacyBlockElems; ++b) {
    BlockQ4_0 block;
    std::memcpy(&block, src + b * sizeof(BlockQ4_0), sizeof(block));
    const float d = Fp16ToFp32(block.d);
    float* out = dst + b * kLegacyBlockElems;
    for (int j = 0; j < kHalf; ++j) {
      out[j] = ((block.qs[j] & 0xF) - 8) * d;
      out[j + kHalf] = ((block.qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeQ8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kLegacyBlockElems; ++b) {
    BlockQ8_0 block;
    std::memcpy(&block, src + b * sizeof(BlockQ8_0), sizeof(block));
    const float d = Fp16ToFp32(block.d);
    float* out = dst + b * kLegacyBlockElems;
    for (int j = 0; j < kLegacyBlockElems; ++j) out[j] = block.qs[j] * d;
  }
}

void QuantizeQ4_0(const float* src, uint8_t* dst, int64_t n) {
  constexpr int kHalf = kLegacyBlockElems / 2;
  for (int64_t b = 0; b < n / kLegacyBlockElems; ++b) {
    const float* x = src + b * kLegacyBlockElems;
    // The signed value of largest magnitude maps to level 0 (-8): d = max / -8, so the other
    // sign gets the 7 remaining positive levels.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kLegacyBlockElems; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    BlockQ4_0 block;
    block.d = Fp32ToFp16(d);
    for (int j = 0; j < kHalf; ++j) {
      // x * id + 8.5 lies in [0.5, 16.5]; truncation then rounds half up, clamped to 15.
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + kHalf] * id + 8.5f));
      block.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(dst + b * sizeof(BlockQ4_0), &block, sizeof(block));
  }
}

void QuantizeQ8_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kLegacyBlockElems; ++b) {
    const float* x = src + b * kLegacyBlockElems;
    float amax = 0.0f;
    for (int j = 0; j < kLegacyBlockElems; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    BlockQ8_0 block;
    block.d = Fp32ToFp16(d);
    for (int j = 0; j < kLegacyBlockElems; ++j) block.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    std::memcpy(dst + b * sizeof(BlockQ8_0), &block, sizeof(block));
  }
}

}  // namespace tandem::kernels
