#include "host_expert_worker/kernels/activation_blocks.h"

#include <cmath>

namespace tandem {
namespace {

// Rounds to nearest, ties to even, for |v| <= 127.5 (the default FP rounding mode; written
// without libm so the loops vectorize).
inline int RoundToInt(float v) {
  const float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it leaves the rounded integer in the mantissa
  return static_cast<int>((v + kMagic) - kMagic);
}

// Writes round(x[i] / d) for one block of `len` values; returns d.
float QuantizeBlock(const float* x, int len, int8_t* q) {
  // A plain compare instead of std::fmax, which GCC leaves as a libm call per element (it was
  // most of the quantization time); NaNs are skipped either way.
  float amax = 0.0f;
  for (int i = 0; i < len; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
  }
  if (amax == 0.0f) {
    for (int i = 0; i < len; ++i) q[i] = 0;
    return 0.0f;
  }
  const float d = amax / 127.0f;
  const float id = 127.0f / amax;
  for (int i = 0; i < len; ++i) {
    int v = RoundToInt(x[i] * id);
    v = v > 127 ? 127 : (v < -127 ? -127 : v);
    q[i] = static_cast<int8_t>(v);
  }
  return d;
}

}  // namespace

ActivationFormat IntegerActivationFormat(WeightType type) {
  switch (type) {
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
      return ActivationFormat::kQ8K;
    case WeightType::kQ4_0:
    case WeightType::kQ8_0:
      return ActivationFormat::kQ8x32;
    default:
      return ActivationFormat::kF32;
  }
}

int64_t ActivationRowBytes(ActivationFormat format, int64_t n) {
  switch (format) {
    case ActivationFormat::kQ8K: return n / 256 * static_cast<int64_t>(sizeof(ActivationBlockQ8K));
    case ActivationFormat::kQ8x32: return n / 32 * static_cast<int64_t>(sizeof(ActivationBlockQ8x32));
    case ActivationFormat::kF32: break;
  }
  return n * static_cast<int64_t>(sizeof(float));
}

namespace {

// lane_d and bsum_d of a block whose d and qs are set.
void FillDerivedQ8K(ActivationBlockQ8K& block) {
  for (int j = 0; j < 4; ++j) {
    for (int lane = 0; lane < 16; ++lane) block.lane_d[j][lane] = block.d[2 * j + lane / 8];
  }
  for (int s = 0; s < 16; ++s) {
    int sum = 0;
    for (int e = 16 * s; e < 16 * s + 16; ++e) sum += block.qs[e];
    block.bsum_d[s] = block.d[s / 2] * static_cast<float>(sum);
  }
}

}  // namespace

void QuantizeActivationsQ8K(const float* x, int64_t n, ActivationBlockQ8K* out) {
  for (int64_t b = 0; b < n / 256; ++b) {
    ActivationBlockQ8K& block = out[b];
    for (int g = 0; g < 8; ++g) block.d[g] = QuantizeBlock(x + b * 256 + 32 * g, 32, block.qs + 32 * g);
    FillDerivedQ8K(block);
  }
}

namespace {

// The lo row of a two-term Q8K row: the residual r quantized with every group's scale fixed at
// hi's / 256 (exact in f32: a power of two). |r| <= d_hi / 2 puts round(r / d) in [-128, 128];
// the rare 128 is clamped to 127 like every other value.
void QuantizeResidualQ8K(const float* r, int64_t n, const ActivationBlockQ8K* hi, ActivationBlockQ8K* lo) {
  for (int64_t b = 0; b < n / 256; ++b) {
    ActivationBlockQ8K& block = lo[b];
    for (int g = 0; g < 8; ++g) {
      const float dh = hi[b].d[g];
      block.d[g] = dh * (1.0f / 256.0f);
      const float id = dh == 0.0f ? 0.0f : 256.0f / dh;
      for (int i = 0; i < 32; ++i) {
        int v = RoundToInt(r[b * 256 + 32 * g + i] * id);
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        block.qs[32 * g + i] = static_cast<int8_t>(v);
      }
    }
    FillDerivedQ8K(block);
  }
}

}  // namespace

void QuantizeActivationsQ8x32(const float* x, int64_t n, ActivationBlockQ8x32* out) {
  for (int64_t b = 0; b < n / 32; ++b) out[b].d = QuantizeBlock(x + b * 32, 32, out[b].qs);
}

void QuantizeActivationsTwoTerm(ActivationFormat format, const float* x, int64_t n, float* residual,
                                void* hi, void* lo) {
  if (format == ActivationFormat::kQ8K) {
    auto* h = static_cast<ActivationBlockQ8K*>(hi);
    QuantizeActivationsQ8K(x, n, h);
    for (int64_t e = 0; e < n; ++e) residual[e] = x[e] - ActivationValue(h[e / 256], static_cast<int>(e % 256));
    QuantizeResidualQ8K(residual, n, h, static_cast<ActivationBlockQ8K*>(lo));
  } else {
    auto* h = static_cast<ActivationBlockQ8x32*>(hi);
    QuantizeActivationsQ8x32(x, n, h);
    for (int64_t e = 0; e < n; ++e) residual[e] = x[e] - ActivationValue(h[e / 32], static_cast<int>(e % 32));
    QuantizeActivationsQ8x32(residual, n, static_cast<ActivationBlockQ8x32*>(lo));
  }
}

}  // namespace tandem
