// AVX-512 VNNI kernels (Ice Lake / Sapphire Rapids / Zen 4). K-quants: each 64-element quarter of
// a super-block is decoded once into unsigned bytes. Q4_K / Q5_K (one scale per 32 elements, like
// the activations): vpdpbusd sums four products per int32 lane, and each lane meets its
// activation scale and its weight scale (d sc, from the block's scales converted once) in f32;
// the mins meet the activations' scaled per-16 sums. Q2_K / Q3_K / Q6_K (scales per 16):
// vpmaddubsw (pairs into int16; at most 2 * 63 * 127, no saturation) and vpmaddwd with the int16
// sub-block scales into int32 lanes of one 32-element group each, which then meet the groups'
// activation scales in f32. Two-term rows (down's input) are folded into one int32 sum per lane
// where lo's scales are hi's / 256 (activation_blocks.h). Q8_0 / Q4_0: vpdpbusd on |w| and
// sign-adjusted activations, 32 elements per block.
// GCC 12 warns about the deliberately undefined upper halves inside its own intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

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

// How far ahead of the block being decoded the weight stream is prefetched into L1, and (when
// non-zero) how far ahead a second prefetch asks for it into L2 only (docs/PERF.md). The
// environment variable TANDEM_WORKER_PREFETCH="L1[,L2]" (bytes) overrides the defaults, read once,
// so the distances can be compared on one machine without rebuilding.
struct PrefetchPlan {
  size_t l1_bytes = TANDEM_PREFETCH_BYTES;
  size_t l2_bytes = 0;
};

PrefetchPlan ReadPrefetchPlan() {
  PrefetchPlan plan;
  if (const char* env = std::getenv("TANDEM_WORKER_PREFETCH"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    plan.l1_bytes = std::strtoul(env, &end, 10);
    if (end != nullptr && *end == ',') plan.l2_bytes = std::strtoul(end + 1, nullptr, 10);
  }
  return plan;
}

const PrefetchPlan kPrefetch = ReadPrefetchPlan();

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

// Q4_K / Q5_K scales and mins as 16 bytes (scales 0..7, mins 0..7), in vector registers (no
// scalar unpacking, no stack round trip). The 12 scale bytes are three little-endian words w0,
// w1, w2 (UnpackQ4KScaleBytes): scales 0-3 = w0 & 0x3F.., 4-7 = (w2 & 0x0F..) | ((w0 >> 2) &
// 0x30..), mins alike from w1 and w2 >> 4.
TANDEM_AVX512_INLINE __m128i Q4KScaleBytes(const uint8_t* scales) {
  // 16 bytes from the scales: the 4 past them are the block's next field, inside the block.
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // w0 w0 w1 w1
  const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));  // w2 w2 w2 w2
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 2, 0, 2)),
                                   _mm_setr_epi32(0x3F3F3F3F, 0x30303030, 0x3F3F3F3F, 0x30303030));
  const __m128i hi = _mm_and_si128(_mm_srlv_epi32(c, _mm_setr_epi32(0, 0, 0, 4)),
                                   _mm_setr_epi32(0, 0x0F0F0F0F, 0, 0x0F0F0F0F));
  return _mm_or_si128(lo, hi);
}

// The DecodedK scale lanes and mins from Q4KScaleBytes: each 32-element scale covers 16 word
// lanes of one quarter, so a byte shuffle of the broadcast bytes yields each quarter's int16
// lanes directly.
TANDEM_AVX512_INLINE void Q4KScales(const uint8_t* scales, __m512 dmin, DecodedK* out) {
  const __m128i bytes = Q4KScaleBytes(scales);
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

// The four quarters' unsigned values of a Q4_K / Q5_K block, in element order.
TANDEM_AVX512_INLINE void DecodeValues(const BlockQ4_K& b, __m512i* q) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v = Broadcast32(b.qs + 32 * j);
    q[j] = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), low4);
  }
}

TANDEM_AVX512_INLINE void DecodeValues(const BlockQ5_K& b, __m512i* q) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i qh = Broadcast32(b.qh);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v = Broadcast32(b.qs + 32 * j);
    const __m512i low = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4), low4);
    const __m512i high = _mm512_and_si512(ShiftHalves(qh, 2 * j, 2 * j + 1), one);
    q[j] = _mm512_or_si512(low, _mm512_slli_epi16(high, 4));
  }
}

TANDEM_AVX512_INLINE void Decode(const BlockQ4_K& b, DecodedK* out) {
  DecodeValues(b, out->q);
  __m512 dmin;
  HalfPair(&b.d, &out->d, &dmin);
  Q4KScales(b.scales, dmin, out);
}

TANDEM_AVX512_INLINE void Decode(const BlockQ5_K& b, DecodedK* out) {
  DecodeValues(b, out->q);
  __m512 dmin;
  HalfPair(&b.d, &out->d, &dmin);
  Q4KScales(b.scales, dmin, out);
}

// Q4_K / Q5_K for the dot-product path (DotsQ4K below): values as above, and the block's scales
// as floats already multiplied by d and dmin: lanes 0-7 d * sc[g], lanes 8-15 dmin * mn[g] for
// the eight 32-element groups g.
struct DecodedQ4K {
  __m512i q[4];
  __m512 scaled;
};

template <typename Block>
TANDEM_AVX512_INLINE void DecodeQ4K(const Block& b, DecodedQ4K* out) {
  DecodeValues(b, out->q);
  const __m512 all = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(Q4KScaleBytes(b.scales)));
  uint32_t bits;
  std::memcpy(&bits, &b.d, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));  // d, dmin
  const __m512 d_dmin = _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_castps128_ps512(f));
  out->scaled = _mm512_mul_ps(all, d_dmin);
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

// The sums of 16-lane accumulators a, b, c, d into out[0..3], by one fixed tree per accumulator
// (each row's lanes are added in the same order whichever rows share the call, so a result does
// not depend on how rows were grouped or split between threads). About 15 instructions for four
// rows instead of about 10 per row.
TANDEM_AVX512_INLINE __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // 128-bit lane k: four partial sums of row k
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), s));
}

TANDEM_AVX512_INLINE float ReduceOne(__m512 a) {
  const __m512 z = _mm512_setzero_ps();
  return _mm_cvtss_f32(Reduce4(a, z, z, z));
}

// The hardware prefetchers alone leave too few misses in flight per core for a stream
// interleaved with this much arithmetic; ask for the lines of the block ahead (kPrefetch).
template <typename Block>
TANDEM_AVX512_INLINE void PrefetchAhead(const Block& w) {
  const char* ahead = reinterpret_cast<const char*>(&w) + kPrefetch.l1_bytes;
#pragma GCC unroll 4
  for (size_t line = 0; line < sizeof(Block); line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
  if (kPrefetch.l2_bytes != 0) {
    const char* far = reinterpret_cast<const char*>(&w) + kPrefetch.l2_bytes;
#pragma GCC unroll 4
    for (size_t line = 0; line < sizeof(Block); line += 64) _mm_prefetch(far + line, _MM_HINT_T1);
  }
}

// Adds one weight super-block's dot products with NR outputs' activation blocks b into
// acc[k][0] (acc[k][1] is the Q4_K path's second chain). TERMS activation rows per output
// (acts[k * TERMS + t]); FOLD (TERMS = 2, lo's scales exactly hi's / 256: activation_blocks.h)
// meets hi with 256 x the weight scales and lo with the plain ones in one exact int32 sum per
// lane (vpmaddwd + vpdpwssd), then one convert and one FMA per quarter instead of two:
// |lane| <= 2 * 16002 * 32768 + 2 * 16002 * 128 < 2^31 for every type.
template <typename Block, int NR, int TERMS, bool FOLD>
TANDEM_AVX512_INLINE void BlockDots(const Block& w, const ActivationBlockQ8K* const* a, int64_t b, __m512 (*acc)[2]) {
  PrefetchAhead(w);
  DecodedK dk;
  Decode(w, &dk);
  __m512i sc_hi[4];
  if constexpr (FOLD) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) sc_hi[j] = _mm512_slli_epi16(dk.sc[j], 8);
  }
#pragma GCC unroll 8
  for (int k = 0; k < NR; ++k) {
    // Two partial sums halve the dependent FMA chain of a block.
    __m512 groups[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    if constexpr (FOLD) {
      const ActivationBlockQ8K& hi = a[2 * k][b];
      const ActivationBlockQ8K& lo = a[2 * k + 1][b];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i ph = _mm512_maddubs_epi16(dk.q[j], _mm512_load_si512(hi.qs + 64 * j));
        const __m512i pl = _mm512_maddubs_epi16(dk.q[j], _mm512_load_si512(lo.qs + 64 * j));
        const __m512i isum = _mm512_dpwssd_epi32(_mm512_madd_epi16(ph, sc_hi[j]), pl, dk.sc[j]);
        groups[j & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_load_ps(lo.lane_d[j]), groups[j & 1]);
      }
      acc[k][0] = _mm512_fnmadd_ps(dk.mins, _mm512_load_ps(hi.bsum_d), acc[k][0]);
      acc[k][0] = _mm512_fnmadd_ps(dk.mins, _mm512_load_ps(lo.bsum_d), acc[k][0]);
    } else {
#pragma GCC unroll 2
      for (int t = 0; t < TERMS; ++t) {
        const ActivationBlockQ8K& ab = a[k * TERMS + t][b];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512i x = _mm512_load_si512(ab.qs + 64 * j);
          const __m512i isum = _mm512_madd_epi16(_mm512_maddubs_epi16(dk.q[j], x), dk.sc[j]);
          groups[j & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_load_ps(ab.lane_d[j]), groups[j & 1]);
        }
        acc[k][0] = _mm512_fnmadd_ps(dk.mins, _mm512_load_ps(ab.bsum_d), acc[k][0]);
      }
    }
    acc[k][0] = _mm512_fmadd_ps(_mm512_add_ps(groups[0], groups[1]), dk.d, acc[k][0]);
  }
}

// Q4_K / Q5_K (one scale per 32 elements, like the activations): vpdpbusd sums each lane's four
// products straight into int32 (no vpmaddubsw / vpmaddwd pair, no int16 scale lanes), and the
// weight scale meets the lane in f32 with the activation's: lane x lane_d x (d sc), where d sc
// comes from one permute of the block's scaled scales per quarter. d and dmin are folded into
// those scales, so nothing is left per block but the mins; two accumulator chains per output.
// FOLD: 256 x (hi's lane sum) + lo's lane sum in int32 (|lane| <= 4 * 31 * 127 * 257 < 2^31).
template <typename Block, int NR, int TERMS, bool FOLD>
TANDEM_AVX512_INLINE void BlockDotsQ4K(const Block& w, const ActivationBlockQ8K* const* a, int64_t b, __m512 (*acc)[2]) {
  PrefetchAhead(w);
  DecodedQ4K dk;
  DecodeQ4K(w, &dk);
  __m512 ws[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    // lanes 0-7 (elements 64 j .. 64 j + 31): group 2 j; lanes 8-15: group 2 j + 1
    ws[j] = _mm512_permutexvar_ps(_mm512_inserti64x4(_mm512_set1_epi32(2 * j), _mm256_set1_epi32(2 * j + 1), 1),
                                  dk.scaled);
  }
  // per-16 mins: sub-block s uses min s / 2 (lane 8 + s / 2 of scaled)
  const __m512 mins = _mm512_permutexvar_ps(
      _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), dk.scaled);
#pragma GCC unroll 8
  for (int k = 0; k < NR; ++k) {
    if constexpr (FOLD) {
      const ActivationBlockQ8K& hi = a[2 * k][b];
      const ActivationBlockQ8K& lo = a[2 * k + 1][b];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i ih = _mm512_dpbusd_epi32(_mm512_setzero_si512(), dk.q[j], _mm512_load_si512(hi.qs + 64 * j));
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_slli_epi32(ih, 8), dk.q[j], _mm512_load_si512(lo.qs + 64 * j));
        acc[k][j & 1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_load_ps(lo.lane_d[j])), ws[j],
                                        acc[k][j & 1]);
      }
      acc[k][1] = _mm512_fnmadd_ps(mins, _mm512_load_ps(hi.bsum_d), acc[k][1]);
      acc[k][0] = _mm512_fnmadd_ps(mins, _mm512_load_ps(lo.bsum_d), acc[k][0]);
    } else {
#pragma GCC unroll 2
      for (int t = 0; t < TERMS; ++t) {
        const ActivationBlockQ8K& ab = a[k * TERMS + t][b];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), dk.q[j], _mm512_load_si512(ab.qs + 64 * j));
          acc[k][j & 1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_load_ps(ab.lane_d[j])), ws[j],
                                          acc[k][j & 1]);
        }
        acc[k][1] = _mm512_fnmadd_ps(mins, _mm512_load_ps(ab.bsum_d), acc[k][1]);
      }
    }
  }
}

template <typename Block>
constexpr bool kQ4KPath = std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K>;

template <typename Block, int NR, int TERMS, bool FOLD>
TANDEM_AVX512_INLINE void AnyBlockDots(const Block& w, const ActivationBlockQ8K* const* a, int64_t b, __m512 (*acc)[2]) {
  if constexpr (kQ4KPath<Block>) {
    BlockDotsQ4K<Block, NR, TERMS, FOLD>(w, a, b, acc);
  } else {
    BlockDots<Block, NR, TERMS, FOLD>(w, a, b, acc);
  }
}

// NR outputs, each the sum over TERMS activation rows. NR, TERMS and FOLD are template parameters
// so that every loop below unrolls completely. At one output (decode's common case, where a
// down row is only two super-blocks) four weight rows are reduced together.
template <typename Block, int NR, int TERMS, bool FOLD>
TANDEM_AVX512 void KQuantRowsN(const uint8_t* weights, int64_t row_bytes, int64_t row_count,
                               int64_t blocks, const void* const* acts, float* const* out) {
  const ActivationBlockQ8K* a[NR * TERMS];
  for (int k = 0; k < NR * TERMS; ++k) a[k] = static_cast<const ActivationBlockQ8K*>(acts[k]);
  int64_t r = 0;
  if constexpr (NR == 1) {
    for (; r + 4 <= row_count; r += 4) {
      __m512 acc[4][1][2];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        acc[i][0][0] = acc[i][0][1] = _mm512_setzero_ps();
        const Block* row = reinterpret_cast<const Block*>(weights + (r + i) * row_bytes);
        for (int64_t b = 0; b < blocks; ++b) AnyBlockDots<Block, 1, TERMS, FOLD>(row[b], a, b, acc[i]);
      }
      _mm_storeu_ps(out[0] + r, Reduce4(_mm512_add_ps(acc[0][0][0], acc[0][0][1]), _mm512_add_ps(acc[1][0][0], acc[1][0][1]),
                                        _mm512_add_ps(acc[2][0][0], acc[2][0][1]), _mm512_add_ps(acc[3][0][0], acc[3][0][1])));
    }
  }
  for (; r < row_count; ++r) {
    const Block* row = reinterpret_cast<const Block*>(weights + r * row_bytes);
    __m512 acc[NR][2];
#pragma GCC unroll 8
    for (int k = 0; k < NR; ++k) acc[k][0] = acc[k][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) AnyBlockDots<Block, NR, TERMS, FOLD>(row[b], a, b, acc);
#pragma GCC unroll 8
    for (int k = 0; k < NR; ++k) out[k][r] = ReduceOne(_mm512_add_ps(acc[k][0], acc[k][1]));
  }
}

// Whether every lo row's scales are exactly its hi row's / 256 (the Q8K two-term rows of
// activation_blocks.h), so that FOLD applies.
bool LoScalesAreHiOver256(const void* const* acts, int n, int64_t blocks) {
  for (int k = 0; k < n; ++k) {
    const auto* hi = static_cast<const ActivationBlockQ8K*>(acts[2 * k]);
    const auto* lo = static_cast<const ActivationBlockQ8K*>(acts[2 * k + 1]);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int g = 0; g < 8; ++g) {
        if (lo[b].d[g] * 256.0f != hi[b].d[g]) return false;
      }
    }
  }
  return true;
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
    TANDEM_ROW_COUNT_CASES(KQuantRowsN, 1, false)
  }
  if (LoScalesAreHiOver256(acts, n, nb)) {
    TANDEM_ROW_COUNT_CASES(KQuantRowsN, 2, true)
  }
  TANDEM_ROW_COUNT_CASES(KQuantRowsN, 2, false)
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
