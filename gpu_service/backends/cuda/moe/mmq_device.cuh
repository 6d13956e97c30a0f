// Pieces the integer-MMA Q4_K prefill kernels share (expert_prefill_mmq.cu's MmqQ4KKernel family
// and expert_prefill_mmq_lean.cu's MmqLeanKernel): the s8 and tf32 MMAs and ldmatrix by shared address, the
// copy of a tile's quantized activation rows into shared memory (each kernel lays them out its own
// way), and the persistent grid's size. Internal to the moe folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MMQ_DEVICE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MMQ_DEVICE_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"

namespace tandem::cuda::mmq_device {

// d = a · b (int8, m16n8k32), the accumulator input zero: each sub-block's product is scaled by its
// own integer scale before it is summed.
__device__ __forceinline__ void MmaS8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

// c += a · b (m16n8k8, tf32 operands as f32 bit patterns, f32 accumulators).
__device__ __forceinline__ void MmaTf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// v rounded to tf32 (nearest, ties away), as an f32.
__device__ __forceinline__ float RoundTf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
}

// ldmatrix by 32-bit shared address (volatile: it must stay after the ring's wait).
__device__ __forceinline__ void LdMatrixX4S(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The tile's quantized activation rows (hi and lo planes, K bytes each) into shared memory, by the
// block's kThreads threads: first the slots' rows of `a` into s_row (so that the copies issue
// kBatch independent loads a thread per round, none waiting on an index load), then every 16-byte
// chunk c of row r, handed to store(r, c, hi chunk, lo chunk), which puts it where the kernel's
// layout wants it. Starts and ends with the barriers the kernels need around the tile's rows.
template <int kThreads, typename Store>
__device__ __forceinline__ void StageTileRows(const PrefillTile tile, const int32_t* __restrict__ a_index,
                                              const MmqActivations& a, int K, int64_t* s_row, int tid, Store&& store) {
  __syncthreads();  // every warp is done with the previous tile's activations
  if (tid < tile.rows) {
    const int slot = tile.first_slot + tid;
    s_row[tid] = a_index != nullptr ? a_index[slot] : slot;
  }
  __syncthreads();
  const int chunks = K / 16;
  const int total_chunks = tile.rows * chunks;
  constexpr int kBatch = 4;
  for (int i0 = tid; i0 < total_chunks; i0 += kBatch * kThreads) {
    uint4 vh[kBatch], vl[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kThreads;
      if (i < total_chunks) {
        const int64_t off = s_row[i / chunks] * K + (i % chunks) * 16;
        vh[k] = *reinterpret_cast<const uint4*>(a.hi + off);
        vl[k] = *reinterpret_cast<const uint4*>(a.lo + off);
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kThreads;
      if (i < total_chunks) store(i / chunks, i % chunks, vh[k], vl[k]);
    }
  }
}

// Blocks of a persistent launch of kKernel over `units` work units: at most as many as can be
// resident (the occupancy at `smem` bytes of dynamic shared memory, which this also opts the
// kernel into). The attribute and the counts are kept per kernel, device and size: a prefill step
// launches these kernels per layer, and the host time of the queries would delay them.
template <auto kKernel>
cudaError_t PersistentBlocks(int threads, int smem, int64_t units, int64_t* blocks) {
  thread_local int cached_device = -1, cached_smem = -1, sms = 0, per_sm = 0;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device != cached_device || smem != cached_smem) {
    if (cudaError_t e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess) {
      return e;
    }
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) return e;
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, smem);
        e != cudaSuccess) {
      return e;
    }
    cached_device = device;
    cached_smem = smem;
  }
  *blocks = std::min<int64_t>(units, static_cast<int64_t>(std::max(per_sm, 1)) * sms);
  return cudaSuccess;
}

}  // namespace tandem::cuda::mmq_device

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_MMQ_DEVICE_CUH_
