// The portable kernels: the reference every SIMD family is tested against.
#include <cstring>

#include "common/weights/block_layouts.h"
#include "common/weights/half.h"
#include "host_expert_worker/kernels/activation_blocks.h"
#include "host_expert_worker/kernels/k_quant_unpack.h"
#include "host_expert_worker/kernels/row_dot_kernels.h"

namespace tandem::row_dot_internal {
namespace {

// Per block and activation row: the exact integer sum of each 32-element group (sub-block scale
// times q·a) times the group's activation scale, times d; minus dmin times the mins against the
// scaled per-16 activation sums.
template <typename Block>
void KQuantRows(const uint8_t* weights, int64_t row_bytes, int64_t row_count, int64_t blocks,
                const void* const* acts, int out_count, int terms, float* const* out) {
  uint8_t q[256];
  KQuantScales s;
  float acc[kMaxRowBlock];
  const int act_count = out_count * terms;
  for (int64_t r = 0; r < row_count; ++r) {
    const uint8_t* row = weights + r * row_bytes;
    for (int k = 0; k < out_count; ++k) acc[k] = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      Block block;
      std::memcpy(&block, row + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
      UnpackScales(block, &s);
      UnpackValues(block, q);
      for (int k = 0; k < act_count; ++k) {
        const ActivationBlockQ8K& a = static_cast<const ActivationBlockQ8K*>(acts[k])[b];
        float scaled = 0.0f, mins = 0.0f;
        for (int g = 0; g < 8; ++g) {
          int32_t group = 0;
          for (int sub = 2 * g; sub < 2 * g + 2; ++sub) {
            int32_t dot = 0;
            for (int e = 16 * sub; e < 16 * sub + 16; ++e) dot += q[e] * a.qs[e];
            group += s.sc[sub] * dot;
          }
          scaled += a.d[g] * static_cast<float>(group);
        }
        for (int sub = 0; sub < 16; ++sub) mins += static_cast<float>(s.mn[sub]) * a.bsum_d[sub];
        acc[k / terms] += s.d * scaled - s.dmin * mins;
      }
    }
    for (int k = 0; k < out_count; ++k) out[k][r] = acc[k];
  }
}

// Q8_0 and Q4_0 as signed int8 values with one scale per 32.
template <typename Block>
void LegacyRows(const uint8_t* weights, int64_t row_bytes, int64_t row_count, int64_t blocks,
                const void* const* acts, int out_count, int terms, float* const* out) {
  int8_t q[32];
  float acc[kMaxRowBlock];
  const int act_count = out_count * terms;
  for (int64_t r = 0; r < row_count; ++r) {
    const uint8_t* row = weights + r * row_bytes;
    for (int k = 0; k < out_count; ++k) acc[k] = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      Block block;
      std::memcpy(&block, row + b * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
      if constexpr (sizeof(Block) == sizeof(BlockQ8_0)) {
        std::memcpy(q, block.qs, 32);
      } else {
        for (int e = 0; e < 16; ++e) {
          q[e] = static_cast<int8_t>((block.qs[e] & 0xF) - 8);
          q[e + 16] = static_cast<int8_t>((block.qs[e] >> 4) - 8);
        }
      }
      const float d = Fp16ToFp32(block.d);
      for (int k = 0; k < act_count; ++k) {
        const ActivationBlockQ8x32& a = static_cast<const ActivationBlockQ8x32*>(acts[k])[b];
        int32_t dot = 0;
        for (int e = 0; e < 32; ++e) dot += q[e] * a.qs[e];
        acc[k / terms] += d * a.d * static_cast<float>(dot);
      }
    }
    for (int k = 0; k < out_count; ++k) out[k][r] = acc[k];
  }
}

}  // namespace

RowDotKernel ScalarKernel(WeightType type) {
  switch (type) {
    case WeightType::kQ2_K: return KQuantRows<BlockQ2_K>;
    case WeightType::kQ3_K: return KQuantRows<BlockQ3_K>;
    case WeightType::kQ4_K: return KQuantRows<BlockQ4_K>;
    case WeightType::kQ5_K: return KQuantRows<BlockQ5_K>;
    case WeightType::kQ6_K: return KQuantRows<BlockQ6_K>;
    case WeightType::kQ8_0: return LegacyRows<BlockQ8_0>;
    case WeightType::kQ4_0: return LegacyRows<BlockQ4_0>;
    default: return nullptr;
  }
}

}  // namespace tandem::row_dot_internal
