// Prefill products Y = X·Wᵀ on the GPU (X: n × cols f32 activations, W: a DeviceMatrix of any GPU
// weight type, Y: n × rows f32), multiplied with cuBLAS. W is either dequantized tile by tile into
// scratch on every call, or, once Prepare has run for it, read from a persistent f16 copy (the
// f16 modes then skip the dequantization altogether).
//
//   kFast:  f16 weights and f16 activations, f32 accumulation (tensor cores).
//   kFastSplit: both split into f16 hi + lo parts, hi·hi + hi·lo + lo·hi (about 3x kFast's
//           arithmetic). Prepared, the three terms are one product over rows laid out as
//           [hi | lo | hi] (weights) and [hi | hi | lo] (activations), K = 3 · cols, so that the
//           output is written once instead of read and rewritten by two more products.
//   kExact: f32 tiles and activations, CUBLAS_COMPUTE_32F_PEDANTIC (no TF32, no reduced
//           precision anywhere): the exact mode of docs/MODEL.md §5. Never prepared.
//
// All per-call device memory (the tile, the f16 activations, cuBLAS's workspace) is taken once in
// Create (the FlashInfer "plan"), the prepared copies once in Prepare (at load); Run allocates
// nothing, so it can be captured in a CUDA graph. Not thread-safe: one DenseGemm per stream.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

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
  // Layout of a matrix prepared for kFastSplit: true: rows [hi | lo | hi], 6 bytes per weight,
  // one product per Run; false: rows [hi | lo], 4 bytes per weight, two products per Run
  // ([hi | lo]·[hi | hi], then hi·lo added onto the output).
  bool split_one_product = true;
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
  // A Run of w (same data pointer, type and shape) in kFast, or in kFastSplit when prepared for
  // it, reads the prepared copy (see Prepare); other Runs dequantize tile by tile.
  absl::Status Run(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream, GemmMode mode);

  // Makes the persistent f16 copy of w that Runs in `mode` read instead of dequantizing w on every
  // call: hi only for kFast (2 bytes per weight), hi and lo for kFastSplit (6 or 4 bytes per weight,
  // DenseGemmOptions::split_one_product; such a copy serves kFast Runs too). Call at load time,
  // not during graph capture: it allocates, and waits on `stream` for the scale (a power of two
  // that puts max |w| at 2^14, undone exactly through alpha: weights beyond f16's range stay
  // finite and small ones keep a normal lo; on Q8_0 / f32 weights of std 0.02 it changed the
  // split's error by < 5%, GpuDenseGemmStudy).
  // Cached by w.data: the caller keeps the weights unchanged while this DenseGemm lives (a matrix
  // with the same pointer but another type or shape replaces the entry). Preparing again is a
  // no-op, except that a kFast copy is replaced by a kFastSplit one. kExact: nothing to prepare
  // (OK). InvalidArgument for an unsupported type or shape or a kExact plan with an f16 mode;
  // the CUDA error of a failed allocation (nothing is kept then).
  absl::Status Prepare(const DeviceMatrix& w, GemmMode mode, cudaStream_t stream = nullptr);
  absl::Status Prepare(const DeviceMatrix& w, cudaStream_t stream = nullptr) { return Prepare(w, options_.mode, stream); }

  // Device bytes the copy of w prepared for `mode` takes under `options`.
  static int64_t PreparedBytes(const DeviceMatrix& w, GemmMode mode, const DenseGemmOptions& options);
  // Device bytes held by all prepared copies; whether a Run of w in `mode` would read one.
  int64_t prepared_bytes() const { return prepared_bytes_; }
  bool IsPrepared(const DeviceMatrix& w, GemmMode mode) const { return FindPrepared(w, mode) != nullptr; }

  GemmMode mode() const { return options_.mode; }

 private:
  // A prepared copy: `copies` f16 values per weight per row (1: [hi], 2: [hi | lo], 3: [hi | lo | hi]),
  // every value scaled by 1 / alpha.
  struct Prepared {
    DeviceMatrix source;
    DeviceBuffer data;
    int copies = 0;
    float alpha = 1.0f;
  };

  explicit DenseGemm(const DenseGemmOptions& options) : options_(options) {}
  const Prepared* FindPrepared(const DeviceMatrix& w, GemmMode mode) const;
  absl::Status RunPrepared(const Prepared& p, const float* x, int64_t n, float* y, cudaStream_t stream,
                           GemmMode mode);
  absl::Status RunTiled(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                        GemmMode mode);

  DenseGemmOptions options_;
  std::unordered_map<const void*, Prepared> prepared_;
  int64_t prepared_bytes_ = 0;
  DeviceBuffer max_bits_;  // one unsigned, Prepare's max |w|
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer tile_;
  DeviceBuffer x_f16_;
  DeviceBuffer workspace_;
};

// Turns a cuBLAS status into absl::Status (InternalError naming the call).
absl::Status CublasStatus(cublasStatus_t status, const char* what);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_PLAN_H_
