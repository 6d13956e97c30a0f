// AVX2 kernels (for x86-64 machines without AVX-512 VNNI). K-quants: each 32-element group of a
// super-block is decoded once into unsigned bytes, vpmaddubsw with the int8 activations, vpmaddwd
// with the two 16-element sub-block scales of the group, then (in f32) times the group's
// activation scale; mins (or the centring offset) meet the scaled activation sums per 16. Q8_0 / Q4_0: |w| times sign-adjusted activations, as ggml does.
#include <immintrin.h>

#include <cstring>

#include "common/weights/block_layouts.h"
#include "host_expert_worker/kernels/activation_blocks.h"
#include "host_expert_worker/kernels/k_quant_unpack.h"
#include "host_expert_worker/kernels/row_dot_kernels.h"

#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tandem::row_dot_internal {
namespace {

TANDEM_AVX2 inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
TANDEM_AVX2 inline __m256i ShiftRight(__m256i v, int s) {
  return _mm256_srl_epi16(v, _mm_cvtsi32_si128(s));
}

// The 4-bit values of group g in Q4_K / Q5_K's qs layout.
TANDEM_AVX2 inline __m256i Nibbles(const uint8_t* qs, int g) {
  return _mm256_and_si256(ShiftRight(Load32(qs + 32 * (g / 2)), 4 * (g % 2)), _mm256_set1_epi8(0x0F));
}

// Group g (elements 32 g .. 32 g + 31) of a super-block as unsigned bytes.
TANDEM_AVX2 inline __m256i Group(const BlockQ4_K& b, int g) { return Nibbles(b.qs, g); }
TANDEM_AVX2 inline __m256i Group(const BlockQ5_K& b, int g) {
  const __m256i high = _mm256_and_si256(ShiftRight(Load32(b.qh), g), _mm256_set1_epi8(1));
  return _mm256_or_si256(Nibbles(b.qs, g), _mm256_slli_epi16(high, 4));
}
TANDEM_AVX2 inline __m256i Group(const BlockQ2_K& b, int g) {
  return _mm256_and_si256(ShiftRight(Load32(b.qs + 32 * (g / 4)), 2 * (g % 4)), _mm256_set1_epi8(3));
}
TANDEM_AVX2 inline __m256i Group(const BlockQ3_K& b, int g) {
  const __m256i low = _mm256_and_si256(ShiftRight(Load32(b.qs + 32 * (g / 4)), 2 * (g % 4)), _mm256_set1_epi8(3));
  const __m256i high = _mm256_and_si256(ShiftRight(Load32(b.hmask), g), _mm256_set1_epi8(1));
  return _mm256_or_si256(low, _mm256_slli_epi16(high, 2));
}
TANDEM_AVX2 inline __m256i Group(const BlockQ6_K& b, int g) {
  const int h = g / 4, gg = g % 4;
  const __m256i low = _mm256_and_si256(ShiftRight(Load32(b.ql + 64 * h + 32 * (gg & 1)), gg < 2 ? 0 : 4),
                                       _mm256_set1_epi8(0x0F));
  const __m256i high = _mm256_and_si256(ShiftRight(Load32(b.qh + 32 * h), 2 * gg), _mm256_set1_epi8(3));
  return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
}

TANDEM_AVX2 inline float HorizontalSum(__m256 acc) {
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  return _mm_cvtss_f32(v);
}

// NR outputs, each the sum over `terms` activation rows (acts[k * terms + t]).
template <typename Block, int NR>
TANDEM_AVX2 void KQuantRowsN(const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                             int64_t blocks, const void* const* acts, int terms, float* const* out) {
  const ActivationBlockQ8K* a[NR * kMaxTerms];
  for (int k = 0; k < NR * terms; ++k) a[k] = static_cast<const ActivationBlockQ8K*>(acts[k]);
  for (int64_t r = 0; r < row_count; ++r) {
    const Block* row = reinterpret_cast<const Block*>(weights + r * row_bytes);
    __m256 acc[NR];
    for (int k = 0; k < NR; ++k) acc[k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      KQuantScales s;
      UnpackScales(row[b], &s);
      __m256i q[8], sc[8];
      for (int g = 0; g < 8; ++g) {
        q[g] = Group(row[b], g);
        sc[g] = _mm256_set_m128i(_mm_set1_epi16(s.sc[2 * g + 1]), _mm_set1_epi16(s.sc[2 * g]));
      }
      const __m256 d = _mm256_set1_ps(s.d);
      // -dmin * mn per 16-element sub-block (0..7, 8..15), to meet the activations' scaled sums.
      const __m256 neg_dmin = _mm256_set1_ps(-s.dmin);
      const __m256 neg_mins_lo = _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.mn)))), neg_dmin);
      const __m256 neg_mins_hi = _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.mn + 8)))), neg_dmin);
      for (int t = 0; t < terms; ++t) {
        for (int k = 0; k < NR; ++k) {
          const ActivationBlockQ8K& ab = a[k * terms + t][b];
          __m256 groups = _mm256_setzero_ps();
          for (int g = 0; g < 8; ++g) {
            const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * g));
            const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], x), sc[g]);
            groups = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(&ab.d[g]), groups);
          }
          acc[k] = _mm256_fmadd_ps(groups, d, acc[k]);
          acc[k] = _mm256_fmadd_ps(neg_mins_lo, _mm256_load_ps(ab.bsum_d), acc[k]);
          acc[k] = _mm256_fmadd_ps(neg_mins_hi, _mm256_load_ps(ab.bsum_d + 8), acc[k]);
        }
      }
    }
    for (int k = 0; k < NR; ++k) out[k][r] = HorizontalSum(acc[k]);
  }
}

TANDEM_AVX2 inline __m256i LegacyValues(const BlockQ8_0& b) { return Load32(reinterpret_cast<const uint8_t*>(b.qs)); }
TANDEM_AVX2 inline __m256i LegacyValues(const BlockQ4_0& b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
  return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

template <typename Block, int NR>
TANDEM_AVX2 void LegacyRowsN(const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                             int64_t blocks, const void* const* acts, int terms, float* const* out) {
  const ActivationBlockQ8x32* a[NR * kMaxTerms];
  for (int k = 0; k < NR * terms; ++k) a[k] = static_cast<const ActivationBlockQ8x32*>(acts[k]);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = 0; r < row_count; ++r) {
    const Block* row = reinterpret_cast<const Block*>(weights + r * row_bytes);
    __m256 acc[NR];
    for (int k = 0; k < NR; ++k) acc[k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const __m256i w = LegacyValues(row[b]);
      const __m256i wabs = _mm256_abs_epi8(w);
      uint16_t dh;
      std::memcpy(&dh, &row[b].d, 2);
      const float d = _cvtsh_ss(dh);
      for (int t = 0; t < terms; ++t) {
        for (int k = 0; k < NR; ++k) {
          const ActivationBlockQ8x32& ab = a[k * terms + t][b];
          const __m256i x = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs)), w);
          const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, x), ones);
          acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * ab.d), acc[k]);
        }
      }
    }
    for (int k = 0; k < NR; ++k) out[k][r] = HorizontalSum(acc[k]);
  }
}

// Runs the NR-specialised kernel for out_count = 1..kMaxRowBlock.
#define TANDEM_ROW_COUNT_DISPATCH(NAME, FN)                                                        \
  template <typename Block>                                                                        \
  void NAME(const uint8_t* w, int64_t rb, int64_t rc, int64_t nb, const void* const* acts, int n,  \
            int terms, float* const* out) {                                                        \
    switch (n) {                                                                                   \
      case 1: return FN<Block, 1>(w, rb, rc, nb, acts, terms, out);                                \
      case 2: return FN<Block, 2>(w, rb, rc, nb, acts, terms, out);                                \
      case 3: return FN<Block, 3>(w, rb, rc, nb, acts, terms, out);                                \
      case 4: return FN<Block, 4>(w, rb, rc, nb, acts, terms, out);                                \
      case 5: return FN<Block, 5>(w, rb, rc, nb, acts, terms, out);                                \
      case 6: return FN<Block, 6>(w, rb, rc, nb, acts, terms, out);                                \
      case 7: return FN<Block, 7>(w, rb, rc, nb, acts, terms, out);                                \
      default: return FN<Block, 8>(w, rb, rc, nb, acts, terms, out);                               \
    }                                                                                              \
  }

TANDEM_ROW_COUNT_DISPATCH(KQuantRows, KQuantRowsN)
TANDEM_ROW_COUNT_DISPATCH(LegacyRows, LegacyRowsN)

}  // namespace

RowDotKernel Avx2Kernel(WeightType type) {
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
