// Prefill products Y = X·Wᵀ on the GPU (X: n × cols f32 activations, W: a DeviceMatrix of any GPU
// weight type, Y: n × rows f32): W is dequantized tile by tile into scratch and multiplied with
// cuBLAS.
//
//   kFast:  f16 weight tiles and f16 activations, f32 accumulation (tensor cores).
//   kFastSplit: both split into f16 hi + lo parts, three products (about 3x kFast's arithmetic).
//   kExact: f32 tiles and activations, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no reduced
//           precision anywhere): the exact mode of docs/MODEL.md §5.
//
// All device memory (the tile, the f16 activations, cuBLAS's workspace) is taken once in Create
// (the FlashInfer "plan"); Run allocates nothing, so it can be captured in a CUDA graph.
// Not thread-safe: one DenseGemm per stream.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

enum class GemmMode {
  kFast,       // f16 weights and activations, f32 accumulation: one tensor-core product
  kFastSplit,  // each operand as f16 hi + lo: hi·hi + hi·lo + lo·hi, three tensor-core products,
               // close to f32 accuracy (used so that rounding does not flip routing picks)
  kExact,      // f32, no TF32
};

struct DenseGemmOptions {
  GemmMode mode = GemmMode::kFast;
  int64_t max_n = 8192;                   // most activation rows in one Run
  int64_t max_cols = 8192;                // widest input dimension
  int64_t tile_bytes = 256ll << 20;       // scratch for one dequantized weight tile
  int64_t workspace_bytes = 32ll << 20;   // cuBLAS workspace
};

class DenseGemm {
 public:
  static absl::StatusOr<std::unique_ptr<DenseGemm>> Create(const DenseGemmOptions& options);
  ~DenseGemm();
  DenseGemm(const DenseGemm&) = delete;
  DenseGemm& operator=(const DenseGemm&) = delete;

  // y (n × w.rows, row stride w.rows) = x (n × w.cols, row stride w.cols) · Wᵀ on `stream`.
  // InvalidArgument when n or w.cols exceed the plan or w's type is not a GPU type.
  absl::Status Run(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream) {
    return Run(w, x, n, y, stream, options_.mode);
  }
  // The same in a chosen precision: a kFast or kFastSplit plan runs any mode (the router's logits
  // exactly: their rounding would change which experts are picked); a kExact plan has no f16
  // scratch, so it refuses the others.
  absl::Status Run(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream, GemmMode mode);

  GemmMode mode() const { return options_.mode; }

 private:
  explicit DenseGemm(const DenseGemmOptions& options) : options_(options) {}
  DenseGemmOptions options_;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer tile_;
  DeviceBuffer x_f16_;
  DeviceBuffer workspace_;
};

// Turns a cuBLAS status into absl::Status (InternalError naming the call).
absl::Status CublasStatus(cublasStatus_t status, const char* what);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_
