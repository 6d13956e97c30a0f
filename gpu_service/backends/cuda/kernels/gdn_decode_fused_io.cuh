// Pieces of the fused GDN decode kernel (gdn_decode_fused.cu) that move the layer's products into
// it: the output product's part of a cluster (kOut: the gated outputs times the cluster's column
// super-block of ssm_out, added into y with atomics) and the input products' rows of a block (kIn:
// the block's rows of the stacked [z; qkv; ba] decode product, dotted with x in int16). Device-only;
// included by gdn_decode_fused.cu alone (internal linkage).
//
// Both read Q8_0x8 rows (device_matrix.h: super-blocks of 272 bytes, 16 bytes of eight f16 scales
// then 8 × 32 int8 quants) from shared memory, copied there with cp.async before the kernel's PDL
// wait, and multiply int8 weights by int16 activations with dp2a (exact in int32 for a block of
// 32), one f32 scale product per block of 32: an activation's rounding to int16 with one scale per
// 32 is ~1e-5 of a row's sum.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_IO_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_IO_CUH_

#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;  // GdnRecurrentKernel's kRecurrentWarps: the same partial sums
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 32;  // value columns a block (a lane each)
// The output product inside (kOut): a cluster of 8 blocks holds 256 gated outputs, one Q8_0x8
// super-block of every row of the output matrix (kQ8_0x8SuperBytes = 16 bytes of scales, then 8 ×
// 32 quants); block rank c takes rows [c·rows/8, (c+1)·rows/8), kMaxOutRowsPerBlock at most.
constexpr int kOutClusterBlocks = 8;
constexpr int kOutCols = kOutClusterBlocks * kCols;  // 256: one super-block
constexpr int kOutSuperBytes = static_cast<int>(kQ8_0x8SuperBytes);
constexpr int kOutPieces = kOutSuperBytes / 16;  // 16-byte copies a row
constexpr int kMaxOutRowsPerBlock = 640;         // 170 KB of shared memory
static_assert(kOutCols == 256 && kOutSuperBytes % 16 == 0, "one 16-byte aligned Q8_0x8 super-block");

// Dynamic shared memory of the kOut kernel: the block's rows of the output matrix, then the
// cluster's 256 gated outputs as int16 and their 8 scales (one a Q8_0 block).
inline size_t OutSharedBytes(int rows_per_block) {
  return static_cast<size_t>(rows_per_block) * kOutSuperBytes + kOutCols * sizeof(int16_t) + 8 * sizeof(float);
}

__device__ __forceinline__ void ClusterArrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The input products inside (kIn): a block's rows of the stacked decode product, in shared memory
// in this order: its share of the cluster's q and k channels (2·dk/8: block rank c holds channels
// [c·2dk/8, (c+1)·2dk/8) of the group's q then k head), its 32 v channels, its value head's b and a,
// then its 32 z rows. Lanes hold x as int16 in registers: lane l the 16-column pieces l, l + 32, ...
// (kInPieces of them: h = 512·kInPieces), so that a warp reads a row's quants as contiguous 16-byte
// pieces (no bank conflicts) and every row reuses the lane's x.
constexpr int kInZRows = kCols, kInVRows = kCols, kInBaRows = 2;

__host__ __device__ constexpr int InQkRows(int dk) { return 2 * dk / kOutClusterBlocks; }
__host__ __device__ constexpr int InRowsBeforeZ(int dk) { return InQkRows(dk) + kInVRows + kInBaRows; }
__host__ __device__ constexpr int InRows(int dk) { return InRowsBeforeZ(dk) + kInZRows; }
__host__ __device__ constexpr int64_t InRowBytes(int64_t h) { return h / 256 * kOutSuperBytes; }

// Dynamic shared memory of the kIn kernel: the input rows (the output rows are copied over the
// first ones once those are done), then the cluster's int16 outputs for the output product.
inline size_t InSharedBytes(int dk, int64_t h) {
  return static_cast<size_t>(InRows(dk)) * InRowBytes(h) + kOutCols * sizeof(int16_t) + 8 * sizeof(float);
}

// Lane l's pieces of x: 16 int16 (two uint4) and one scale each.
template <int kP>
struct XPieces {
  uint4 q[kP][2];
  float s[kP];
};

// x (h = 512·kP floats, written by the kernel before: read after the PDL wait) quantized for this
// lane: one scale per Q8_0 block of 32 columns, whose two pieces sit on lanes l and l ^ 1.
template <int kP>
__device__ __forceinline__ void LoadXPieces(const float* x, int lane, XPieces<kP>& xp) {
#pragma unroll
  for (int i = 0; i < kP; ++i) {
    const float4* src = reinterpret_cast<const float4*>(x + 16 * (lane + 32 * i));
    float v[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 f = src[j];
      v[4 * j] = f.x;
      v[4 * j + 1] = f.y;
      v[4 * j + 2] = f.z;
      v[4 * j + 3] = f.w;
    }
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(v[j]));
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    const float inv = m > 0.0f ? 32767.0f / m : 0.0f;
    uint32_t w[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t lo = static_cast<uint16_t>(static_cast<int16_t>(__float2int_rn(v[2 * j] * inv)));
      const uint32_t hi = static_cast<uint16_t>(static_cast<int16_t>(__float2int_rn(v[2 * j + 1] * inv)));
      w[j] = lo | (hi << 16);
    }
    xp.q[i][0] = make_uint4(w[0], w[1], w[2], w[3]);
    xp.q[i][1] = make_uint4(w[4], w[5], w[6], w[7]);
    xp.s[i] = m * (1.0f / 32767.0f);
  }
}

// Σ over 16 columns of int8 weights (qv) times int16 activations (x0: columns 0-7, x1: 8-15).
__device__ __forceinline__ int Dot16(uint4 qv, uint4 x0, uint4 x1, int s) {
  s = __dp2a_lo(static_cast<int>(x0.x), static_cast<int>(qv.x), s);
  s = __dp2a_hi(static_cast<int>(x0.y), static_cast<int>(qv.x), s);
  s = __dp2a_lo(static_cast<int>(x0.z), static_cast<int>(qv.y), s);
  s = __dp2a_hi(static_cast<int>(x0.w), static_cast<int>(qv.y), s);
  s = __dp2a_lo(static_cast<int>(x1.x), static_cast<int>(qv.z), s);
  s = __dp2a_hi(static_cast<int>(x1.y), static_cast<int>(qv.z), s);
  s = __dp2a_lo(static_cast<int>(x1.z), static_cast<int>(qv.w), s);
  s = __dp2a_hi(static_cast<int>(x1.w), static_cast<int>(qv.w), s);
  return s;
}

__device__ __forceinline__ float HalfAt(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}

// One row (Q8_0x8 in shared memory) · x, summed over the warp (the same xor-butterfly order on
// every lane: each lane returns the whole sum).
template <int kP>
__device__ __forceinline__ float InRowDot(const uint8_t* row, const XPieces<kP>& xp, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kP; ++i) {
    const int p = lane + 32 * i;
    const uint8_t* sb = row + (p >> 4) * kOutSuperBytes;
    const uint4 qv = *reinterpret_cast<const uint4*>(sb + 16 + 16 * (p & 15));
    const int s = Dot16(qv, xp.q[i][0], xp.q[i][1], 0);
    acc = fmaf(static_cast<float>(s), HalfAt(sb + 2 * ((p & 15) >> 1)) * xp.s[i], acc);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  return acc;
}

// The source row of the block's input row j (InRows order) in the stacked product's parts.
__device__ __forceinline__ const uint8_t* InRowSource(const GdnDecodeFusedArgs& a, int j, int dk, int nk, int dv,
                                                      int vh, int r, int col0, unsigned rank) {
  const int nqk = InQkRows(dk), group = vh / r;
  if (j < nqk) {
    const int ch = static_cast<int>(rank) * nqk + j;  // of the group's 2·dk q then k channels
    const int row = ch < dk ? group * dk + ch : nk * dk + group * dk + (ch - dk);
    return a.in_qkv + static_cast<int64_t>(row) * a.in_qkv_row_bytes;
  }
  j -= nqk;
  if (j < kInVRows) {
    return a.in_qkv + static_cast<int64_t>(2 * nk * dk + vh * dv + col0 + j) * a.in_qkv_row_bytes;
  }
  j -= kInVRows;
  if (j < kInBaRows) {  // GdnBaRow's layout: the group's [b_0..b_{r-1}, a_0..a_{r-1}]
    return a.in_ba + static_cast<int64_t>(group * 2 * r + j * r + vh % r) * a.in_ba_row_bytes;
  }
  j -= kInBaRows;
  return a.in_z + static_cast<int64_t>(vh * dv + col0 + j) * a.in_z_row_bytes;
}

// Copies input rows [j0, j1) into their places (cp.async, 16 bytes a thread at a time; the caller
// commits the group).
__device__ __forceinline__ void CopyInRows(const GdnDecodeFusedArgs& a, uint8_t* dst, int j0, int j1, int64_t h,
                                           int dk, int nk, int dv, int vh, int r, int col0, unsigned rank, int tid) {
  const int pieces = static_cast<int>(InRowBytes(h) / 16);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  for (int i = tid; i < (j1 - j0) * pieces; i += kThreads) {
    const int j = j0 + i / pieces, piece = i % pieces;
    CpAsync16(base + static_cast<uint32_t>(j * InRowBytes(h) + piece * 16),
              InRowSource(a, j, dk, nk, dv, vh, r, col0, rank) + piece * 16);
  }
}

// The kOut kernel's last part (every block of the cluster, all threads): out_y[row] += the
// cluster's 256 gated outputs (in the o_sh of its blocks: rank vh % r + y·r holds columns
// (vh % r)·dv + 32y ..) · the block's rows of its column super-block (out_sh, copied before the
// PDL wait; xq: room for the cluster's 256 outputs as int16 and their 8 scales). The barriers: every block's outputs are written before any is read; no block leaves
// while another may still read its o_sh (the last wait). out_y is added to with atomics, so the
// order of the clusters' additions, and the last bits of out_y, are not fixed.
__device__ __forceinline__ void OutProductPart(const GdnDecodeFusedArgs& a, float* o_sh, const uint8_t* out_sh,
                                               int16_t* xq, int rpb, unsigned rank, int r, int dv, int tid, int lane,
                                               int warp) {
  ClusterArrive();
  ClusterWait();
  // Thread tid gathers the cluster's column tid (a warp: one Q8_0 block of 32 columns).
  const int head = tid / dv, col_block = (tid % dv) / kCols;
  const float xv = cg::this_cluster().map_shared_rank(o_sh, static_cast<unsigned>(head + col_block * r))[lane];
  ClusterArrive();  // this block is done with the others' o_sh; the matching wait is the last step
  float* xscale = reinterpret_cast<float*>(xq + kOutCols);
  float m = fabsf(xv);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  const float inv = m > 0.0f ? 32767.0f / m : 0.0f;
  xq[tid] = static_cast<int16_t>(__float2int_rn(xv * inv));
  if (lane == 0) xscale[warp] = m * (1.0f / 32767.0f);
  CpAsyncWait<0>();
  __syncthreads();
  float* y = a.out_y + static_cast<int64_t>(rank) * rpb;
  const uint4* xw = reinterpret_cast<const uint4*>(xq);
  for (int row = tid; row < rpb; row += kThreads) {
    const uint8_t* sb = out_sh + static_cast<size_t>(row) * kOutSuperBytes;
    const uint4 d4 = *reinterpret_cast<const uint4*>(sb);
    const uint32_t dw[4] = {d4.x, d4.y, d4.z, d4.w};
    float acc = 0.0f;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      const uint4* q = reinterpret_cast<const uint4*>(sb + 16 + 32 * b);
      int s = 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 qv = q[half];                                        // columns 16·half .. + 15
        const uint4 x0 = xw[4 * b + 2 * half], x1 = xw[4 * b + 2 * half + 1];  // their int16 outputs
        s = __dp2a_lo(static_cast<int>(x0.x), static_cast<int>(qv.x), s);
        s = __dp2a_hi(static_cast<int>(x0.y), static_cast<int>(qv.x), s);
        s = __dp2a_lo(static_cast<int>(x0.z), static_cast<int>(qv.y), s);
        s = __dp2a_hi(static_cast<int>(x0.w), static_cast<int>(qv.y), s);
        s = __dp2a_lo(static_cast<int>(x1.x), static_cast<int>(qv.z), s);
        s = __dp2a_hi(static_cast<int>(x1.y), static_cast<int>(qv.z), s);
        s = __dp2a_lo(static_cast<int>(x1.z), static_cast<int>(qv.w), s);
        s = __dp2a_hi(static_cast<int>(x1.w), static_cast<int>(qv.w), s);
      }
      const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dw[b / 2] >> (16 * (b & 1)))));
      acc = fmaf(static_cast<float>(s), d * xscale[b], acc);
    }
    atomicAdd(y + row, acc);
  }
  ClusterWait();
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_IO_CUH_
