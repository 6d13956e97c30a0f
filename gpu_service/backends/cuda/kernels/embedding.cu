#include "gpu_service/backends/cuda/kernels/embedding.cuh"

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// One thread per (token, 32-element chunk); the chunk is written to all S streams.
template <uint32_t kType>
__global__ void EmbeddingGatherKernel(const uint8_t* table, int64_t row_bytes, int64_t rows,
                                      int64_t chunks, const int32_t* tokens, int64_t n, int64_t S,
                                      float* H) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
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
                   cudaStream_t stream) {
  const int64_t chunks = m.cols / 32;
  const int64_t total = n * chunks;
  const int threads = 128;
  return LaunchPdl(EmbeddingGatherKernel<kType>, static_cast<unsigned>((total + threads - 1) / threads), threads, 0, stream,
      static_cast<const uint8_t*>(m.data), m.row_bytes, m.rows, chunks, tokens, n, S, H);
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const DeviceMatrix& table, const int32_t* tokens, int64_t n,
                                  int64_t S, float* H, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!DenseKernelsSupportType(table.type) || table.cols % RowLengthMultiple(table.type) != 0 || S <= 0) return cudaErrorInvalidValue;
  return DispatchOnType(table.type, DenseGgmlWeightTypes{}, cudaErrorInvalidValue,
                        [&](auto t) { return Launch<decltype(t)::value>(table, tokens, n, S, H, stream); });
}

}  // namespace tandem::cuda
