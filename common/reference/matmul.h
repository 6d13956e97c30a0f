// y = W·x for a batch of activation rows, with W in any supported block format.
//
// x holds n rows of w.cols f32 values (row-major, row t at x + t * w.cols); y receives n rows of
// w.rows values (y[t * w.rows + r] = ⟨W row r, x row t⟩). Work is split over output rows on `pool`
// (nullptr: the calling thread). y must not alias x.
//
// Numerics (the contract every instruction set below implements bit for bit):
//  - W's elements are exactly DequantizeRow's f32 values (a Q-format matrix gives the same y as
//    its dequantized F32 copy).
//  - A dot product runs over chunks of 256 elements (the last one may be shorter: only F32 / F16 /
//    BF16 rows and Q4_0 / Q8_0 rows whose length is not a multiple of 256 have such a tail).
//    Within a chunk, element i is accumulated into f32 lane i % 64 with a fused multiply-add
//    (lanes start at +0, elements in increasing order); the 64 lanes are then summed by the tree
//      s16[k] = (l[k] + l[k + 16]) + (l[k + 32] + l[k + 48]),  s8[k] = s16[k] + s16[k + 8],
//      s4[k] = s8[k] + s8[k + 4],  s2[k] = s4[k] + s4[k + 2],  chunk = s2[0] + s2[1],
//    and the chunk sums are added in order in f64, rounded once to f32 at the end.
//  - So y[t, r] depends only on W row r and x row t: it is bitwise the same for every n, every
//    batch position, every thread count and every MatMulIsa.
// Error bound: each chunk sum carries at most 4 FMA roundings per lane plus 6 additions, so
// |y − exact| <= 2^-24·|exact| + γ10·Σ|w_i·x_i| (γ10 = 10·2^-24 / (1 − 10·2^-24) ≈ 6.0e-7), the
// f64 part adding nothing visible. On random data the relative L2 error is about 8e-8.
//
// Speed: with one activation row (decode) each 256-element chunk of a weight row is dequantized
// straight into the dot product's registers; with more, a chunk of four weight rows is
// dequantized once into an L1 buffer and dotted with up to 16 activation rows. There is no
// full-row dequantization pass. The vector variants are chosen at run time (AVX-512F, else
// AVX2 + FMA + F16C, else scalar); see docs/PERF.md ("CPU reference engine") for figures.
#ifndef TANDEM_COMMON_REFERENCE_MATMUL_H_
#define TANDEM_COMMON_REFERENCE_MATMUL_H_

#include <cstdint>
#include <string_view>

#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

void MatMul(const MatrixView& w, const float* x, int64_t n, float* y, ThreadPool* pool);

// The instruction sets MatMul can run on; all give the same bits (see above).
enum class MatMulIsa { kScalar, kAvx2, kAvx512 };

// Whether this CPU (and this build: the vector variants exist on x86-64 only) can run `isa`.
bool MatMulIsaSupported(MatMulIsa isa);
// The fastest supported one: what MatMul uses.
MatMulIsa BestMatMulIsa();
std::string_view MatMulIsaName(MatMulIsa isa);  // "scalar", "avx2", "avx512"

// MatMul on a given instruction set (tests and benchmarks); aborts if !MatMulIsaSupported(isa).
void MatMulWithIsa(MatMulIsa isa, const MatrixView& w, const float* x, int64_t n, float* y,
                   ThreadPool* pool);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_MATMUL_H_
