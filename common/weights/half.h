// f16 (IEEE binary16) and bf16 (bfloat16) <-> f32 conversions, bit-exact with ggml's scalar ones
// (ggml-impl.h: ggml_compute_fp32_to_fp16 / _fp16_to_fp32 / _fp32_to_bf16 / _bf16_to_fp32).
//
// f32 -> f16 rounds to nearest, ties to even, produces f16 subnormals, overflows to +-inf, and
// turns every NaN into the quiet NaN 0x7E00 with the input's sign (ggml drops the payload).
// f32 -> bf16 rounds to nearest, ties to even (so large finite values may round to inf); a NaN
// keeps its top 16 bits with the quiet bit forced on. The widening conversions are exact, except
// that a signaling f16 NaN comes back quiet (as in ggml).
//
// Plain C++ without Abseil: SIMD CPU kernels and CUDA kernels include this header too.
#ifndef TANDEM_COMMON_WEIGHTS_HALF_H_
#define TANDEM_COMMON_WEIGHTS_HALF_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_WEIGHTS_HD __host__ __device__
#else
#define TANDEM_WEIGHTS_HD
#endif

namespace tandem {

TANDEM_WEIGHTS_HD inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TANDEM_WEIGHTS_HD inline float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

TANDEM_WEIGHTS_HD inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
    return FloatFromBits(sign | FloatBits(magnitude));
  }
  if (exponent == 0x1F) {
    if (mantissa == 0) return FloatFromBits(sign | 0x7F800000u);  // inf
    // NaN: payload kept, quiet bit set (ggml's conversion goes through an f32 multiply, which
    // quiets a signaling NaN; F16C's vcvtph2ps does the same).
    return FloatFromBits(sign | 0x7FC00000u | (mantissa << 13));
  }
  return FloatFromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));  // rebias 15 -> 127
}

TANDEM_WEIGHTS_HD inline uint16_t Fp32ToFp16(float f) {
  const uint32_t w = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000u);
  const uint32_t magnitude = w & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;  // NaN
  // 0x477FF000 is 65520, halfway between 65504 (largest f16) and 65536; the tie rounds to even,
  // which is up, so everything from there on overflows to inf.
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;
  if (magnitude >= 0x38800000u) {
    // Normal f16 (>= 2^-14): rebias the exponent, keep 10 mantissa bits, round on the other 13.
    // A carry out of the mantissa correctly bumps the exponent.
    uint32_t h = (magnitude - (112u << 23)) >> 13;
    const uint32_t rest = magnitude & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal f16: the result counts units of 2^-24. A value with f32 exponent field e and full
  // mantissa m (implicit bit included) is m * 2^(e-150) = (m >> (126-e)) units plus a remainder.
  const uint32_t exponent = magnitude >> 23;
  const int shift = 126 - static_cast<int>(exponent);
  if (shift > 24) return sign;  // below 2^-25, under half the smallest subnormal: rounds to zero
  const uint32_t full = (magnitude & 0x7FFFFFu) | 0x800000u;
  uint32_t h = full >> shift;
  const uint32_t rest = full & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // may become 0x400, the smallest normal
  return static_cast<uint16_t>(sign | h);
}

TANDEM_WEIGHTS_HD inline float Bf16ToFp32(uint16_t b) { return FloatFromBits(static_cast<uint32_t>(b) << 16); }

TANDEM_WEIGHTS_HD inline uint16_t Fp32ToBf16(float f) {
  const uint32_t w = FloatBits(f);
  if ((w & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((w >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((w + 0x7FFFu + ((w >> 16) & 1u)) >> 16);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_WEIGHTS_HALF_H_
