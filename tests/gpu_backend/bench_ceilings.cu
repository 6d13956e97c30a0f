#include "tests/gpu_backend/bench_ceilings.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "tests/gpu/sweep_read_kernel.cuh"

namespace tandem::bench {
namespace {

__global__ void FillBf16Kernel(__nv_bfloat16* p, uint64_t n) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    p[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
  }
}

class Blas {
 public:
  ~Blas() {
    if (h_ != nullptr) cublasDestroy(h_);
  }
  cublasStatus_t Create() { return cublasCreate(&h_); }
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

template <typename Fn>
absl::StatusOr<float> BestMs(int repeats, Fn fn) {
  absl::StatusOr<cuda::Event> a = cuda::Event::Create(true), b = cuda::Event::Create(true);
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  float best = 1e30f;
  for (int r = 0; r < repeats + 1; ++r) {  // the first pass warms up
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(a->get(), nullptr));
    if (absl::Status s = fn(); !s.ok()) return s;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(b->get(), nullptr));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b->get()));
    float ms = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a->get(), b->get()));
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

}  // namespace

absl::StatusOr<double> MeasureHbmReadBandwidth(uint64_t bytes, int repeats) {
  const uint64_t words = bytes / 16;
  absl::StatusOr<cuda::DeviceBuffer> buf = cuda::DeviceBuffer::Allocate(words * 16 + 16);
  if (!buf.ok()) return buf.status();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(buf->get(), 0x5A, words * 16 + 16));
  int sms = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const uint4* data = buf->as<uint4>();
  uint32_t* sink = reinterpret_cast<uint32_t*>(buf->as<char>() + words * 16);
  absl::StatusOr<float> ms = BestMs(repeats, [&]() -> absl::Status {
    SweepReadKernel<<<sms * 8, 512>>>(data, words, sink);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
  if (!ms.ok()) return ms.status();
  return static_cast<double>(words * 16) / (*ms * 1e-3);
}

absl::StatusOr<double> MeasureBf16GemmRate(int m, int n, int k, int repeats) {
  absl::StatusOr<cuda::DeviceBuffer> a = cuda::DeviceBuffer::Allocate(size_t{2} * m * k);
  absl::StatusOr<cuda::DeviceBuffer> b = cuda::DeviceBuffer::Allocate(size_t{2} * k * n);
  absl::StatusOr<cuda::DeviceBuffer> c = cuda::DeviceBuffer::Allocate(size_t{4} * m * n);
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  if (!c.ok()) return c.status();
  FillBf16Kernel<<<1024, 256>>>(a->as<__nv_bfloat16>(), uint64_t{1} * m * k);
  FillBf16Kernel<<<1024, 256>>>(b->as<__nv_bfloat16>(), uint64_t{1} * k * n);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  Blas blas;
  if (blas.Create() != CUBLAS_STATUS_SUCCESS) return absl::InternalError("cublasCreate failed");
  const float one = 1.0f, zero = 0.0f;
  absl::StatusOr<float> ms = BestMs(repeats, [&]() -> absl::Status {
    const cublasStatus_t st = cublasGemmEx(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a->get(), CUDA_R_16BF, k,
                                           b->get(), CUDA_R_16BF, k, &zero, c->get(), CUDA_R_32F, m,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return absl::InternalError(absl::StrCat("cublasGemmEx: status ", st));
    return absl::OkStatus();
  });
  if (!ms.ok()) return ms.status();
  return 2.0 * m * n * k / (*ms * 1e-3);
}

}  // namespace tandem::bench
