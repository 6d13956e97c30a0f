#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

#include <cuda_fp16.h>

#include <algorithm>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_gemm.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {
namespace {

using namespace prefill_gemm;  // NOLINT: the tile helpers shared with the pipelined kernel

constexpr int kThreads = 256;

// One thread per 32-element piece.
template <uint32_t kType>
__global__ void __launch_bounds__(kThreads) DequantF16Kernel(const uint8_t* w, int cols, int rows, uint16_t* out) {
  const int pieces = cols / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(pieces) * rows) return;
  const int64_t r = i / pieces;
  const int p = static_cast<int>(i % pieces);
  const int64_t row_bytes = static_cast<int64_t>(cols) / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  float v[32];
  DequantChunk<kType>(w + r * row_bytes, p, v);
  uint32_t packed[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) packed[k] = ToF16Bits(v[2 * k]) | (static_cast<uint32_t>(ToF16Bits(v[2 * k + 1])) << 16);
  uint4* dst = reinterpret_cast<uint4*>(out + r * cols + p * 32);
#pragma unroll
  for (int k = 0; k < 4; ++k) dst[k] = make_uint4(packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]);
}

template <uint32_t kType>
cudaError_t LaunchDequant(const void* w, int cols, int rows, uint16_t* out, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(cols / 32) * rows;
  const unsigned blocks = static_cast<unsigned>((total + kThreads - 1) / kThreads);
  DequantF16Kernel<kType><<<blocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(w), cols, rows, out);
  return cudaGetLastError();
}

// ---- The unpipelined grouped kernel (PrefillKernel::kUnpipelined, the first version, kept for
// comparison): the same tiles, warps and shared layout as PipelinedGemmKernel
// (expert_prefill_gemm.cuh), but each step's weight loads, dequantization (DequantChunk, f32 then
// f16) and activation loads happen in sequence before the next step's MMAs can start.

// a: f16 rows of K elements; a_index maps a slot to its row of a (nullptr: the slot itself).
// B rows: n < N (gate/up: N = 2·inner, interleaved; down: N = h). out_cols: inner (gate/up) or h.
template <uint32_t kType, int kBM, bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads, 2)
    UnpipelinedGemmKernel(const PrefillTile* __restrict__ tiles, int col_blocks, const uint16_t* __restrict__ a,
                      const int32_t* __restrict__ a_index, int K, int N, int out_cols, uint16_t* __restrict__ act_out,
                      float* __restrict__ f32_out) {
  constexpr int kWarpsM = kBM >= 64 ? kBM / 32 : 1;
  constexpr int kWarpsN = (kGemmThreads / 32) / kWarpsM;
  constexpr int kWarpRows = kBM / kWarpsM;
  constexpr int kWarpCols = kPrefillTileCols / kWarpsN;
  constexpr int kMF = kWarpRows / 16;
  constexpr int kNF = kWarpCols / 8;
  static_assert(kWarpRows % 16 == 0 && kNF % 2 == 0, "warp tile must be whole m16 × (2 × n8) fragments");
  constexpr int kABytes = kBM * kSmemRowBytes;
  constexpr int kStageBytes = kABytes + kPrefillTileCols * kSmemRowBytes;
  constexpr int kATasks = kBM * (kSmemRowBytes / 16);
  constexpr int kALoads = (kATasks + kGemmThreads - 1) / kGemmThreads;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tile_index = static_cast<int>(blockIdx.x / col_blocks);
  const int n0 = static_cast<int>(blockIdx.x % col_blocks) * kPrefillTileCols;
  const PrefillTile tile = tiles[tile_index];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;

  // A: task tid + 256·i loads 16-byte chunk (tid % 8) of tile row (task / 8); null past the rows.
  const int a_chunk = tid & 7;
  const uint16_t* a_src[kALoads];
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int task = tid + i * kGemmThreads;
    const int r = task >> 3;
    a_src[i] = nullptr;
    if (task < kATasks && r < tile.rows) {
      const int slot = tile.first_slot + r;
      const int64_t row = a_index != nullptr ? a_index[slot] : slot;
      a_src[i] = a + row * K + a_chunk * 8;
    }
  }
  // B: thread tid dequantizes 32-element chunk (tid % 2) of the stage for B row tid / 2.
  const int b_row_local = tid >> 1, b_half = tid & 1;
  const int64_t row_bytes = static_cast<int64_t>(K) / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  const uint8_t* b_row = nullptr;
  if (const int n = n0 + b_row_local; n < N) {
    if constexpr (kGateUp) {
      b_row = static_cast<const uint8_t*>((n & 1) != 0 ? tile.up : tile.gate) + static_cast<int64_t>(n >> 1) * row_bytes;
    } else {
      b_row = static_cast<const uint8_t*>(tile.down) + static_cast<int64_t>(n) * row_bytes;
    }
  }
  const int k_chunks = K / 32;

  auto load_stage = [&](int stage, int k0) {
    uint8_t* sa = smem + stage * kStageBytes;
    uint8_t* sb = sa + kABytes;
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int task = tid + i * kGemmThreads;
      if (task < kATasks) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (a_src[i] != nullptr && k0 + a_chunk * 8 < K) v = *reinterpret_cast<const uint4*>(a_src[i] + k0);
        *reinterpret_cast<uint4*>(sa + SwizzledOffset(task >> 3, a_chunk)) = v;
      }
    }
    uint32_t packed[16];
    const int c = k0 / 32 + b_half;
    if (b_row != nullptr && c < k_chunks) {
      float v[32];
      DequantChunk<kType>(b_row, c, v);
#pragma unroll
      for (int k = 0; k < 16; ++k) packed[k] = PackF16x2(v[2 * k], v[2 * k + 1]);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) packed[k] = 0;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<uint4*>(sb + SwizzledOffset(b_row_local, b_half * 4 + j)) =
          make_uint4(packed[4 * j], packed[4 * j + 1], packed[4 * j + 2], packed[4 * j + 3]);
    }
  };

  float acc[kMF][kNF][4];
#pragma unroll
  for (int mf = 0; mf < kMF; ++mf) {
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mf][nf][q] = 0.0f;
    }
  }
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto mma_stage = [&](int stage) {
    const uint32_t sa = smem_base + stage * kStageBytes;
    const uint32_t sb = sa + kABytes;
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      // A fragment: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15); lane l
      // addresses row l % 16 of k half l / 16.
      uint32_t af[kMF][4];
#pragma unroll
      for (int mf = 0; mf < kMF; ++mf) {
        LdMatrixX4(af[mf], sa + SwizzledOffset(wm * kWarpRows + mf * 16 + (lane & 15), kk * 2 + (lane >> 4)));
      }
      // B fragments of two n8 blocks: matrices (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
      uint32_t bf[kNF][2];
#pragma unroll
      for (int p = 0; p < kNF / 2; ++p) {
        uint32_t r[4];
        LdMatrixX4(r, sb + SwizzledOffset(wn * kWarpCols + p * 16 + (lane & 7) + ((lane >> 4) << 3),
                                          kk * 2 + ((lane >> 3) & 1)));
        bf[2 * p][0] = r[0];
        bf[2 * p][1] = r[1];
        bf[2 * p + 1][0] = r[2];
        bf[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int mf = 0; mf < kMF; ++mf) {
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) MmaF16(acc[mf][nf], af[mf], bf[nf][0], bf[nf][1]);
      }
    }
  };

  const int steps = (K + kTileK - 1) / kTileK;
  load_stage(0, 0);
  __syncthreads();
  for (int s = 0; s < steps; ++s) {
    // Stage (s + 1) & 1 was last read in step s − 1, which every thread finished before the barrier.
    if (s + 1 < steps) load_stage((s + 1) & 1, (s + 1) * kTileK);
    mma_stage(s & 1);
    __syncthreads();
  }

  // Accumulator (mf, nf): c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at (row g + 8, same cols).
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mf = 0; mf < kMF; ++mf) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * kWarpRows + mf * 16 + g + half * 8;
      if (r >= tile.rows) continue;
      const int64_t slot = tile.first_slot + r;
#pragma unroll
      for (int nf = 0; nf < kNF; ++nf) {
        const int col = n0 + wn * kWarpCols + nf * 8 + 2 * t;
        const float v0 = acc[mf][nf][2 * half], v1 = acc[mf][nf][2 * half + 1];
        if constexpr (kGateUp) {
          const int feature = col >> 1;
          if (feature < out_cols) act_out[slot * out_cols + feature] = ToF16Bits(SiluTimes(v0, v1));
        } else {
          float* o = f32_out + slot * out_cols + col;
          if (col + 1 < out_cols) {
            *reinterpret_cast<float2*>(o) = make_float2(v0, v1);  // out_cols even here: 8-byte aligned
          } else if (col < out_cols) {
            o[0] = v0;
          }
        }
      }
    }
  }
}

template <uint32_t kType, int kBM, bool kGateUp>
cudaError_t LaunchGemm(PrefillKernel which, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                       const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                       cudaStream_t stream) {
  constexpr int smem = SmemBytes<kBM>();
  auto* kernel = which == PrefillKernel::kPipelined ? PipelinedGemmKernel<kType, kBM, kGateUp>
                                                    : UnpipelinedGemmKernel<kType, kBM, kGateUp>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess) {
    return e;
  }
  const int col_blocks = (N + kPrefillTileCols - 1) / kPrefillTileCols;
  const int64_t blocks = static_cast<int64_t>(num_tiles) * col_blocks;
  kernel<<<static_cast<unsigned>(blocks), kGemmThreads, smem, stream>>>(tiles, col_blocks, a, a_index, K, N, out_cols,
                                                                        act_out, f32_out);
  return cudaGetLastError();
}

template <uint32_t kType, bool kGateUp>
cudaError_t LaunchGemmRows(PrefillKernel which, int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                           const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                           cudaStream_t stream) {
  switch (tile_rows) {
    case 16: return LaunchGemm<kType, 16, kGateUp>(which, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    case 32: return LaunchGemm<kType, 32, kGateUp>(which, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    case 64: return LaunchGemm<kType, 64, kGateUp>(which, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    case 128: return LaunchGemm<kType, 128, kGateUp>(which, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <bool kGateUp>
cudaError_t LaunchGemmTyped(PrefillKernel which, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                            const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                            cudaStream_t stream) {
  if (num_tiles <= 0 || N <= 0) return cudaSuccess;
  if (KernelRowAlignment(type) == 0 || K <= 0 || K % 32 != 0 || K % RowLengthMultiple(type) != 0) {
    return cudaErrorInvalidValue;
  }
#define TANDEM_PREFILL_CASE(T) \
  case T: return LaunchGemmRows<T, kGateUp>(which, tile_rows, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream)
  switch (type) {
    TANDEM_PREFILL_CASE(kTypeF32);
    TANDEM_PREFILL_CASE(kTypeF16);
    TANDEM_PREFILL_CASE(kTypeBF16);
    TANDEM_PREFILL_CASE(kTypeQ4_0);
    TANDEM_PREFILL_CASE(kTypeQ8_0);
    TANDEM_PREFILL_CASE(kTypeQ2_K);
    TANDEM_PREFILL_CASE(kTypeQ3_K);
    TANDEM_PREFILL_CASE(kTypeQ4_K);
    TANDEM_PREFILL_CASE(kTypeQ5_K);
    TANDEM_PREFILL_CASE(kTypeQ6_K);
    default: return cudaErrorInvalidValue;
  }
#undef TANDEM_PREFILL_CASE
}

__global__ void ConvertF16Kernel(const float* __restrict__ x, int64_t count, uint16_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t quads = count / 4;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<uint2*>(out)[i] =
        make_uint2(ToF16Bits(v.x) | (static_cast<uint32_t>(ToF16Bits(v.y)) << 16),
                   ToF16Bits(v.z) | (static_cast<uint32_t>(ToF16Bits(v.w)) << 16));
  }
  if (blockIdx.x == 0 && static_cast<int64_t>(threadIdx.x) < count % 4) {
    const int64_t i = quads * 4 + threadIdx.x;
    out[i] = ToF16Bits(x[i]);
  }
}


__global__ void GatherF16Kernel(const float* x, int cols, const int32_t* index, uint16_t* out) {
  const int i = blockIdx.y;
  const float* src = x + static_cast<int64_t>(index[i]) * cols;
  for (int c = blockIdx.x * kThreads + threadIdx.x; c < cols; c += gridDim.x * kThreads) {
    out[static_cast<int64_t>(i) * cols + c] = ToF16Bits(src[c]);
  }
}

__global__ void SiluMulKernel(const float* gu, int m, int inner, uint16_t* act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(m) * inner) return;
  const int64_t t = i / inner, j = i % inner;
  const float g = gu[t * 2 * inner + j];
  const float u = gu[t * 2 * inner + inner + j];
  act[i] = ToF16Bits(g * (1.0f / (1.0f + expf(-g))) * u);
}

}  // namespace

cudaError_t LaunchDequantizeToF16(uint32_t type, const void* w, int cols, int rows, uint16_t* out,
                                   cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int align = KernelRowAlignment(type);
  if (align == 0 || cols <= 0 || cols % RowLengthMultiple(type) != 0 || reinterpret_cast<uintptr_t>(w) % align != 0) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case kTypeF32: return LaunchDequant<kTypeF32>(w, cols, rows, out, stream);
    case kTypeF16: return LaunchDequant<kTypeF16>(w, cols, rows, out, stream);
    case kTypeBF16: return LaunchDequant<kTypeBF16>(w, cols, rows, out, stream);
    case kTypeQ4_0: return LaunchDequant<kTypeQ4_0>(w, cols, rows, out, stream);
    case kTypeQ8_0: return LaunchDequant<kTypeQ8_0>(w, cols, rows, out, stream);
    case kTypeQ2_K: return LaunchDequant<kTypeQ2_K>(w, cols, rows, out, stream);
    case kTypeQ3_K: return LaunchDequant<kTypeQ3_K>(w, cols, rows, out, stream);
    case kTypeQ4_K: return LaunchDequant<kTypeQ4_K>(w, cols, rows, out, stream);
    case kTypeQ5_K: return LaunchDequant<kTypeQ5_K>(w, cols, rows, out, stream);
    case kTypeQ6_K: return LaunchDequant<kTypeQ6_K>(w, cols, rows, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGatherRowsF16(const float* x, int cols, const int32_t* index, int m, uint16_t* out,
                                 cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  const unsigned gx = static_cast<unsigned>(std::min((cols + kThreads - 1) / kThreads, 16));
  GatherF16Kernel<<<dim3(gx, m), kThreads, 0, stream>>>(x, cols, index, out);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMulToF16(const float* gu, int m, int inner, uint16_t* act, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(m) * inner;
  if (total <= 0) return cudaSuccess;
  SiluMulKernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(gu, m, inner, act);
  return cudaGetLastError();
}

cudaError_t LaunchConvertToF16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 8 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((count / 4 + kThreads - 1) / kThreads + 1, 4096);
  ConvertF16Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchPrefillGateUp(PrefillKernel which, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles,
                                const uint16_t* xb, const int32_t* index, int h, int inner, uint16_t* act,
                                cudaStream_t stream) {
  return LaunchGemmTyped<true>(which, type, tile_rows, tiles, num_tiles, xb, index, h, 2 * inner, inner, act, nullptr, stream);
}

cudaError_t LaunchPrefillDown(PrefillKernel which, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles,
                              const uint16_t* act, int h, int inner, float* partial, cudaStream_t stream) {
  // The epilogue stores column pairs as float2.
  if (h % 2 != 0 || reinterpret_cast<uintptr_t>(partial) % 8 != 0) return cudaErrorInvalidValue;
  return LaunchGemmTyped<false>(which, type, tile_rows, tiles, num_tiles, act, nullptr, inner, h, h, nullptr, partial, stream);
}

}  // namespace tandem::cuda
