#include "gpu_service/backends/cuda/kernels/embedding.cuh"

#include <algorithm>
#include <cstdint>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kGatherThreads = 128;
constexpr int kRangeBlocksMax = 64;

// Blocks [gather_blocks, gridDim.x) set the ranges (zeroed or filled, GatherRanges::fill): 16-byte
// stores over each range's whole 16-byte units, then its last bytes % 16 one byte a thread.
__device__ void SetRanges(const GatherRanges& z, int block, int blocks) {
  const int64_t t = static_cast<int64_t>(block) * kGatherThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(blocks) * kGatherThreads;
  for (int r = 0; r < z.count; ++r) {
    uint4* p4 = static_cast<uint4*>(z.p[r]);
    const unsigned word = 0x01010101u * z.fill[r];
    const int64_t units = static_cast<int64_t>(z.bytes[r] / 16);
    for (int64_t u = t; u < units; u += stride) p4[u] = make_uint4(word, word, word, word);
    const int64_t tail = static_cast<int64_t>(z.bytes[r] % 16);
    if (t < tail) static_cast<uint8_t*>(z.p[r])[units * 16 + t] = z.fill[r];
  }
}

// One thread per (token, 32-element chunk); the chunk is written to all S streams. Blocks after
// the gather set `ranges` (SetRanges).
template <uint32_t kType>
__global__ void EmbeddingGatherKernel(const uint8_t* table, int64_t row_bytes, int64_t rows,
                                      int64_t chunks, const int32_t* tokens, int64_t n, int64_t S,
                                      float* H, int gather_blocks, const GatherRanges ranges) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  if (static_cast<int>(blockIdx.x) >= gather_blocks) {
    SetRanges(ranges, static_cast<int>(blockIdx.x) - gather_blocks, static_cast<int>(gridDim.x) - gather_blocks);
    return;
  }
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * chunks) return;
  const int64_t t = i / chunks, c = i % chunks;
  const int32_t token = tokens[t];
  float v[32];
  if (token < 0 || token >= rows) {
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = __int_as_float(0x7FC00000);
  } else {
    DequantChunk<kType>(table + token * row_bytes, c, v);
  }
  const int64_t h = chunks * 32;
  for (int64_t s = 0; s < S; ++s) {
    float4* dst = reinterpret_cast<float4*>(H + (t * S + s) * h + c * 32);
#pragma unroll
    for (int l = 0; l < 8; ++l) dst[l] = make_float4(v[4 * l], v[4 * l + 1], v[4 * l + 2], v[4 * l + 3]);
  }
}

template <uint32_t kType>
cudaError_t Launch(const DeviceMatrix& m, const int32_t* tokens, int64_t n, int64_t S, float* H,
                   const GatherRanges& ranges, cudaStream_t stream) {
  const int64_t chunks = m.cols / 32;
  const int64_t total = n * chunks;
  const int64_t gather_blocks = (total + kGatherThreads - 1) / kGatherThreads;
  int64_t units = 0;
  for (int r = 0; r < ranges.count; ++r) units += static_cast<int64_t>((ranges.bytes[r] + 15) / 16);
  const int64_t range_blocks = std::min<int64_t>(kRangeBlocksMax, (units + kGatherThreads - 1) / kGatherThreads);
  if (gather_blocks + range_blocks == 0) return cudaSuccess;
  return LaunchPdl(EmbeddingGatherKernel<kType>, static_cast<unsigned>(gather_blocks + range_blocks), kGatherThreads,
                   0, stream, static_cast<const uint8_t*>(m.data), m.row_bytes, m.rows, chunks, tokens, n, S, H,
                   static_cast<int>(gather_blocks), ranges);
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const DeviceMatrix& table, const int32_t* tokens, int64_t n,
                                  int64_t S, float* H, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  return LaunchEmbeddingGather(table, tokens, n, S, H, GatherRanges{}, stream);
}

cudaError_t LaunchEmbeddingGather(const DeviceMatrix& table, const int32_t* tokens, int64_t n,
                                  int64_t S, float* H, const GatherRanges& ranges, cudaStream_t stream) {
  if (n < 0 || ranges.count < 0 || ranges.count > kGatherMaxRanges) return cudaErrorInvalidValue;
  for (int r = 0; r < ranges.count; ++r) {
    if (ranges.p[r] == nullptr || reinterpret_cast<uintptr_t>(ranges.p[r]) % 16 != 0) return cudaErrorInvalidValue;
  }
  if (!DenseKernelsSupportType(table.type) || table.cols % RowLengthMultiple(table.type) != 0 || S <= 0) return cudaErrorInvalidValue;
  return DispatchOnType(table.type, DenseGgmlWeightTypes{}, cudaErrorInvalidValue,
                        [&](auto t) { return Launch<decltype(t)::value>(table, tokens, n, S, H, ranges, stream); });
}

}  // namespace tandem::cuda
