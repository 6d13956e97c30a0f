// The chunked gated delta rule for prefill (LaunchGdnChunked, gdn.cuh): kernels and launcher.
// The per-token kernels (conv, prepare, recurrent, gated norm) are in gdn.cu.
#include <algorithm>
#include <cstdint>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_chunked_mma_prep.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_chunked_mma_scan.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// ---- The chunked delta rule (prefill) ----------------------------------------------------------
// Two kernels per pass. GdnChunkPrepareKernel (exact mode; fast mode runs
// gdn_mma_prep::GdnChunkPrepareMmaKernel, gdn_chunked_mma_prep.cuh, with the same results), one
// block per (chunk, value head), fully parallel: the cumulative log decay G (double), A = strictly
// lower β_t·e^(G_t−G_i)·⟨k_t, k_i⟩, the UT transform T = (I + A)⁻¹ (in 16 × 16 blocks,
// gdn_mma_prep::SolveUtBlocked), and the state-free parts of the WY form:
// W' = −T·(β·e^G ⊙ K), U = T·(β ⊙ V), the masked q·k products e^(G_t−G_i)⟨q_t, k_i⟩ (i ≤ t) and
// the decay vectors e^(G_t), e^(G_last−G_t). Every exponent is a difference G_t − G_i with i ≤ t
// (or G_t itself), so each factor is ≤ 1: no overflow however strong the decay. Padded rows
// (t ≥ c in the last chunk) are all zero, so the second kernel needs no masks but the output's.
// GdnChunkScanKernel, one block per (value head, 32 state columns) (columns of S evolve
// independently), walks the chunks in order with its state tile in shared memory:
//   Δ = U + W'·S;  O = (e^G ⊙ Q)·S + Aqk·Δ;  S ← e^(G_last)·S + (e^(G_last−G) ⊙ K)ᵀ·Δ.
// All products are block-wide GEMMs on shared memory, f32 on the CUDA cores (exact mode). Fast mode
// runs the same step in gdn_mma_scan::GdnChunkScanMmaKernel (gdn_chunked_mma_scan.cuh): mma.sync
// with the operands of the next chunks prefetched, the state in registers.
constexpr int kChunkThreads = 256;
constexpr int kChunkLdT = kGdnChunk + 4;  // row stride of 64 × 64 tiles (the +4 breaks bank conflicts)
constexpr int kScanCols = 32;             // state columns per scan block
constexpr int kScanLd = kScanCols + 4;

__device__ __forceinline__ float4 Load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 Scale4(float4 v, float s) { return make_float4(v.x * s, v.y * s, v.z * s, v.w * s); }
__device__ __forceinline__ void Store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// C (M × N, row-major, stride ldc; shared or global memory) = [C +] A·B over the whole block of
// kChunkThreads threads. A(m, k) is A[m·lda + k] when kARow, else A[k·lda + m]; B(k, n) is
// B[k·ldb + n] when kBRow, else B[n·ldb + k]. Every thread writes only its own elements of C (and
// reads back only those when accumulating); no barrier inside. Strides are multiples of 4 and all
// pointers 16-byte aligned. Each thread owns TM consecutive rows and TN columns: groups of 4
// consecutive columns when B is row-major (float4 loads), columns strided by N/TN otherwise.
template <int M, int N, int K, bool kARow, bool kBRow, bool kAcc>
__device__ __forceinline__ void BlockGemmF32(const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
  constexpr int TN = N >= 128 ? 8 : 4;
  constexpr int TM = M * N / (kChunkThreads * TN);
  constexpr int NT = N / TN, MT = M / TM;
  static_assert(TM >= 1 && M % TM == 0 && MT * NT == kChunkThreads && K % 4 == 0, "tile shape");
  const int tn = threadIdx.x % NT, tm = threadIdx.x / NT;
  auto col = [tn](int j) { return kBRow ? ((j / 4) * NT + tn) * 4 + (j % 4) : tn + j * NT; };
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = kAcc ? C[(tm * TM + i) * ldc + col(j)] : 0.0f;
  }
#pragma unroll 2
  for (int k = 0; k < K; k += 4) {
    float a[TM][4], b[4][TN];
    if constexpr (kARow) {
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(A + (tm * TM + i) * lda + k);
        a[i][0] = v.x, a[i][1] = v.y, a[i][2] = v.z, a[i][3] = v.w;
      }
    } else if constexpr (TM % 4 == 0) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int i = 0; i < TM; i += 4) {
          const float4 v = *reinterpret_cast<const float4*>(A + (k + kk) * lda + tm * TM + i);
          a[i][kk] = v.x, a[i + 1][kk] = v.y, a[i + 2][kk] = v.z, a[i + 3][kk] = v.w;
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i][kk] = A[(k + kk) * lda + tm * TM + i];
      }
    }
    if constexpr (kBRow) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
          const float4 v = *reinterpret_cast<const float4*>(B + (k + kk) * ldb + col(j));
          b[kk][j] = v.x, b[kk][j + 1] = v.y, b[kk][j + 2] = v.z, b[kk][j + 3] = v.w;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(B + col(j) * ldb + k);
        b[0][j] = v.x, b[1][j] = v.y, b[2][j] = v.z, b[3][j] = v.w;
      }
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i][kk], b[kk][j], acc[i][j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) C[(tm * TM + i) * ldc + col(j)] = acc[i][j];
  }
}


template <int kD>
constexpr size_t ChunkPrepareSmemBytes() {
  return (2 * kGdnChunk * (kD + 4) + 2 * kGdnChunk * kChunkLdT) * sizeof(float) +
         kGdnChunk * (sizeof(double) + sizeof(float));
}

template <int kD>
constexpr size_t ChunkScanSmemBytes() {
  return (3 * kGdnChunk * (kD + 4) + kGdnChunk * kChunkLdT + (2 * kGdnChunk + kD) * kScanLd) * sizeof(float);
}

// Exact mode's prepare (fast mode's is gdn_mma_prep::GdnChunkPrepareMmaKernel): grid (chunks, nv).
// n counts the pass's tokens; outputs are indexed [chunk·nv + vh]. T by gdn_mma_prep::SolveUtBlocked.
template <int kD>
__global__ void __launch_bounds__(kChunkThreads)
GdnChunkPrepareKernel(const float* __restrict__ conv_out, const float* __restrict__ g,
                      const float* __restrict__ beta, int64_t n, int c_dim, int nk, int nv,
                      float* __restrict__ w_out, float* __restrict__ u_out, float* __restrict__ aqk_out,
                      float* __restrict__ decay_out) {
  PdlWaitForPrevious();  // pdl.cuh: the conv rows, gates and state are the step's
  PdlAllowNext();
  constexpr int C = kGdnChunk, LD = kD + 4, LT = kChunkLdT;
  static_assert(C * (kD / 4) % kChunkThreads == 0, "the copy loops have a fixed trip count");
  extern __shared__ __align__(128) float4 prep_smem[];
  float* ks = reinterpret_cast<float*>(prep_smem);  // C × LD: k, then −β·e^G·k
  float* qv = ks + C * LD;                          // C × LD: q, then β·v
  float* as = qv + C * LD;                          // C × LT: k·kᵀ, then A
  float* ts = as + C * LT;                          // C × LT: q·kᵀ, then T
  double* gd = reinterpret_cast<double*>(ts + C * LT);  // cumulative log decay G
  float* bs = reinterpret_cast<float*>(gd + C);         // β (0 on padded rows)
  const int tid = threadIdx.x, vh = blockIdx.y, group = vh / (nv / nk);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * C;
  const int c = static_cast<int>(min(static_cast<int64_t>(C), n - first));
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * nv + vh;

#pragma unroll
  for (int r = 0; r < C * (kD / 4) / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
    float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f), k = q;
    if (t < c) {
      const float* row = conv_out + (first + t) * c_dim;
      q = Load4(row + group * kD + i);
      k = Load4(row + (nk + group) * kD + i);
    }
    Store4(qv + t * LD + i, q);
    Store4(ks + t * LD + i, k);
  }
  if (tid < 32) gdn_mma_prep::ScanDecayAndBeta(g, beta, first, c, nv, vh, tid, gd, bs);
  __syncthreads();
  BlockGemmF32<C, C, kD, true, false, false>(ks, LD, ks, LD, as, LT);  // k·kᵀ
  BlockGemmF32<C, C, kD, true, false, false>(qv, LD, ks, LD, ts, LT);  // q·kᵀ
  __syncthreads();
  float* aqk = aqk_out + blk * C * C;
#pragma unroll
  for (int r = 0; r < C * C / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int t = idx / C, i = idx % C;
    const float e = i <= t ? expf(static_cast<float>(gd[t] - gd[i])) : 0.0f;
    aqk[idx] = e * ts[t * LT + i];
    as[t * LT + i] = i < t ? bs[t] * e * as[t * LT + i] : 0.0f;
    ts[t * LT + i] = i == t ? 1.0f : 0.0f;
  }
#pragma unroll
  for (int r = 0; r < C * (kD / 4) / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
    const float s = -bs[t] * expf(static_cast<float>(gd[t]));
    Store4(ks + t * LD + i, Scale4(*reinterpret_cast<const float4*>(ks + t * LD + i), s));
  }
  if (tid < C) {
    decay_out[blk * 2 * C + tid] = expf(static_cast<float>(gd[tid]));
    decay_out[blk * 2 * C + C + tid] = expf(static_cast<float>(gd[C - 1] - gd[tid]));
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < C * (kD / 4) / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < c) v = Scale4(Load4(conv_out + (first + t) * c_dim + 2 * nk * kD + vh * kD + i), bs[t]);
    Store4(qv + t * LD + i, v);
  }
  // T in 16 × 16 blocks inside `as`, then spread into ts as a plain lower triangular matrix.
  static_assert(kChunkLdT == gdn_mma_prep::kSolveLd, "one row stride");
  gdn_mma_prep::SolveUtBlocked(as, tid);
  __syncthreads();
#pragma unroll
  for (int r = 0; r < C * C / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int t = idx / C, i = idx % C, tb = t / 16, ib = i / 16;
    ts[t * LT + i] = tb < ib ? 0.0f : as[(16 * ib + t % 16) * LT + 16 * tb + i % 16];
  }
  __syncthreads();
  BlockGemmF32<C, kD, C, true, true, false>(ts, LT, ks, LD, w_out + blk * C * kD, kD);  // W' = −W
  BlockGemmF32<C, kD, C, true, true, false>(ts, LT, qv, LD, u_out + blk * C * kD, kD);  // U
}

// Grid (nv, dv / kScanCols). Walks the pass's chunks in order; state is S[nv][kD][kD].
template <int kD>
__global__ void __launch_bounds__(kChunkThreads)
GdnChunkScanKernel(const float* __restrict__ conv_out, int64_t n, int c_dim, int nk, int nv,
                   const float* __restrict__ w_in, const float* __restrict__ u_in,
                   const float* __restrict__ aqk_in, const float* __restrict__ decay_in, float* state,
                   float* __restrict__ o) {
  PdlWaitForPrevious();  // pdl.cuh: the conv rows, gates and state are the step's
  PdlAllowNext();
  constexpr int C = kGdnChunk, LD = kD + 4, LT = kChunkLdT, TV = kScanCols, LV = kScanLd;
  static_assert(kD * (TV / 4) % kChunkThreads == 0 && C * (TV / 4) % kChunkThreads == 0, "fixed trip counts");
  extern __shared__ __align__(128) float4 scan_smem[];
  float* ws = reinterpret_cast<float*>(scan_smem);  // C × LD: W'
  float* qs = ws + C * LD;                          // C × LD: e^G ⊙ q
  float* kps = qs + C * LD;                         // C × LD: e^(G_last−G) ⊙ k
  float* aq = kps + C * LD;                         // C × LT: masked decayed q·k
  float* ds = aq + C * LT;                          // C × LV: U, then Δ
  float* os = ds + C * LV;                          // C × LV: outputs
  float* ss = os + C * LV;                          // kD × LV: the state tile
  const int tid = threadIdx.x, vh = blockIdx.x, col0 = blockIdx.y * TV, group = vh / (nv / nk);
  float* S = state + static_cast<int64_t>(vh) * kD * kD + col0;
#pragma unroll
  for (int r = 0; r < kD * (TV / 4) / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int i = idx / (TV / 4), j = (idx % (TV / 4)) * 4;
    Store4(ss + i * LV + j, *reinterpret_cast<const float4*>(S + i * kD + j));
  }
  const int64_t chunks = (n + C - 1) / C;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t first = chunk * C, blk = chunk * nv + vh;
    const int c = static_cast<int>(min(static_cast<int64_t>(C), n - first));
    const float* decay = decay_in + blk * 2 * C;
    const float* w = w_in + blk * C * kD;
#pragma unroll
    for (int r = 0; r < C * (kD / 4) / kChunkThreads; ++r) {
      const int idx = tid + r * kChunkThreads;
      const int t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
      Store4(ws + t * LD + i, Load4(w + t * kD + i));
      float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f), k = q;
      if (t < c) {
        const float* row = conv_out + (first + t) * c_dim;
        q = Scale4(Load4(row + group * kD + i), __ldg(decay + t));
        k = Scale4(Load4(row + (nk + group) * kD + i), __ldg(decay + C + t));
      }
      Store4(qs + t * LD + i, q);
      Store4(kps + t * LD + i, k);
    }
    const float* aqk = aqk_in + blk * C * C;
#pragma unroll
    for (int r = 0; r < C * (C / 4) / kChunkThreads; ++r) {
      const int idx = tid + r * kChunkThreads;
      const int t = idx / (C / 4), i = (idx % (C / 4)) * 4;
      Store4(aq + t * LT + i, Load4(aqk + t * C + i));
    }
    const float* u = u_in + blk * C * kD + col0;
#pragma unroll
    for (int r = 0; r < C * (TV / 4) / kChunkThreads; ++r) {
      const int idx = tid + r * kChunkThreads;
      const int t = idx / (TV / 4), j = (idx % (TV / 4)) * 4;
      Store4(ds + t * LV + j, Load4(u + t * kD + j));
    }
    const float decay_all = __ldg(decay + C - 1);  // padded rows repeat G_last
    __syncthreads();
    BlockGemmF32<C, TV, kD, true, true, true>(ws, LD, ss, LV, ds, LV);    // Δ = U − W·S
    BlockGemmF32<C, TV, kD, true, true, false>(qs, LD, ss, LV, os, LV);   // O = (e^G ⊙ Q)·S
    __syncthreads();
    BlockGemmF32<C, TV, C, true, true, true>(aq, LT, ds, LV, os, LV);     // O += Aqk·Δ
#pragma unroll
    for (int r = 0; r < kD * TV / kChunkThreads; ++r) {
      const int idx = tid + r * kChunkThreads;
      ss[(idx / TV) * LV + idx % TV] *= decay_all;
    }
    __syncthreads();
    BlockGemmF32<kD, TV, C, false, true, true>(kps, LD, ds, LV, ss, LV);  // S += K'ᵀ·Δ
    for (int idx = tid; idx < c * (TV / 4); idx += kChunkThreads) {
      const int t = idx / (TV / 4), j = (idx % (TV / 4)) * 4;
      Store4(o + (first + t) * nv * kD + static_cast<int64_t>(vh) * kD + col0 + j,
             *reinterpret_cast<const float4*>(os + t * LV + j));
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < kD * (TV / 4) / kChunkThreads; ++r) {
    const int idx = tid + r * kChunkThreads;
    const int i = idx / (TV / 4), j = (idx % (TV / 4)) * 4;
    Store4(S + i * kD + j, *reinterpret_cast<const float4*>(ss + i * LV + j));
  }
}

}  // namespace

namespace {

// Floats of scratch per chunk of tokens: W', U (64 × dk each), Aqk (64 × 64), 2 × 64 decays, per
// value head.
int64_t ChunkScratchFloats(const GdnShape& d) {
  return static_cast<int64_t>(d.nv) * (kGdnChunk * (d.dk + d.dv) + kGdnChunk * kGdnChunk + 2 * kGdnChunk);
}

bool ChunkedShapeOk(const GdnShape& d) {
  return d.nk > 0 && d.nv > 0 && d.nv % d.nk == 0 && d.dk == d.dv && (d.dk == 64 || d.dk == 128);
}

template <GdnChunkPrecision P, int kD>
cudaError_t RunChunked(const float* conv_out, const float* g, const float* beta, int64_t n,
                       const GdnShape& d, float* scratch, int64_t chunks_per_pass, float* state,
                       float* o, cudaStream_t stream) {
  // Fast mode: the mma.sync prepare and scan; exact mode: f32 GEMMs.
  constexpr bool kFast = P == GdnChunkPrecision::kTf32;
  constexpr size_t prep_bytes = kFast ? gdn_mma_prep::Layout<kD>::kBytes : ChunkPrepareSmemBytes<kD>();
  constexpr size_t scan_bytes = kFast ? gdn_mma_scan::Layout<kD>::kBytes : ChunkScanSmemBytes<kD>();
  constexpr int prep_threads = kFast ? gdn_mma_prep::kThreads : kChunkThreads;
  constexpr int scan_threads = kFast ? gdn_mma_scan::kThreads : kChunkThreads;
  constexpr int scan_cols = kFast ? gdn_mma_scan::kCols : kScanCols;
  auto* prep = kFast ? gdn_mma_prep::GdnChunkPrepareMmaKernel<kD> : GdnChunkPrepareKernel<kD>;
  auto* scan = kFast ? gdn_mma_scan::GdnChunkScanMmaKernel<kD> : GdnChunkScanKernel<kD>;
  if (cudaError_t e = cudaFuncSetAttribute(prep, cudaFuncAttributeMaxDynamicSharedMemorySize, prep_bytes);
      e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = cudaFuncSetAttribute(scan, cudaFuncAttributeMaxDynamicSharedMemorySize, scan_bytes);
      e != cudaSuccess) {
    return e;
  }
  const int c_dim = d.c_dim();
  const int64_t tokens_per_pass = chunks_per_pass * kGdnChunk;
  for (int64_t t0 = 0; t0 < n; t0 += tokens_per_pass) {
    const int64_t np = std::min(tokens_per_pass, n - t0);
    const int64_t chunks = (np + kGdnChunk - 1) / kGdnChunk;
    float* w = scratch;
    float* u = w + chunks * d.nv * kGdnChunk * d.dk;
    float* aqk = u + chunks * d.nv * kGdnChunk * d.dv;
    float* decay = aqk + chunks * d.nv * kGdnChunk * kGdnChunk;
    const float* x = conv_out + t0 * c_dim;
    // The mma prepare kernel's grid is (nv, chunks): value heads sharing q and k run side by side.
    const dim3 prep_grid = kFast ? dim3(static_cast<unsigned>(d.nv), static_cast<unsigned>(chunks))
                                    : dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(d.nv));
    // PDL launches (pdl.cuh): each kernel waits for the one before it at its start, so the launch
    // latency between the conv, the passes and the gated norm overlaps the previous kernel's tail.
    if (cudaError_t e = LaunchPrefillPdl(prep, prep_grid, prep_threads, prep_bytes, stream, x, g + t0 * d.nv, beta + t0 * d.nv,
                                  np, c_dim, d.nk, d.nv, w, u, aqk, decay);
        e != cudaSuccess) {
      return e;
    }
    if (cudaError_t e = LaunchPrefillPdl(scan, dim3(static_cast<unsigned>(d.nv), static_cast<unsigned>(d.dv / scan_cols)),
                                  scan_threads, scan_bytes, stream, x, np, c_dim, d.nk, d.nv, w, u, aqk, decay, state,
                                  o + t0 * d.nv * d.dv);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

// The launcher's checks, then the passes.
cudaError_t LaunchChunked(const float* conv_out, const float* g, const float* beta, int64_t n, const GdnShape& d,
                          GdnChunkPrecision precision, void* scratch, int64_t scratch_bytes, float* state, float* o,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!ChunkedShapeOk(d)) return cudaErrorInvalidValue;
  const int64_t chunk_bytes = ChunkScratchFloats(d) * static_cast<int64_t>(sizeof(float));
  const int64_t scratch_chunks = scratch == nullptr ? 0 : scratch_bytes / chunk_bytes;
  if (scratch_chunks < 1 || reinterpret_cast<uintptr_t>(scratch) % 256 != 0) return cudaErrorInvalidValue;
  // The mma prepare kernel's grid has the chunks in y (at most 65535): longer passes are split.
  const int64_t chunks_per_pass = std::min<int64_t>(scratch_chunks, 65535);
  // The kernels read q, k, v and state rows as float4.
  if (reinterpret_cast<uintptr_t>(conv_out) % 16 != 0 || reinterpret_cast<uintptr_t>(state) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(o) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  float* s = static_cast<float*>(scratch);
  constexpr GdnChunkPrecision kF32 = GdnChunkPrecision::kF32, kTf32 = GdnChunkPrecision::kTf32;
  const bool exact = precision == kF32;
  if (d.dk == 128) {
    return exact ? RunChunked<kF32, 128>(conv_out, g, beta, n, d, s, chunks_per_pass, state, o, stream)
                 : RunChunked<kTf32, 128>(conv_out, g, beta, n, d, s, chunks_per_pass, state, o, stream);
  }
  return exact ? RunChunked<kF32, 64>(conv_out, g, beta, n, d, s, chunks_per_pass, state, o, stream)
               : RunChunked<kTf32, 64>(conv_out, g, beta, n, d, s, chunks_per_pass, state, o, stream);
}

}  // namespace

int64_t GdnChunkedScratchBytes(const GdnShape& d, int64_t max_tokens) {
  if (!ChunkedShapeOk(d) || max_tokens <= 0) return 0;
  const int64_t chunks = (max_tokens + kGdnChunk - 1) / kGdnChunk;
  return chunks * ChunkScratchFloats(d) * static_cast<int64_t>(sizeof(float));
}

cudaError_t LaunchGdnChunked(const float* conv_out, const float* g, const float* beta, int64_t n,
                             const GdnShape& d, GdnChunkPrecision precision, void* scratch,
                             int64_t scratch_bytes, float* state, float* o, cudaStream_t stream) {
  return LaunchChunked(conv_out, g, beta, n, d, precision, scratch, scratch_bytes, state, o, stream);
}

}  // namespace tandem::cuda
