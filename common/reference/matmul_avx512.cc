// MatMul's AVX-512 variant: 16-wide dequantizers and a chunk dot over four zmm accumulators
// (accumulator a holds the contract's lanes 16 a .. 16 a + 15, so vector v of a chunk goes to
// accumulator v % 4), reduced by the contract's tree.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/reference/matmul_kernels.h"
#include "common/weights/block_layouts.h"
#include "common/weights/half.h"
#include "common/weights/weight_types.h"

#if defined(__x86_64__)

#include <immintrin.h>

// Everything from here on, matmul_rows.h included, is compiled for AVX-512 (see that header).
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (a self-initialised local) as the
// pass-through operand, which -Wmaybe-uninitialized reports at every use (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "common/reference/matmul_rows.h"

namespace tandem::matmul_internal {
namespace {

struct Avx512Ops {
  static constexpr bool kReferenceDequant = false;
  static constexpr int kWidth = 16;
  using I = __m512i;
  using F = __m512;

  static I LoadU8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I LoadI8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I LoadU16(const uint8_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadF16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static I And(I a, int32_t mask) { return _mm512_and_si512(a, _mm512_set1_epi32(mask)); }
  static I Add(I a, int32_t c) { return _mm512_add_epi32(a, _mm512_set1_epi32(c)); }
  static I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static I Srl(I a, int count) { return _mm512_srl_epi32(a, _mm_cvtsi32_si128(count)); }
  static I Shl(I a, int count) { return _mm512_sll_epi32(a, _mm_cvtsi32_si128(count)); }
  static F ToFloat(I a) { return _mm512_cvtepi32_ps(a); }
  static F AsFloat(I a) { return _mm512_castsi512_ps(a); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }

  static constexpr bool kHasLookup16 = true;
  static F Levels16() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static F Lookup16(F table, I index) { return _mm512_permutexvar_ps(index, table); }

  static float Reduce(F a0, F a1, F a2, F a3) {
    const F s16 = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    const __m256 low8 = _mm512_castps512_ps256(s16);
    const __m256 high8 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1));
    const __m256 s8 = _mm256_add_ps(low8, high8);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }

  static constexpr int kAccumulators = 4;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static F Fma(F a, F b, F acc) { return _mm512_fmadd_ps(a, b, acc); }
  static float ReduceAccumulators(const F* a) { return Reduce(a[0], a[1], a[2], a[3]); }

  static float DotChunk(const float* w, const float* x) {
    F a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int i = 0; i < kChunkElems; i += 64) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    return Reduce(a0, a1, a2, a3);
  }

  // Lanes past m load zeros; fma(0, 0, acc) leaves acc (never -0) unchanged.
  static float DotPartial(const float* w, const float* x, int64_t m) {
    F acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t i = 0, v = 0; i < m; i += 16, ++v) {
      const int64_t left = m - i;
      const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
      acc[v % 4] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w + i), _mm512_maskz_loadu_ps(mask, x + i), acc[v % 4]);
    }
    return Reduce(acc[0], acc[1], acc[2], acc[3]);
  }
};

}  // namespace

void MatMulRowsAvx512(const MatMulJob& job, int64_t row_begin, int64_t row_end) {
  MatMulRows<Avx512Ops>(job, row_begin, row_end);
}

}  // namespace tandem::matmul_internal

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif  // defined(__x86_64__)
