// Q4_K and Q5_K: super-blocks of 256 as 8 sub-blocks of 32, asymmetric 4-bit (Q4_K) or 5-bit
// (Q5_K) levels with a 6-bit scale and a 6-bit min per sub-block. The two share ggml's reference
// algorithm (quantize_row_q4_K_ref / quantize_row_q5_K_ref) and differ only in the level range,
// the search parameters and where the fifth bit goes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/weights/block_layouts.h"
#include "common/weights/k_quant_search.h"
#include "common/weights/row_kernels.h"

namespace tandem::kernels {
namespace {

constexpr int kSubBlocks = kSuperBlockElems / 32;

// The search parameters of make_qkx2_quants for one type.
struct SubBlockSearch {
  int nmax;     // largest level: 15 (Q4_K) or 31 (Q5_K)
  float rmin;   // first trial offset of the inverse scale
  int nstep;    // number of trial steps of 0.1
};

// The part Q4_K and Q5_K share: per-sub-block scale/min search, 6-bit quantization of the
// scales and mins against the f16 super-block d / dmin, and re-quantization of every element
// against the stored values. Writes d, dmin and the 12 scale bytes; levels get 0..nmax.
void QuantizeSuperBlock(const float* x, const SubBlockSearch& search, uint16_t* d_out, uint16_t* dmin_out,
                        uint8_t* packed_scales, uint8_t* levels) {
  float scales[kSubBlocks];
  float mins[kSubBlocks];
  float weights[32];
  uint8_t scratch[32];
  float max_scale = 0;  // scales are positive since the min is subtracted
  float max_min = 0;
  for (int j = 0; j < kSubBlocks; ++j) {
    // Weight each element by the sub-block's RMS plus its own magnitude.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = kquant::MakeAsymmetricQuants(32, search.nmax, x + 32 * j, weights, levels + 32 * j, &mins[j], scratch,
                                             search.rmin, 0.1f, search.nstep, /*use_mad=*/false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t scale6[kSubBlocks];
  uint8_t min6[kSubBlocks];
  for (int j = 0; j < kSubBlocks; ++j) {
    // The uint8_t conversion happens before the clamp, as in ggml.
    scale6[j] = std::min<uint8_t>(63, static_cast<uint8_t>(kquant::NearestInt(inv_scale * scales[j])));
    min6[j] = std::min<uint8_t>(63, static_cast<uint8_t>(kquant::NearestInt(inv_min * mins[j])));
  }
  PackKScalesMins(scale6, min6, packed_scales);
  *d_out = Fp32ToFp16(max_scale / 63.f);
  *dmin_out = Fp32ToFp16(max_min / 63.f);

  for (int j = 0; j < kSubBlocks; ++j) {
    uint8_t sc;
    uint8_t m;
    UnpackKScaleMin(j, packed_scales, &sc, &m);
    const float d = Fp16ToFp32(*d_out) * sc;
    if (!d) continue;
    const float dm = Fp16ToFp32(*dmin_out) * m;
    for (int i = 0; i < 32; ++i) {
      const int l = kquant::NearestInt((x[32 * j + i] + dm) / d);
      levels[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(search.nmax, l)));
    }
  }
}

// Element e's (scale, min) pair as the dequantizers use it: d * sc and dmin * m.
void SubBlockFactors(const uint8_t* packed_scales, float d, float dmin, float* factor, float* offset) {
  for (int j = 0; j < kSubBlocks; ++j) {
    uint8_t sc;
    uint8_t m;
    UnpackKScaleMin(j, packed_scales, &sc, &m);
    factor[j] = d * sc;
    offset[j] = dmin * m;
  }
}

}  // namespace

void DequantizeQ4_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ4_K block;
    std::memcpy(&block, src + b * sizeof(BlockQ4_K), sizeof(block));
    float factor[kSubBlocks];
    float offset[kSubBlocks];
    SubBlockFactors(block.scales, Fp16ToFp32(block.d), Fp16ToFp32(block.dmin), factor, offset);
    float* out = dst + b * kSuperBlockElems;
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const uint8_t byte = block.qs[32 * (e / 64) + e % 32];
      const int q = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
      out[e] = factor[e / 32] * q - offset[e / 32];
    }
  }
}

void DequantizeQ5_K(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ5_K block;
    std::memcpy(&block, src + b * sizeof(BlockQ5_K), sizeof(block));
    float factor[kSubBlocks];
    float offset[kSubBlocks];
    SubBlockFactors(block.scales, Fp16ToFp32(block.d), Fp16ToFp32(block.dmin), factor, offset);
    float* out = dst + b * kSuperBlockElems;
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const uint8_t byte = block.qs[32 * (e / 64) + e % 32];
      const int low = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
      const int high = ((block.qh[e % 32] >> (e / 32)) & 1) ? 16 : 0;
      out[e] = factor[e / 32] * (low + high) - offset[e / 32];
    }
  }
}

void QuantizeQ4_K(const float* src, uint8_t* dst, int64_t n) {
  constexpr SubBlockSearch kSearch = {15, -1.f, 20};
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ4_K block;
    uint8_t levels[kSuperBlockElems];
    QuantizeSuperBlock(src + b * kSuperBlockElems, kSearch, &block.d, &block.dmin, block.scales, levels);
    for (int e = 0; e < kSuperBlockElems; e += 64) {
      for (int l = 0; l < 32; ++l) {
        block.qs[e / 2 + l] = static_cast<uint8_t>(levels[e + l] | (levels[e + l + 32] << 4));
      }
    }
    std::memcpy(dst + b * sizeof(BlockQ4_K), &block, sizeof(block));
  }
}

void QuantizeQ5_K(const float* src, uint8_t* dst, int64_t n) {
  constexpr SubBlockSearch kSearch = {31, -0.5f, 15};
  for (int64_t b = 0; b < n / kSuperBlockElems; ++b) {
    BlockQ5_K block;
    uint8_t levels[kSuperBlockElems];
    QuantizeSuperBlock(src + b * kSuperBlockElems, kSearch, &block.d, &block.dmin, block.scales, levels);
    std::fill(block.qh, block.qh + kSuperBlockElems / 8, uint8_t{0});
    for (int e = 0; e < kSuperBlockElems; ++e) {
      if (levels[e] > 15) block.qh[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    }
    for (int e = 0; e < kSuperBlockElems; e += 64) {
      for (int l = 0; l < 32; ++l) {
        block.qs[e / 2 + l] = static_cast<uint8_t>((levels[e + l] & 0xF) | ((levels[e + l + 32] & 0xF) << 4));
      }
    }
    std::memcpy(dst + b * sizeof(BlockQ5_K), &block, sizeof(block));
  }
}

}  // namespace tandem::kernels
