// The fast-mode (tf32) per-chunk preparation of the chunked gated delta rule: for one (chunk,
// value head) the masked decayed products A and Aqk, the UT transform T = (I + A)⁻¹ and the WY
// matrices W' and U, the same scratch as GdnChunkPrepareKernel in gdn_chunked.cu writes (the layout
// is described there). Included only by gdn_chunked.cu; LaunchGdnChunked in gdn.cuh is the interface.
//
// Why this shape: the earlier kernel (removed after it was measured) solved T row by row (63 dependent
// steps, each a warp shuffle reduction and a barrier) and ran its products through WMMA fragment
// loads with bank conflicts: 0.894 ms per layer at 8192 tokens (gdn_bench, H200), this one 0.321 ms
// (the ~0.6 GB it must read and write at about 1.9 TB/s). Here
//   - k·kᵀ and q·kᵀ (lower block triangle only), W' = T·(−β·e^G ⊙ K) and U = T·(β ⊙ V) are mma.sync
//     tf32 products with conflict-free fragment loads (row strides ≡ 8 (mod 32) for K, Q/V read as
//     float2 along the reduction, ≡ 4 for A/T); the β and decay scales are applied to the B fragments,
//     so K and V stay raw in shared memory; Aqk goes from the accumulators straight to device memory;
//   - T is solved in 16 × 16 blocks, f32 on the CUDA cores (as in exact mode: only the products are
//     tf32): the four diagonal blocks by forward substitution at once (one lane per column, the column
//     in registers: 15 dependent steps), then the blocks below the diagonal in three levels of small
//     products, T_ij = −T_ii·Σ_{j≤k<i} A_ik·T_kj. T shares one 64 × 64 array with A: T_ii overwrites
//     A_ii, and T_ij (i > j) is stored in the unused upper block (j, i);
//   - V is copied (cp.async) into Q's buffer once q·kᵀ is done, under the solve.
// 86 KB of shared memory at dk 128: two blocks per multiprocessor.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CHUNKED_MMA_PREP_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CHUNKED_MMA_PREP_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_chunked_mma_scan.cuh"

namespace tandem::cuda::gdn_mma_prep {

using gdn_mma_scan::CpAsync16;
using gdn_mma_scan::Mma;
using gdn_mma_scan::Tf32;

constexpr int kThreads = 256;  // 8 warps

// The chunk's cumulative log decay G (inclusive scan of g in double, two tokens per lane of warp
// 0) and its β, for tokens first .. first + c − 1 of value head vh; padded rows add 0 to G and
// have β = 0. Shared by the exact and the mma prepare kernels.
__device__ __forceinline__ void ScanDecayAndBeta(const float* __restrict__ g, const float* __restrict__ beta,
                                                 int64_t first, int c, int nv, int vh, int lane, double* gd,
                                                 float* bs) {
  const int t = 2 * lane;
  const double g0 = t < c ? g[(first + t) * nv + vh] : 0.0;
  const double g1 = t + 1 < c ? g[(first + t + 1) * nv + vh] : 0.0;
  double sum = g0 + g1;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const double y = __shfl_up_sync(0xFFFFFFFFu, sum, off);
    if (lane >= off) sum += y;
  }
  gd[t] = sum - g1;
  gd[t + 1] = sum;
  bs[t] = t < c ? beta[(first + t) * nv + vh] : 0.0f;
  bs[t + 1] = t + 1 < c ? beta[(first + t + 1) * nv + vh] : 0.0f;
}
constexpr int kSolveLd = kGdnChunk + 4;  // row stride of the A/T array (≡ 4 (mod 32))

// Shared-memory layout in floats.
template <int kD>
struct Layout {
  static constexpr int C = kGdnChunk;
  static constexpr int LK = kD + 8, LT = kSolveLd;
  static constexpr int kK = 0;                  // C × LK: k (raw; padded rows zero)
  static constexpr int kQV = kK + C * LK;       // C × LK: q, then v (raw; padded rows zero)
  static constexpr int kAT = kQV + C * LK;      // C × LT: A below the diagonal blocks, T elsewhere
  static constexpr int kScaleW = kAT + C * LT;  // −β·e^G per token
  static constexpr int kBeta = kScaleW + C;     // β per token (0 on padded rows)
  static constexpr int kG = kBeta + C;          // cumulative log decay G per token, as doubles
  static constexpr int kFloats = kG + 2 * C;
  static constexpr size_t kBytes = kFloats * sizeof(float);
  static_assert(kQV % 4 == 0 && kAT % 4 == 0 && kG % 2 == 0, "16-byte copies, 8-byte doubles");
};

__device__ __forceinline__ float2 Ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float4 Ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// The 16 × 16 block (i, j) of T, i > j, column c (this lane's): T_ij = −T_ii·Σ_{j≤k<i} A_ik·T_kj.
// at: the A/T array; T_kj lies in block (j, k) (the diagonal block when k == j); the result goes to
// block (j, i). Reads only blocks the earlier levels wrote, writes one nobody reads in this level.
__device__ __forceinline__ void SolveOffDiagonalBlock(float* at, int i, int j, int c) {
  constexpr int LT = kSolveLd;
  float x[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) x[r] = 0.0f;
  for (int k = j; k < i; ++k) {
    const float* a = at + 16 * i * LT + 16 * k;  // A_ik
    const float* t = at + 16 * j * LT + 16 * k;  // T_kj
    float tc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) tc[r] = t[r * LT + c];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
#pragma unroll
      for (int q = 0; q < 16; q += 4) {
        const float4 v = Ld4(a + r * LT + q);  // same address across the 16 lanes: a broadcast
        x[r] = fmaf(v.x, tc[q], x[r]);
        x[r] = fmaf(v.y, tc[q + 1], x[r]);
        x[r] = fmaf(v.z, tc[q + 2], x[r]);
        x[r] = fmaf(v.w, tc[q + 3], x[r]);
      }
    }
  }
  const float* tii = at + 16 * i * LT + 16 * i;  // unit lower triangular, zeros above stored
  float* out = at + 16 * j * LT + 16 * i;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    float y = 0.0f;
#pragma unroll
    for (int q = 0; q <= r; q += 4) {
      const float4 v = Ld4(tii + r * LT + q);
      y = fmaf(v.x, x[q], y);
      if (q + 1 <= r) y = fmaf(v.y, x[q + 1], y);
      if (q + 2 <= r) y = fmaf(v.z, x[q + 2], y);
      if (q + 3 <= r) y = fmaf(v.w, x[q + 3], y);
    }
    out[r * LT + c] = -y;
  }
}

// T = (I + A)⁻¹ in place in `at` (row stride kSolveLd): on entry A, strictly lower triangular,
// zeros on and above the diagonal of the diagonal blocks, visible to all threads; on exit (after the
// caller's next barrier) T_ii in the diagonal blocks and T_ij (i > j) in block (j, i); the blocks
// below the diagonal still hold A. Called by all threads of the block (it has barriers); uses 64.
__device__ __forceinline__ void SolveUtBlocked(float* at, int tid) {
  constexpr int LT = kSolveLd;
  // Diagonal blocks T_bb = (I + A_bb)⁻¹ by forward substitution: lane (b, j) keeps column j in x.
  if (tid < 64) {
    const int b = tid >> 4, j = tid & 15;
    float* blk_bb = at + 16 * b * LT + 16 * b;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < r; q += 4) {
        const float4 v = Ld4(blk_bb + r * LT + q);
        s = fmaf(v.x, x[q], s);
        if (q + 1 < r) s = fmaf(v.y, x[q + 1], s);
        if (q + 2 < r) s = fmaf(v.z, x[q + 2], s);
        if (q + 3 < r) s = fmaf(v.w, x[q + 3], s);
      }
      x[r] = r == j ? 1.0f : (r < j ? 0.0f : -s);
    }
    __syncwarp();  // both half-warps have read their A_bb
#pragma unroll
    for (int r = 0; r < 16; ++r) blk_bb[r * LT + j] = x[r];
  }
  __syncthreads();
  if (tid < 48) SolveOffDiagonalBlock(at, (tid >> 4) + 1, tid >> 4, tid & 15);  // T_10, T_21, T_32
  __syncthreads();
  if (tid < 32) SolveOffDiagonalBlock(at, (tid >> 4) + 2, tid >> 4, tid & 15);  // T_20, T_31
  __syncthreads();
  if (tid < 16) SolveOffDiagonalBlock(at, 3, 0, tid);  // T_30
}

// Grid (nv, chunks): the two value heads that share a k head are neighbours, so the second read of
// q and k comes from L2. n counts the pass's tokens; outputs are indexed [chunk·nv + vh] like
// GdnChunkPrepareKernel's.
template <int kD>
__global__ void __launch_bounds__(kThreads, 2)
GdnChunkPrepareMmaKernel(const float* __restrict__ conv_out, const float* __restrict__ g,
                         const float* __restrict__ beta, int64_t n, int c_dim, int nk, int nv,
                         float* __restrict__ w_out, float* __restrict__ u_out, float* __restrict__ aqk_out,
                         float* __restrict__ decay_out) {
  PdlWaitForPrevious();  // pdl.cuh: the conv rows and gates are the step's
  PdlAllowNext();
  using L = Layout<kD>;
  constexpr int C = kGdnChunk, LK = L::LK, LT = L::LT;
  static_assert(C == 64 && C * kD / 4 % kThreads == 0, "four 16-row blocks; fixed copy trip counts");
  extern __shared__ __align__(128) float4 mma_prep_smem[];
  float* sm = reinterpret_cast<float*>(mma_prep_smem);
  float* ks = sm + L::kK;
  float* qv = sm + L::kQV;
  float* at = sm + L::kAT;
  float* sw = sm + L::kScaleW;
  float* bs = sm + L::kBeta;
  double* gd = reinterpret_cast<double*>(sm + L::kG);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gr = lane >> 2, t4 = lane & 3;
  const int vh = blockIdx.x, group = vh / (nv / nk);
  const int64_t first = static_cast<int64_t>(blockIdx.y) * C, blk = static_cast<int64_t>(blockIdx.y) * nv + vh;
  const int c = static_cast<int>(min(static_cast<int64_t>(C), n - first));

  // q and k rows (padded rows zero-filled: the copy reads nothing for them).
#pragma unroll
  for (int r = 0; r < C * kD / 4 / kThreads; ++r) {
    const int idx = tid + r * kThreads, t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
    const bool valid = t < c;
    const float* row = conv_out + (first + (valid ? t : 0)) * c_dim;
    CpAsync16(ks + t * LK + i, row + (nk + group) * kD + i, valid);
    CpAsync16(qv + t * LK + i, row + group * kD + i, valid);
  }
  CpAsyncCommit();
  if (tid < 32) ScanDecayAndBeta(g, beta, first, c, nv, vh, tid, gd, bs);
  CpAsyncWait<0>();
  __syncthreads();
  if (tid < C) {
    const float eg = expf(static_cast<float>(gd[tid]));
    sw[tid] = -bs[tid] * eg;
    decay_out[blk * 2 * C + tid] = eg;
    decay_out[blk * 2 * C + C + tid] = expf(static_cast<float>(gd[C - 1] - gd[tid]));
  }

  // k·kᵀ and q·kᵀ on the lower block triangle. Warp: rows 16·rb.., column tiles 16·j + 8·h (j ≤ rb).
  // Within each k-step of 8 the reduction index is permuted (lane t4 takes 2·t4 and 2·t4 + 1 in
  // place of t4 and t4 + 4, in A and B alike) so that each lane's pair is one float2.
  const int rb = warp & 3, h = warp >> 2;
  {
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) kk[j][e] = qk[j][e] = 0.0f;
    }
    const float* ka = ks + (16 * rb + gr) * LK + 2 * t4;
    const float* qa = qv + (16 * rb + gr) * LK + 2 * t4;
    const float* kb = ks + (8 * h + gr) * LK + 2 * t4;
#pragma unroll 4
    for (int k0 = 0; k0 < kD; k0 += 8) {
      const float2 k_lo = Ld2(ka + k0), k_hi = Ld2(ka + 8 * LK + k0);
      const float2 q_lo = Ld2(qa + k0), q_hi = Ld2(qa + 8 * LK + k0);
      const uint32_t a_k[4] = {Tf32(k_lo.x), Tf32(k_hi.x), Tf32(k_lo.y), Tf32(k_hi.y)};
      const uint32_t a_q[4] = {Tf32(q_lo.x), Tf32(q_hi.x), Tf32(q_lo.y), Tf32(q_hi.y)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j <= rb) {
          const float2 b = Ld2(kb + 16 * j * LK + k0);
          const uint32_t b0 = Tf32(b.x), b1 = Tf32(b.y);
          Mma(kk[j], a_k, b0, b1);
          Mma(qk[j], a_q, b0, b1);
        }
      }
    }
    // Masks and decays: Aqk[t][i] = e^(G_t−G_i)·⟨q_t, k_i⟩ for i ≤ t (device memory, zeros in the
    // blocks above the diagonal too); A[t][i] = β_t·e^(G_t−G_i)·⟨k_t, k_i⟩ for i < t (shared).
    float* aqk = aqk_out + blk * C * C;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i0 = 16 * j + 8 * h + 2 * t4;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * rb + gr + 8 * half;
        float2 qo = make_float2(0.0f, 0.0f), ao = qo;
        if (j <= rb) {
          const double gt = gd[t];
          const float e0 = i0 <= t ? expf(static_cast<float>(gt - gd[i0])) : 0.0f;
          const float e1 = i0 + 1 <= t ? expf(static_cast<float>(gt - gd[i0 + 1])) : 0.0f;
          qo = make_float2(e0 * qk[j][2 * half], e1 * qk[j][2 * half + 1]);
          const float b = bs[t];
          ao = make_float2(i0 < t ? b * e0 * kk[j][2 * half] : 0.0f, i0 + 1 < t ? b * e1 * kk[j][2 * half + 1] : 0.0f);
          *reinterpret_cast<float2*>(at + t * LT + i0) = ao;
        }
        *reinterpret_cast<float2*>(aqk + t * C + i0) = qo;
      }
    }
  }
  __syncthreads();  // A complete; every read of q is done

  // v into q's buffer, under the solve.
#pragma unroll
  for (int r = 0; r < C * kD / 4 / kThreads; ++r) {
    const int idx = tid + r * kThreads, t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
    const bool valid = t < c;
    CpAsync16(qv + t * LK + i, conv_out + (first + (valid ? t : 0)) * c_dim + 2 * nk * kD + vh * kD + i, valid);
  }
  CpAsyncCommit();

  SolveUtBlocked(at, tid);
  CpAsyncWait<0>();
  __syncthreads();  // T complete, v in

  // W' = T·(−β·e^G ⊙ K) and U = T·(β ⊙ V): warp w owns output columns kNt·8·w.. of both, all rows.
  // T is block lower triangular: token block kb contributes to row blocks rb ≥ kb only.
  constexpr int kNt = kD / 64;  // n8 tiles per warp
  const int n0 = warp * 8 * kNt;
  float wacc[4][kNt][4], uacc[4][kNt][4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) wacc[r][nt][e] = uacc[r][nt][e] = 0.0f;
    }
  }
#pragma unroll
  for (int k0 = 0; k0 < C; k0 += 8) {
    const int kb = k0 / 16, kc = k0 % 16;
    const float s0 = sw[k0 + t4], s1 = sw[k0 + t4 + 4], b0 = bs[k0 + t4], b1 = bs[k0 + t4 + 4];
    uint32_t bw[kNt][2], bu[kNt][2];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const int col = n0 + 8 * nt + gr;
      bw[nt][0] = Tf32(ks[(k0 + t4) * LK + col] * s0);
      bw[nt][1] = Tf32(ks[(k0 + t4 + 4) * LK + col] * s1);
      bu[nt][0] = Tf32(qv[(k0 + t4) * LK + col] * b0);
      bu[nt][1] = Tf32(qv[(k0 + t4 + 4) * LK + col] * b1);
    }
#pragma unroll
    for (int r = kb; r < 4; ++r) {
      const float* tb = at + 16 * kb * LT + 16 * r + kc;  // T_{r,kb}: block (kb, r); diagonal when r == kb
      const uint32_t a[4] = {Tf32(tb[gr * LT + t4]), Tf32(tb[(gr + 8) * LT + t4]), Tf32(tb[gr * LT + t4 + 4]),
                             Tf32(tb[(gr + 8) * LT + t4 + 4])};
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        Mma(wacc[r][nt], a, bw[nt][0], bw[nt][1]);
        Mma(uacc[r][nt], a, bu[nt][0], bu[nt][1]);
      }
    }
  }
  float* w = w_out + blk * C * kD;
  float* u = u_out + blk * C * kD;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const int row = 16 * r + gr, col = n0 + 8 * nt + 2 * t4;
      *reinterpret_cast<float2*>(w + row * kD + col) = make_float2(wacc[r][nt][0], wacc[r][nt][1]);
      *reinterpret_cast<float2*>(w + (row + 8) * kD + col) = make_float2(wacc[r][nt][2], wacc[r][nt][3]);
      *reinterpret_cast<float2*>(u + row * kD + col) = make_float2(uacc[r][nt][0], uacc[r][nt][1]);
      *reinterpret_cast<float2*>(u + (row + 8) * kD + col) = make_float2(uacc[r][nt][2], uacc[r][nt][3]);
    }
  }
}

}  // namespace tandem::cuda::gdn_mma_prep

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CHUNKED_MMA_PREP_CUH_
