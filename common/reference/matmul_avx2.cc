// MatMul's AVX2 variant: 8-wide dequantizers and a chunk dot over eight ymm accumulators
// (accumulator a holds the contract's lanes 8 a .. 8 a + 7, so vector v of a chunk goes to
// accumulator v % 8), reduced by the contract's tree.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/reference/matmul_kernels.h"
#include "common/weights/block_layouts.h"
#include "common/weights/half.h"
#include "common/weights/weight_types.h"

#if defined(__x86_64__)

#include <immintrin.h>

// Everything from here on, matmul_rows.h included, is compiled for AVX2 (see that header).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "common/reference/matmul_rows.h"

namespace tandem::matmul_internal {
namespace {

struct Avx2Ops {
  static constexpr bool kReferenceDequant = false;
  static constexpr int kWidth = 8;
  using I = __m256i;
  using F = __m256;

  static __m128i Load8Bytes(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
  static I LoadU8(const uint8_t* p) { return _mm256_cvtepu8_epi32(Load8Bytes(p)); }
  static I LoadI8(const uint8_t* p) { return _mm256_cvtepi8_epi32(Load8Bytes(p)); }
  static I LoadU16(const uint8_t* p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F LoadF16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I And(I a, int32_t mask) { return _mm256_and_si256(a, _mm256_set1_epi32(mask)); }
  static I Add(I a, int32_t c) { return _mm256_add_epi32(a, _mm256_set1_epi32(c)); }
  static I Or(I a, I b) { return _mm256_or_si256(a, b); }
  static I Srl(I a, int count) { return _mm256_srl_epi32(a, _mm_cvtsi32_si128(count)); }
  static I Shl(I a, int count) { return _mm256_sll_epi32(a, _mm_cvtsi32_si128(count)); }
  static F ToFloat(I a) { return _mm256_cvtepi32_ps(a); }
  static F AsFloat(I a) { return _mm256_castsi256_ps(a); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static constexpr bool kHasLookup16 = false;  // vpermps has 8 entries

  // The contract's s16 lanes 0..7 are (a0 + a2) + (a4 + a6), lanes 8..15 (a1 + a3) + (a5 + a7).
  static float Reduce(const F* a) {
    const F low8 = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[4], a[6]));
    const F high8 = _mm256_add_ps(_mm256_add_ps(a[1], a[3]), _mm256_add_ps(a[5], a[7]));
    const F s8 = _mm256_add_ps(low8, high8);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }

  static constexpr int kAccumulators = 8;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static F Fma(F a, F b, F acc) { return _mm256_fmadd_ps(a, b, acc); }
  static float ReduceAccumulators(const F* a) { return Reduce(a); }

  static float DotChunk(const float* w, const float* x) {
    F a[8];
    for (F& v : a) v = _mm256_setzero_ps();
    for (int i = 0; i < kChunkElems; i += 64) {
      for (int k = 0; k < 8; ++k) a[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), a[k]);
    }
    return Reduce(a);
  }

  // Lanes past m load zeros; fma(0, 0, acc) leaves acc (never -0) unchanged.
  static float DotPartial(const float* w, const float* x, int64_t m) {
    const __m256i lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    F a[8];
    for (F& v : a) v = _mm256_setzero_ps();
    for (int64_t i = 0, v = 0; i < m; i += 8, ++v) {
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(m - i)), lane_index);
      a[v % 8] = _mm256_fmadd_ps(_mm256_maskload_ps(w + i, mask), _mm256_maskload_ps(x + i, mask), a[v % 8]);
    }
    return Reduce(a);
  }
};

}  // namespace

void MatMulRowsAvx2(const MatMulJob& job, int64_t row_begin, int64_t row_end) {
  MatMulRows<Avx2Ops>(job, row_begin, row_end);
}

}  // namespace tandem::matmul_internal

#pragma GCC pop_options

#endif  // defined(__x86_64__)
