// AVX-512 VNNI kernels (Ice Lake / Sapphire Rapids / Zen 4). K-quants: each 64-element quarter of
// a super-block is decoded once into unsigned bytes, multiplied with the int8 activations by
// vpmaddubsw (pairs into int16; at most 2 * 63 * 127, no saturation) and folded with the int16
// sub-block scales by vpmaddwd into int32 lanes that each belong to one 32-element group, which
// then meet the groups' activation scales in f32; the mins (or the centring offset) meet the
// scaled activation sums per 16. Q8_0 / Q4_0: vpdpbusd on |w| and sign-adjusted activations, 32 elements per block.
// GCC 12 warns about the deliberately undefined upper halves inside its own intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "common/weights/block_layouts.h"
#include "host_expert_worker/kernels/activation_blocks.h"
#include "host_expert_worker/kernels/k_quant_unpack.h"
#include "host_expert_worker/kernels/row_dot_kernels.h"

#ifndef TANDEM_PREFETCH_BYTES
#define TANDEM_PREFETCH_BYTES 2048
#endif
#define TANDEM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace tandem::row_dot_internal {
namespace {

// How far ahead of the block being decoded the weight stream is prefetched (docs/PERF.md).
constexpr size_t kPrefetchBytes = TANDEM_PREFETCH_BYTES;

// One decoded super-block: q[j] holds elements 64 j .. 64 j + 63 as bytes; sc[j] the int16 scale
// of each of the 32 vpmaddubsw lanes (lanes 8 i .. 8 i + 7 belong to sub-block 4 j + i); mins
// dmin * mn per 16-element sub-block, to meet the activations' scaled sums (bsum_d); d broadcast.
// Decode functions are force-inlined and the kernel's loops fully unrolled, so a DecodedK lives
// in registers: at one activation row the decode is most of the work per block, and a decode that
// goes through the stack (as it did when the loops were left rolled) costs a third more.
struct DecodedK {
  __m512i q[4];
  __m512i sc[4];
  __m512 mins;
  __m512 d;
};

#define TANDEM_AVX512_INLINE TANDEM_AVX512 inline __attribute__((always_inline))

// d and dmin (two adjacent f16 at p) as broadcast floats.
TANDEM_AVX512_INLINE void HalfPair(const void* p, __m512* d, __m512* dmin) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
  *d = _mm512_broadcastss_ps(f);
  *dmin = _mm512_broadcastss_ps(_mm_movehdup_ps(f));
}

TANDEM_AVX512_INLINE float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Spreads 16 int16 per-16-element scales (sub-block s in lane s) over the four quarters.
TANDEM_AVX512_INLINE void SpreadScales16(__m256i sc16, __m512i* sc) {
  const __m512i z = _mm512_castsi256_si512(sc16);
  const __m512i lane_sub = _mm512_srli_epi16(
      _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                       12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      3);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    // lane L of quarter j reads sub-block 4 j + L / 8
    sc[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(4 * j)), lane_sub), z);
  }
}

// dmin * mn for 16 int16 per-16 mins (lane s = sub-block s).
TANDEM_AVX512_INLINE __m512 MinsTimes(__m256i mn16, __m512 dmin) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(mn16)), dmin);
}

// Q4_K / Q5_K scales and mins, all in vector registers (no scalar unpacking, no stack round
// trip). The 12 scale bytes are three little-endian words w0, w1, w2 (UnpackQ4KScaleBytes):
// scales 0-3 = w0 & 0x3F.., 4-7 = (w2 & 0x0F..) | ((w0 >> 2) & 0x30..), mins alike from w1 and
// w2 >> 4. Each 32-element scale covers 16 word lanes of one quarter, so a byte shuffle of the
// broadcast bytes yields each quarter's int16 lanes directly.
TANDEM_AVX512_INLINE void Q4KScales(const uint8_t* scales, __m512 dmin, DecodedK* out) {
  // 16 bytes from the scales: the 4 past them are the block's next field, inside the block.
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // w0 w0 w1 w1
  const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));  // w2 w2 w2 w2
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 2, 0, 2)),
                                   _mm_setr_epi32(0x3F3F3F3F, 0x30303030, 0x3F3F3F3F, 0x30303030));
  const __m128i hi = _mm_and_si128(_mm_srlv_epi32(c, _mm_setr_epi32(0, 0, 0, 4)),
                                   _mm_setr_epi32(0, 0x0F0F0F0F, 0, 0x0F0F0F0F));
  const __m128i bytes = _mm_or_si128(lo, hi);  // scales 0..7, mins 0..7
  const __m512i all = _mm512_broadcast_i32x4(bytes);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    // words of 128-bit lanes 0, 1: scale 2 j; lanes 2, 3: scale 2 j + 1 (high bytes zero).
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(0x8000 | (2 * j))),
                                           _mm256_set1_epi16(static_cast<int16_t>(0x8000 | (2 * j + 1))), 1);
    out->sc[j] = _mm512_shuffle_epi8(all, idx);
  }
  // per-16 mins: sub-block s uses min s / 2
  const __m128i mn = _mm_shuffle_epi8(bytes, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
  out->mins = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)), dmin);
}

// Per-byte right shift of a broadcast 32-byte field: the low 32 bytes by s0, the high by s1.
TANDEM_AVX512_INLINE __m512i ShiftHalves(__m512i v, int s0, int s1) {
  const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(s0)),
                                            _mm256_set1_epi16(static_cast<int16_t>(s1)), 1);
  return _mm512_srlv_epi16(v, shifts);
}

TANDEM_AVX512_INLINE __m512i Broadcast32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

TANDEM_AVX512_INLINE void Decode(const BlockQ4_K& b, DecodedK* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v = Broadcast32(b.qs + 32 * j);
    out->q[j] = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), low4);
  }
  __m512 dmin;
  HalfPair(&b.d, &out->d, &dmin);
  Q4KScales(b.scales, dmin, out);
}

TANDEM_AVX512_INLINE void Decode(const BlockQ5_K& b, DecodedK* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i qh = Broadcast32(b.qh);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v = Broadcast32(b.qs + 32 * j);
    const __m512i low = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), low4);
    const __m512i high = _mm512_and_si512(ShiftHalves(qh, 2 * j, 2 * j + 1), one);
    out->q[j] = _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
  }
  __m512 dmin;
  HalfPair(&b.d, &out->d, &dmin);
  Q4KScales(b.scales, dmin, out);
}

TANDEM_AVX512_INLINE void Decode(const BlockQ2_K& b, DecodedK* out) {
  const __m512i three = _mm512_set1_epi8(3);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v = Broadcast32(b.qs + 32 * (j / 2));
    out->q[j] = _mm512_and_si512(ShiftHalves(v, 4 * (j % 2), 4 * (j % 2) + 2), three);
  }
  const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  SpreadScales16(_mm256_cvtepu8_epi16(_mm_and_si128(s, low4)), out->sc);
  __m512 dmin;
  HalfPair(&b.d, &out->d, &dmin);
  out->mins = MinsTimes(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), low4)), dmin);
}

TANDEM_AVX512_INLINE void Decode(const BlockQ3_K& b, DecodedK* out) {
  const __m512i three = _mm512_set1_epi8(3);
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i hmask = Broadcast32(b.hmask);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v = Broadcast32(b.qs + 32 * (j / 2));
    const __m512i low = _mm512_and_si512(ShiftHalves(v, 4 * (j % 2), 4 * (j % 2) + 2), three);
    const __m512i high = _mm512_and_si512(ShiftHalves(hmask, 2 * j, 2 * j + 1), one);
    out->q[j] = _mm512_or_si512(low, _mm512_slli_epi16(high, 2));
  }
  int8_t sc8[16];
  for (int i = 0; i < 16; ++i) sc8[i] = static_cast<int8_t>(UnpackQ3KScale(i, b.scales));
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc8)));
  SpreadScales16(sc16, out->sc);
  const float d = HalfAt(reinterpret_cast<const uint8_t*>(&b.d));
  out->d = _mm512_set1_ps(d);
  out->mins = MinsTimes(sc16, _mm512_set1_ps(4.0f * d));
}

TANDEM_AVX512_INLINE void Decode(const BlockQ6_K& b, DecodedK* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i three = _mm512_set1_epi8(3);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
    const __m512i qh = Broadcast32(b.qh + 32 * h);
    const __m512i low_a = _mm512_and_si512(ql, low4);                         // g = 0, 1
    const __m512i low_b = _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);   // g = 2, 3
    const __m512i high_a = _mm512_and_si512(ShiftHalves(qh, 0, 2), three);
    const __m512i high_b = _mm512_and_si512(ShiftHalves(qh, 4, 6), three);
    out->q[2 * h] = _mm512_or_si512(low_a, _mm512_slli_epi16(high_a, 4));
    out->q[2 * h + 1] = _mm512_or_si512(low_b, _mm512_slli_epi16(high_b, 4));
  }
  const __m256i sc16 =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  SpreadScales16(sc16, out->sc);
  const float d = HalfAt(reinterpret_cast<const uint8_t*>(&b.d));
  out->d = _mm512_set1_ps(d);
  out->mins = MinsTimes(sc16, _mm512_set1_ps(32.0f * d));
}

// NR outputs, each the sum over TERMS activation rows (acts[k * TERMS + t]). NR and TERMS are
// template parameters so that every loop below unrolls completely.
template <typename Block, int NR, int TERMS>
TANDEM_AVX512 void KQuantRowsN(const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                               int64_t blocks, const void* const* acts, float* const* out) {
  const ActivationBlockQ8K* a[NR * TERMS];
  for (int k = 0; k < NR * TERMS; ++k) a[k] = static_cast<const ActivationBlockQ8K*>(acts[k]);
  for (int64_t r = 0; r < row_count; ++r) {
    const Block* row = reinterpret_cast<const Block*>(weights + r * row_bytes);
    __m512 acc[NR];
#pragma GCC unroll 8
    for (int k = 0; k < NR; ++k) acc[k] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      // The hardware prefetchers alone leave too few misses in flight per core for a stream
      // interleaved with this much arithmetic; ask for the lines kPrefetchBytes ahead.
      const char* ahead = reinterpret_cast<const char*>(&row[b]) + kPrefetchBytes;
#pragma GCC unroll 4
      for (size_t line = 0; line < sizeof(Block); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
      DecodedK dk;
      Decode(row[b], &dk);
#pragma GCC unroll 8
      for (int k = 0; k < NR; ++k) {
        // Two partial sums halve the dependent FMA chain of a block.
        __m512 groups[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 2
        for (int t = 0; t < TERMS; ++t) {
          const ActivationBlockQ8K& ab = a[k * TERMS + t][b];
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) {
            const __m512i x = _mm512_load_si512(ab.qs + 64 * j);
            const __m512i isum = _mm512_madd_epi16(_mm512_maddubs_epi16(dk.q[j], x), dk.sc[j]);
            groups[j & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_load_ps(ab.lane_d[j]), groups[j & 1]);
          }
          acc[k] = _mm512_fnmadd_ps(dk.mins, _mm512_load_ps(ab.bsum_d), acc[k]);
        }
        acc[k] = _mm512_fmadd_ps(_mm512_add_ps(groups[0], groups[1]), dk.d, acc[k]);
      }
    }
#pragma GCC unroll 8
    for (int k = 0; k < NR; ++k) out[k][r] = _mm512_reduce_add_ps(acc[k]);
  }
}

// Q8_0 / Q4_0 block b of a row as 32 signed bytes.
TANDEM_AVX512 inline __m256i LegacyValues(const BlockQ8_0& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}
TANDEM_AVX512 inline __m256i LegacyValues(const BlockQ4_0& b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
  return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

template <typename Block, int NR>
TANDEM_AVX512 void LegacyRowsN(const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                               int64_t blocks, const void* const* acts, int terms, float* const* out) {
  const ActivationBlockQ8x32* a[NR * kMaxTerms];
  for (int k = 0; k < NR * terms; ++k) a[k] = static_cast<const ActivationBlockQ8x32*>(acts[k]);
  for (int64_t r = 0; r < row_count; ++r) {
    const Block* row = reinterpret_cast<const Block*>(weights + r * row_bytes);
    __m256 acc[NR];
    for (int k = 0; k < NR; ++k) acc[k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const __m256i w = LegacyValues(row[b]);
      const __m256i wabs = _mm256_abs_epi8(w);
      const float d = HalfAt(reinterpret_cast<const uint8_t*>(&row[b].d));
      for (int t = 0; t < terms; ++t) {
        for (int k = 0; k < NR; ++k) {
          const ActivationBlockQ8x32& ab = a[k * terms + t][b];
          const __m256i x = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs)), w);
          const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wabs, x);
          acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * ab.d), acc[k]);
        }
      }
    }
    for (int k = 0; k < NR; ++k) {
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[k]), _mm256_extractf128_ps(acc[k], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      out[k][r] = _mm_cvtss_f32(s);
    }
  }
}

// Runs the NR-specialised kernel for out_count = 1..kMaxRowBlock.
#define TANDEM_ROW_COUNT_CASES(FN, ...)                                       \
  switch (n) {                                                                \
    case 1: return FN<Block, 1 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    case 2: return FN<Block, 2 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    case 3: return FN<Block, 3 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    case 4: return FN<Block, 4 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    case 5: return FN<Block, 5 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    case 6: return FN<Block, 6 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    case 7: return FN<Block, 7 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
    default: return FN<Block, 8 __VA_OPT__(,) __VA_ARGS__>(w, rb, rc, nb, acts, ARGS); \
  }

template <typename Block>
void KQuantRows(const uint8_t* w, int64_t rb, int64_t rc, int64_t nb, const void* const* acts, int n,
                int terms, float* const* out) {
#define ARGS out
  if (terms == 1) {
    TANDEM_ROW_COUNT_CASES(KQuantRowsN, 1)
  }
  TANDEM_ROW_COUNT_CASES(KQuantRowsN, 2)
#undef ARGS
}

template <typename Block>
void LegacyRows(const uint8_t* w, int64_t rb, int64_t rc, int64_t nb, const void* const* acts, int n,
                int terms, float* const* out) {
#define ARGS terms, out
  TANDEM_ROW_COUNT_CASES(LegacyRowsN)
#undef ARGS
}

}  // namespace

RowDotKernel Avx512VnniKernel(WeightType type) {
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
