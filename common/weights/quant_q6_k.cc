// Q6_K: super-blocks of 256 as 16 sub-blocks of 16, 6-bit signed levels (low four bits in ql,
// top two in qh) with a signed 8-bit scale per sub-block, quantized by ggml's reference algorithm
// (quantize_row_q6_K_ref).
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

void DequantizeQ6_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ6_K block;
    std::memcpy(&block, src + b * sizeof(BlockQ6_K), sizeof(block));
    const float d = Fp16ToFp32(block.d);
    float* out = dst + b * kSuperBlockElems;
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const int half = e / 128;
      const int group = (e % 128) / 32;
      const int l = e % 32;
      const uint8_t low_byte = block.ql[64 * half + 32 * (group & 1) + l];
      const int low = group < 2 ? (low_byte & 0xF) : (low_byte >> 4);
      const int high = (block.qh[32 * half + l] >> (2 * group)) & 3;
      out[e] = d * block.scales[e / 16] * ((low | (high << 4)) - 32);
    }
  }
}

void QuantizeQ6_K(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    const float* x = src + b * kSuperBlockElems;
    int8_t levels[kSuperBlockElems];  // 0..63 standing for -32..31
    float scales[kSubBlocks];
    float max_scale = 0;  // the signed scale of largest magnitude
    float max_abs_scale = 0;
    for (int j = 0; j < kSubBlocks; ++j) {
      scales[j] = kquant::MakeSymmetricQuants(16, 32, x + 16 * j, levels + 16 * j);
      const float abs_scale = std::fabs(scales[j]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[j];
      }
    }

    BlockQ6_K block;
    if (max_abs_scale < kquant::kGroupMaxEps) {
      std::memset(&block, 0, sizeof(block));  // all zero: d = +0 and every level 0
      std::memcpy(dst + b * sizeof(BlockQ6_K), &block, sizeof(block));
      continue;
    }
    // The sub-block scales become signed 8-bit values; the largest maps to -128.
    const float iscale = -128.f / max_scale;
    block.d = Fp32ToFp16(1 / iscale);
    for (int j = 0; j < kSubBlocks; ++j) {
      block.scales[j] = static_cast<int8_t>(std::min(127, kquant::NearestInt(iscale * scales[j])));
    }
    for (int j = 0; j < kSubBlocks; ++j) {
      const float d = Fp16ToFp32(block.d) * block.scales[j];
      if (!d) continue;
      for (int i = 0; i < 16; ++i) {
        const int l = kquant::NearestInt(x[16 * j + i] / d);
        levels[16 * j + i] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }

    for (int half = 0; half < 2; ++half) {
      const int8_t* lv = levels + 128 * half;
      for (int l = 0; l < 32; ++l) {
        block.ql[64 * half + l] = static_cast<uint8_t>((lv[l] & 0xF) | ((lv[l + 64] & 0xF) << 4));
        block.ql[64 * half + l + 32] = static_cast<uint8_t>((lv[l + 32] & 0xF) | ((lv[l + 96] & 0xF) << 4));
        block.qh[32 * half + l] = static_cast<uint8_t>((lv[l] >> 4) | ((lv[l + 32] >> 4) << 2) |
                                                       ((lv[l + 64] >> 4) << 4) | ((lv[l + 96] >> 4) << 6));
      }
    }
    std::memcpy(dst + b * sizeof(BlockQ6_K), &block, sizeof(block));
  }
}

}  // namespace tandem::kernels
