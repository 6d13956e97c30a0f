#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

#include <cuda_fp16.h>

#include <algorithm>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_gemm.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_rows.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_stream.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgws.cuh"
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

template <uint32_t kType, int kBM, bool kGateUp>
cudaError_t LaunchGemm(const PrefillTile* tiles, int num_tiles, const uint16_t* a, const int32_t* a_index, int K,
                       int N, int out_cols, uint16_t* act_out, float* f32_out, cudaStream_t stream) {
  constexpr int smem = SmemBytes<kBM>();
  auto* kernel = PipelinedGemmKernel<kType, kBM, kGateUp>;
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
cudaError_t LaunchGemmRows(int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                           const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                           cudaStream_t stream) {
  switch (tile_rows) {
    case 16: return LaunchGemm<kType, 16, kGateUp>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    case 32: return LaunchGemm<kType, 32, kGateUp>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    case 64: return LaunchGemm<kType, 64, kGateUp>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    case 128: return LaunchGemm<kType, 128, kGateUp>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
    default: return cudaErrorInvalidValue;
  }
}

// The streamed kernel is persistent: as many blocks as fit on the device at once (at most one per
// unit), each walking (tile, 128-row block) units in the schedule's order.
template <bool kGateUp, PrefillKernel kVariant, int kMaxRows>
cudaError_t LaunchStreamedRing(const PrefillTile* tiles, int num_tiles, const uint16_t* a, const int32_t* a_index, int K,
                               int N, int out_cols, uint16_t* act_out, float* f32_out, cudaStream_t stream,
                               const int* tile_count, StreamedSchedule schedule) {
  auto* kernel = prefill_stream::StreamedQ4KGemmKernel<kGateUp, kVariant, kMaxRows>;
  constexpr int smem = prefill_stream::Ring<kMaxRows>::kSmemBytes;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess) {
    return e;
  }
  int device = 0, sms = 0, per_sm = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, prefill_stream::kThreads, smem);
      e != cudaSuccess) {
    return e;
  }
  const int64_t units = static_cast<int64_t>(num_tiles) * (N / prefill_stream::kUnitCols);
  const int64_t blocks = std::min<int64_t>(units, static_cast<int64_t>(std::max(per_sm, 1)) * sms);
  int order = prefill_stream::kOrderRanges;
  if (schedule.order == StreamedOrder::kStrided) order = prefill_stream::kOrderStrided;
  if (schedule.order == StreamedOrder::kDynamic) order = prefill_stream::kOrderDynamic;
  return LaunchPrefillPdl(kernel, static_cast<unsigned>(blocks), prefill_stream::kThreads, smem, stream, tiles, num_tiles,
                          a, a_index, K, N, out_cols, act_out, f32_out, tile_count, order, schedule.counter);
}

// Tiles of up to 32 slots run the ring with more stages (prefill_stream::Ring).
template <bool kGateUp, PrefillKernel kVariant>
cudaError_t LaunchStreamed(int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                           const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                           cudaStream_t stream, const int* tile_count, StreamedSchedule schedule) {
  if (K % 256 != 0 || N % prefill_stream::kUnitCols != 0) return cudaErrorInvalidValue;
  if (schedule.order == StreamedOrder::kDynamic && schedule.counter == nullptr) return cudaErrorInvalidValue;
  if (tile_rows <= 32) {
    return LaunchStreamedRing<kGateUp, kVariant, 32>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out,
                                                     stream, tile_count, schedule);
  }
  return LaunchStreamedRing<kGateUp, kVariant, 64>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out,
                                                   stream, tile_count, schedule);
}

// The row-streamed kernel (expert_prefill_rows.cuh): persistent, as many blocks as fit at once (at
// most one per unit); the ring as deep as the shared memory of those blocks allows.
template <bool kGateUp, int kFrags>
cudaError_t LaunchRowsFrags(const PrefillTile* tiles, int num_tiles, const uint16_t* a, const int32_t* a_index, int K,
                            int N, int out_cols, uint16_t* act_out, float* f32_out, cudaStream_t stream) {
  using namespace prefill_rows;  // NOLINT
  auto* kernel = RowsQ4KGemmKernel<kGateUp, kFrags>;
  const RowsGeometry geo = MakeRowsGeometry(K);
  // kFrags 1: two blocks per SM (228 KB per SM, 1 KB of it reserved per block); 2: one (227 KB).
  const int budget = kFrags == 1 ? (228 * 1024) / 2 - 1024 : 227 * 1024;
  const int stages = std::min(kMaxStages, (budget - RedBytes(kFrags)) / geo.stage_bytes);
  if (stages < 2) return cudaErrorInvalidValue;
  const int smem = stages * geo.stage_bytes + RedBytes(kFrags);
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); e != cudaSuccess) {
    return e;
  }
  int device = 0, sms = 0, per_sm = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem); e != cudaSuccess) {
    return e;
  }
  const int64_t units = static_cast<int64_t>(num_tiles) * (N / geo.rows);
  const int64_t blocks = std::min<int64_t>(units, static_cast<int64_t>(std::max(per_sm, 1)) * sms);
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(tiles, num_tiles, a, a_index, K, N, out_cols, stages,
                                                                    act_out, f32_out);
  return cudaGetLastError();
}

template <bool kGateUp>
cudaError_t LaunchRows(int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a, const int32_t* a_index,
                       int K, int N, int out_cols, uint16_t* act_out, float* f32_out, cudaStream_t stream) {
  if (K % 256 != 0 || K > kStreamedRowsMaxK || N % kStreamedUnitCols != 0) return cudaErrorInvalidValue;
  if (tile_rows <= 16) {
    return LaunchRowsFrags<kGateUp, 1>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
  }
  return LaunchRowsFrags<kGateUp, 2>(tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
}

template <bool kGateUp>
cudaError_t LaunchGemmTyped(PrefillKernel which, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles, const uint16_t* a,
                            const int32_t* a_index, int K, int N, int out_cols, uint16_t* act_out, float* f32_out,
                            cudaStream_t stream, const int* tile_count, StreamedSchedule schedule) {
  if (num_tiles <= 0 || N <= 0) return cudaSuccess;
  // A device-side tile count: only the kStreamed variants read one.
  const bool streamed = which == PrefillKernel::kStreamed || which == PrefillKernel::kStreamedL2Lines256 ||
                        which == PrefillKernel::kStreamedUnitPrefetch || IsWgmmaKernel(which);
  if (tile_count != nullptr && !streamed) return cudaErrorInvalidValue;
  if (KernelRowAlignment(type) == 0 || K <= 0 || K % 32 != 0 || K % RowLengthMultiple(type) != 0) {
    return cudaErrorInvalidValue;
  }
  if (which == PrefillKernel::kStreamedRows) {
    if (type != kTypeQ4_K || tile_rows < 1 || tile_rows > kStreamedRowsMaxTileRows) return cudaErrorInvalidValue;
    return LaunchRows<kGateUp>(tile_rows, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream);
  }
  if (IsWgmmaKernel(which)) {
    if (type != kTypeQ4_K) return cudaErrorInvalidValue;
    if (which == PrefillKernel::kWgmmaWs) {
      return LaunchWgmmaWsQ4KGemm(kGateUp, tile_rows, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out,
                                  stream, tile_count);
    }
    return LaunchWgmmaQ4KGemm(kGateUp, tile_rows, tiles, num_tiles, a, a_index, K, N, out_cols, act_out, f32_out, stream,
                              tile_count);
  }
  if (which != PrefillKernel::kPipelined) {
    if (type != kTypeQ4_K || tile_rows < 1 || tile_rows > kStreamedMaxTileRows) return cudaErrorInvalidValue;
    switch (which) {
      case PrefillKernel::kStreamed:
        return LaunchStreamed<kGateUp, PrefillKernel::kStreamed>(tile_rows, tiles, num_tiles, a, a_index, K, N,
                                                                 out_cols, act_out, f32_out, stream, tile_count, schedule);
      case PrefillKernel::kStreamedL2Lines256:
        return LaunchStreamed<kGateUp, PrefillKernel::kStreamedL2Lines256>(tile_rows, tiles, num_tiles, a, a_index, K,
                                                                           N, out_cols, act_out, f32_out, stream, tile_count, schedule);
      case PrefillKernel::kStreamedUnitPrefetch:
        return LaunchStreamed<kGateUp, PrefillKernel::kStreamedUnitPrefetch>(tile_rows, tiles, num_tiles, a, a_index,
                                                                             K, N, out_cols, act_out, f32_out, stream, tile_count, schedule);
      default: return cudaErrorInvalidValue;
    }
  }
  return DispatchOnType(type, MoeWeightTypes{}, cudaErrorInvalidValue, [&](auto t) {
    return LaunchGemmRows<decltype(t)::value, kGateUp>(tile_rows, tiles, num_tiles, a, a_index, K, N, out_cols,
                                                       act_out, f32_out, stream);
  });
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

// act = SiLU(gate) · up, element by element (f32): the shared expert's middle when its products
// run as dense GEMMs (moe_stage.cc).
__global__ void SiluMulF32Kernel(const float* gate, const float* up, int64_t count, float* act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float g = gate[i];
  act[i] = g / (1.0f + expf(-g)) * up[i];
}

}  // namespace

cudaError_t LaunchDequantizeToF16(uint32_t type, const void* w, int cols, int rows, uint16_t* out,
                                   cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int align = KernelRowAlignment(type);
  if (align == 0 || cols <= 0 || cols % RowLengthMultiple(type) != 0 || reinterpret_cast<uintptr_t>(w) % align != 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchOnType(type, MoeWeightTypes{}, cudaErrorInvalidValue,
                        [&](auto t) { return LaunchDequant<decltype(t)::value>(w, cols, rows, out, stream); });
}

cudaError_t LaunchGatherRowsF16(const float* x, int cols, const int32_t* index, int m, uint16_t* out,
                                 cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  const unsigned gx = static_cast<unsigned>(std::min((cols + kThreads - 1) / kThreads, 16));
  GatherF16Kernel<<<dim3(gx, m), kThreads, 0, stream>>>(x, cols, index, out);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMulF32(const float* gate, const float* up, int64_t count, float* act, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (gate == nullptr || up == nullptr || act == nullptr) return cudaErrorInvalidValue;
  SiluMulF32Kernel<<<static_cast<unsigned>((count + kThreads - 1) / kThreads), kThreads, 0, stream>>>(gate, up, count,
                                                                                                    act);
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
                                cudaStream_t stream, const int* tile_count, StreamedSchedule schedule) {
  return LaunchGemmTyped<true>(which, type, tile_rows, tiles, num_tiles, xb, index, h, 2 * inner, inner, act, nullptr, stream,
                               tile_count, schedule);
}

cudaError_t LaunchPrefillDown(PrefillKernel which, uint32_t type, int tile_rows, const PrefillTile* tiles, int num_tiles,
                              const uint16_t* act, int h, int inner, float* partial, cudaStream_t stream,
                              const int* tile_count, StreamedSchedule schedule) {
  // The epilogue stores column pairs as float2.
  if (h % 2 != 0 || reinterpret_cast<uintptr_t>(partial) % 8 != 0) return cudaErrorInvalidValue;
  return LaunchGemmTyped<false>(which, type, tile_rows, tiles, num_tiles, act, nullptr, inner, h, h, nullptr, partial, stream,
                                tile_count, schedule);
}

}  // namespace tandem::cuda
