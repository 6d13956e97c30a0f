// The fast-mode (tf32) inter-chunk scan of the chunked gated delta rule, on mma.sync tensor-core
// instructions with the next chunks' operands prefetched by cp.async. Included only by
// gdn_chunked.cu, whose prepare kernel writes the scratch this reads (the layout is described
// there); LaunchGdnChunked in gdn.cuh is the interface.
//
// Why this shape: the scan is the only sequential part of the chunked form. One block per (value
// head, 32 state columns) walks the chunks in order, so a chunk's step is latency-bound: the
// loads of the chunk's W', q, k and Aqk (120 KB per block at dk 128) must not sit on the path of
// the state's recurrence. They are issued one chunk (W', k, decays: double-buffered) or half a step
// (q, Aqk: single-buffered, refilled as soon as their last reader is past) ahead. The state tile
// lives in registers as the accumulators of its own update, mirrored (rounded to tf32) in shared
// memory for the products that read it as an operand.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CHUNKED_MMA_SCAN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CHUNKED_MMA_SCAN_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::gdn_mma_scan {

constexpr int kThreads = 256;  // 8 warps
constexpr int kCols = 32;      // state columns per block

__device__ __forceinline__ void CpAsync16(float* smem_dst, const float* src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ uint32_t Tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float Tf32f(float x) { return __uint_as_float(Tf32(x)); }

// d += a·b for one m16n8k8 tile. Fragments (PTX ISA, mma.m16n8k8 .tf32), g = lane/4, t = lane%4:
// a = {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]}, b = {B[t][g], B[t+4][g]},
// d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory layout in floats. Row strides: ≡ 4 (mod 32) for tiles read as a row-major A
// operand (W', q, Aqk), ≡ 8 (mod 32) for those read transposed (k) or as B (the state mirror, Δ):
// either way the 32 lanes of a fragment load hit 32 distinct banks.
template <int kD>
struct Layout {
  static constexpr int C = kGdnChunk;
  static constexpr int LW = kD + 4, LK = kD + 8, LA = C + 4, LS = kCols + 8;
  static constexpr int kW = 0;                    // 2 stages × C × LW: W'
  static constexpr int kK = kW + 2 * C * LW;      // 2 stages × C × LK: k (raw)
  static constexpr int kDec = kK + 2 * C * LK;    // 2 stages × 2C: e^G, e^(G_last−G)
  static constexpr int kQ = kDec + 4 * C;         // C × LW: q (raw)
  static constexpr int kA = kQ + C * LW;          // C × LA: masked decayed q·k
  static constexpr int kS = kA + C * LA;          // kD × LS: the state tile, tf32
  static constexpr int kDelta = kS + kD * LS;     // C × LS: Δ, tf32
  static constexpr int kFloats = kDelta + C * LS;
  static constexpr size_t kBytes = kFloats * sizeof(float);
  static_assert(kW % 4 == 0 && kK % 4 == 0 && kDec % 4 == 0 && kQ % 4 == 0 && kA % 4 == 0, "16-byte copies");
};

// Grid (nv, kD / kCols), kThreads threads. Same arguments and results as GdnChunkScanKernel in
// gdn_chunked.cu: walks the pass's chunks in order; per chunk
//   Δ = U + W'·S;  O = e^G ⊙ (Q·S) + Aqk·Δ;  S ← e^(G_last)·S + (e^(G_last−G) ⊙ K)ᵀ·Δ.
// Warp roles: for Δ and O, warp w owns rows 16·(w%4).. and columns 16·(w/4).. of the block's 32;
// for S, warp w owns 16 rows (and, at dk 64, half the columns).
template <int kD>
__global__ void __launch_bounds__(kThreads, 1)
GdnChunkScanMmaKernel(const float* __restrict__ conv_out, int64_t n, int c_dim, int nk, int nv,
                      const float* __restrict__ w_in, const float* __restrict__ u_in,
                      const float* __restrict__ aqk_in, const float* __restrict__ decay_in, float* state,
                      float* __restrict__ o) {
  PdlWaitForPrevious();  // pdl.cuh: the prepared chunks and the state are the step's
  PdlAllowNext();
  using L = Layout<kD>;
  constexpr int C = kGdnChunk, LW = L::LW, LK = L::LK, LA = L::LA, LS = L::LS;
  constexpr int kSWarpsPerRowTile = 8 * 16 / kD;  // warps sharing 16 state rows: 1 (dk 128) or 2
  constexpr int kSNt = kCols / 8 / kSWarpsPerRowTile;  // n8 tiles of the state per warp
  static_assert(C * kD / 4 % kThreads == 0 && C * C / 4 % kThreads == 0, "fixed copy trip counts");
  extern __shared__ __align__(128) float4 mma_scan_smem[];
  float* sm = reinterpret_cast<float*>(mma_scan_smem);
  const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, t4 = tid & 3;
  const int vh = blockIdx.x, col0 = blockIdx.y * kCols, group = vh / (nv / nk);
  const int64_t chunks = (n + C - 1) / C;
  auto rows_in = [&](int64_t chunk) { return static_cast<int>(min(static_cast<int64_t>(C), n - chunk * C)); };

  // Copies of one chunk's operands; every call commits one group (empty past the last chunk), so
  // that the wait counts below hold at any chunk.
  auto issue_w_k_decay = [&](int64_t chunk) {
    if (chunk < chunks) {
      const int stage = static_cast<int>(chunk & 1), c = rows_in(chunk);
      const int64_t first = chunk * C, blk = chunk * nv + vh;
      const float* w = w_in + blk * C * kD;
      const float* k = conv_out + (nk + group) * kD;
      float* ws = sm + L::kW + stage * C * LW;
      float* ks = sm + L::kK + stage * C * LK;
#pragma unroll
      for (int r = 0; r < C * kD / 4 / kThreads; ++r) {
        const int idx = tid + r * kThreads, t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
        CpAsync16(ws + t * LW + i, w + t * kD + i, true);
        const bool valid = t < c;  // padded rows of k are zero
        CpAsync16(ks + t * LK + i, k + (first + (valid ? t : 0)) * c_dim + i, valid);
      }
      if (tid < C / 2) CpAsync16(sm + L::kDec + stage * 2 * C + tid * 4, decay_in + blk * 2 * C + tid * 4, true);
    }
    CpAsyncCommit();
  };
  auto issue_q = [&](int64_t chunk) {
    if (chunk < chunks) {
      const int c = rows_in(chunk);
      const int64_t first = chunk * C;
      const float* q = conv_out + group * kD;
#pragma unroll
      for (int r = 0; r < C * kD / 4 / kThreads; ++r) {
        const int idx = tid + r * kThreads, t = idx / (kD / 4), i = (idx % (kD / 4)) * 4;
        const bool valid = t < c;
        CpAsync16(sm + L::kQ + t * LW + i, q + (first + (valid ? t : 0)) * c_dim + i, valid);
      }
    }
    CpAsyncCommit();
  };
  auto issue_aqk = [&](int64_t chunk) {
    if (chunk < chunks) {
      const float* a = aqk_in + (chunk * nv + vh) * C * C;
#pragma unroll
      for (int r = 0; r < C * C / 4 / kThreads; ++r) {
        const int idx = tid + r * kThreads, t = idx / (C / 4), i = (idx % (C / 4)) * 4;
        CpAsync16(sm + L::kA + t * LA + i, a + t * C + i, true);
      }
    }
    CpAsyncCommit();
  };

  // Δ/O tile of this warp: rows ra, ra + 8 (+ 16·(warp%4)), columns cb + 8·nt + 2·t4 (+1).
  const int ra = 16 * (warp & 3) + g, cb = 16 * (warp >> 2);
  // U of a chunk, fetched into registers one chunk ahead; it initialises Δ's accumulators.
  auto load_u = [&](int64_t chunk, float (&u)[2][4]) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if (chunk < chunks) {
        const float* up = u_in + (chunk * nv + vh) * C * kD + col0 + cb + 8 * nt + 2 * t4;
        const float2 x = __ldg(reinterpret_cast<const float2*>(up + ra * kD));
        const float2 y = __ldg(reinterpret_cast<const float2*>(up + (ra + 8) * kD));
        u[nt][0] = x.x, u[nt][1] = x.y, u[nt][2] = y.x, u[nt][3] = y.y;
      } else {
        u[nt][0] = u[nt][1] = u[nt][2] = u[nt][3] = 0.0f;
      }
    }
  };

  // Group order (see the waits in the loop): w_k(0), q(0), aqk(0), w_k(1); then per chunk c:
  // q(c+1) mid-step, aqk(c+1) and w_k(c+2) at its end.
  issue_w_k_decay(0);
  issue_q(0);
  issue_aqk(0);
  issue_w_k_decay(1);

  // The state tile of this warp: rows sr, sr + 8, columns sn + 8·nt + 2·t4 (+1); in registers
  // across chunks, and its tf32 mirror in shared memory.
  const int sr = 16 * (warp / kSWarpsPerRowTile) + g, sn = (warp % kSWarpsPerRowTile) * kSNt * 8;
  float* S = state + static_cast<int64_t>(vh) * kD * kD + col0;
  float* ss = sm + L::kS;
  float sacc[kSNt][4];
#pragma unroll
  for (int nt = 0; nt < kSNt; ++nt) {
    const int j = sn + 8 * nt + 2 * t4;
    const float2 x = *reinterpret_cast<const float2*>(S + sr * kD + j);
    const float2 y = *reinterpret_cast<const float2*>(S + (sr + 8) * kD + j);
    sacc[nt][0] = x.x, sacc[nt][1] = x.y, sacc[nt][2] = y.x, sacc[nt][3] = y.y;
    *reinterpret_cast<float2*>(ss + sr * LS + j) = make_float2(Tf32f(x.x), Tf32f(x.y));
    *reinterpret_cast<float2*>(ss + (sr + 8) * LS + j) = make_float2(Tf32f(y.x), Tf32f(y.y));
  }
  float ureg[2][4];
  load_u(0, ureg);
  const float* qs = sm + L::kQ;
  const float* as = sm + L::kA;
  float* ds = sm + L::kDelta;

  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int stage = static_cast<int>(chunk & 1), c = rows_in(chunk);
    const int64_t first = chunk * C;
    const float* ws = sm + L::kW + stage * C * LW;
    const float* ks = sm + L::kK + stage * C * LK;
    const float* dec = sm + L::kDec + stage * 2 * C;
    CpAsyncWait<2>();  // w_k(chunk) and q(chunk) are in; aqk(chunk) and w_k(chunk+1) may be pending
    __syncthreads();

    // Δ = U + W'·S and Q·S, sharing the state fragments.
    float dacc[2][4], oacc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dacc[nt][e] = ureg[nt][e], oacc[nt][e] = 0.0f;
    }
    load_u(chunk + 1, ureg);
#pragma unroll 4
    for (int k0 = 0; k0 < kD; k0 += 8) {
      const uint32_t aw[4] = {Tf32(ws[ra * LW + k0 + t4]), Tf32(ws[(ra + 8) * LW + k0 + t4]),
                              Tf32(ws[ra * LW + k0 + t4 + 4]), Tf32(ws[(ra + 8) * LW + k0 + t4 + 4])};
      const uint32_t aq[4] = {Tf32(qs[ra * LW + k0 + t4]), Tf32(qs[(ra + 8) * LW + k0 + t4]),
                              Tf32(qs[ra * LW + k0 + t4 + 4]), Tf32(qs[(ra + 8) * LW + k0 + t4 + 4])};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint32_t b0 = __float_as_uint(ss[(k0 + t4) * LS + cb + 8 * nt + g]);
        const uint32_t b1 = __float_as_uint(ss[(k0 + t4 + 4) * LS + cb + 8 * nt + g]);
        Mma(dacc[nt], aw, b0, b1);
        Mma(oacc[nt], aq, b0, b1);
      }
    }
    const float e0 = dec[ra], e1 = dec[ra + 8];  // e^(G_t) of the two rows
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      oacc[nt][0] *= e0, oacc[nt][1] *= e0, oacc[nt][2] *= e1, oacc[nt][3] *= e1;
      float* d = ds + ra * LS + cb + 8 * nt + 2 * t4;
      *reinterpret_cast<float2*>(d) = make_float2(Tf32f(dacc[nt][0]), Tf32f(dacc[nt][1]));
      *reinterpret_cast<float2*>(d + 8 * LS) = make_float2(Tf32f(dacc[nt][2]), Tf32f(dacc[nt][3]));
    }
    CpAsyncWait<1>();  // aqk(chunk) is in; w_k(chunk+1) may be pending
    __syncthreads();   // Δ complete; every read of q and of the state mirror is done
    issue_q(chunk + 1);

    // O += Aqk·Δ: Aqk is zero above the diagonal, so only token blocks up to this warp's rows.
    for (int k0 = 0; k0 < 16 * (warp & 3) + 16; k0 += 8) {
      const uint32_t a[4] = {Tf32(as[ra * LA + k0 + t4]), Tf32(as[(ra + 8) * LA + k0 + t4]),
                             Tf32(as[ra * LA + k0 + t4 + 4]), Tf32(as[(ra + 8) * LA + k0 + t4 + 4])};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        Mma(oacc[nt], a, __float_as_uint(ds[(k0 + t4) * LS + cb + 8 * nt + g]),
            __float_as_uint(ds[(k0 + t4 + 4) * LS + cb + 8 * nt + g]));
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float* out = o + (first + ra) * nv * kD + static_cast<int64_t>(vh) * kD + col0 + cb + 8 * nt + 2 * t4;
      if (ra < c) *reinterpret_cast<float2*>(out) = make_float2(oacc[nt][0], oacc[nt][1]);
      if (ra + 8 < c) *reinterpret_cast<float2*>(out + 8 * nv * kD) = make_float2(oacc[nt][2], oacc[nt][3]);
    }

    // S ← e^(G_last)·S + K'ᵀ·Δ, K'[t] = e^(G_last−G_t)·k_t (padded rows of k are zero).
    const float decay_all = dec[C - 1];
#pragma unroll
    for (int nt = 0; nt < kSNt; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] *= decay_all;
    }
    const int sm0 = sr - g;
#pragma unroll 4
    for (int k0 = 0; k0 < C; k0 += 8) {
      const float kd0 = dec[C + k0 + t4], kd1 = dec[C + k0 + t4 + 4];
      const uint32_t a[4] = {Tf32(ks[(k0 + t4) * LK + sm0 + g] * kd0), Tf32(ks[(k0 + t4) * LK + sm0 + g + 8] * kd0),
                             Tf32(ks[(k0 + t4 + 4) * LK + sm0 + g] * kd1),
                             Tf32(ks[(k0 + t4 + 4) * LK + sm0 + g + 8] * kd1)};
#pragma unroll
      for (int nt = 0; nt < kSNt; ++nt) {
        Mma(sacc[nt], a, __float_as_uint(ds[(k0 + t4) * LS + sn + 8 * nt + g]),
            __float_as_uint(ds[(k0 + t4 + 4) * LS + sn + 8 * nt + g]));
      }
    }
#pragma unroll
    for (int nt = 0; nt < kSNt; ++nt) {
      const int j = sn + 8 * nt + 2 * t4;
      *reinterpret_cast<float2*>(ss + sr * LS + j) = make_float2(Tf32f(sacc[nt][0]), Tf32f(sacc[nt][1]));
      *reinterpret_cast<float2*>(ss + (sr + 8) * LS + j) = make_float2(Tf32f(sacc[nt][2]), Tf32f(sacc[nt][3]));
    }
    __syncthreads();  // every read of Aqk, Δ, k, W' and the decays of this chunk is done
    issue_aqk(chunk + 1);
    issue_w_k_decay(chunk + 2);  // into this chunk's stage
  }
  CpAsyncWait<0>();  // nothing may land in shared memory after the block exits
#pragma unroll
  for (int nt = 0; nt < kSNt; ++nt) {
    const int j = sn + 8 * nt + 2 * t4;
    *reinterpret_cast<float2*>(S + sr * kD + j) = make_float2(sacc[nt][0], sacc[nt][1]);
    *reinterpret_cast<float2*>(S + (sr + 8) * kD + j) = make_float2(sacc[nt][2], sacc[nt][3]);
  }
}

}  // namespace tandem::cuda::gdn_mma_scan

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CHUNKED_MMA_SCAN_CUH_
