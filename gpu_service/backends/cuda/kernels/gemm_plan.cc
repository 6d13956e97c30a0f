#include "gpu_service/backends/cuda/kernels/gemm_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"

namespace tandem::cuda {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error in ", what, ": ", cublasGetStatusName(status),
                                          " (", cublasGetStatusString(status), ")"));
}

absl::StatusOr<std::unique_ptr<DenseGemm>> DenseGemm::Create(const DenseGemmOptions& options) {
  if (options.max_n <= 0 || options.max_cols <= 0 || options.tile_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemmOptions: max_n=", options.max_n, " max_cols=",
                                                   options.max_cols, " tile_bytes=", options.tile_bytes,
                                                   " must all be positive"));
  }
  const int64_t elem = options.mode == GemmMode::kFast ? 2 : 4;
  if (options.tile_bytes < options.max_cols * elem) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemmOptions.tile_bytes=", options.tile_bytes,
                                                   " cannot hold one row of ", options.max_cols, " columns"));
  }
  std::unique_ptr<DenseGemm> g(new DenseGemm(options));
  if (absl::Status s = CublasStatus(cublasCreate(&g->handle_), "cublasCreate"); !s.ok()) return s;
  absl::StatusOr<DeviceBuffer> tile = DeviceBuffer::Allocate(static_cast<size_t>(options.tile_bytes));
  if (!tile.ok()) return tile.status();
  g->tile_ = *std::move(tile);
  if (options.mode != GemmMode::kExact) {
    // f16 activations, hi and lo halves (the lo half is used by kFastSplit only).
    absl::StatusOr<DeviceBuffer> xb =
        DeviceBuffer::Allocate(static_cast<size_t>(options.max_n * options.max_cols * 4));
    if (!xb.ok()) return xb.status();
    g->x_f16_ = *std::move(xb);
  }
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(static_cast<size_t>(options.workspace_bytes));
  if (!ws.ok()) return ws.status();
  g->workspace_ = *std::move(ws);
  if (absl::Status s = CublasStatus(
          cublasSetWorkspace(g->handle_, g->workspace_.get(), static_cast<size_t>(options.workspace_bytes)),
          "cublasSetWorkspace");
      !s.ok()) {
    return s;
  }
  // Exact mode must not let cuBLAS pick TF32 or other reduced-precision paths.
  const cublasMath_t math = options.mode == GemmMode::kExact ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH;
  if (absl::Status s = CublasStatus(cublasSetMathMode(g->handle_, math), "cublasSetMathMode"); !s.ok()) {
    return s;
  }
  return g;
}

DenseGemm::~DenseGemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

absl::Status DenseGemm::Run(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                            GemmMode mode) {
  if (n <= 0) return absl::OkStatus();
  if (mode != GemmMode::kExact && options_.mode == GemmMode::kExact) {
    return absl::InvalidArgumentError("DenseGemm::Run: an f16 product needs a kFast or kFastSplit plan (f16 scratch)");
  }
  if (n > options_.max_n || w.cols > options_.max_cols) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemm::Run: n=", n, " cols=", w.cols,
                                                   " exceed the plan (max_n=", options_.max_n,
                                                   ", max_cols=", options_.max_cols, ")"));
  }
  if (!DenseKernelsSupportType(w.type) || w.cols % RowLengthMultiple(w.type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemm::Run: weight type ", w.type,
                                                   " with cols=", w.cols, " is not supported on the GPU"));
  }
  if (absl::Status s = CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"); !s.ok()) return s;
  const bool f16 = mode != GemmMode::kExact;
  const bool split = mode == GemmMode::kFastSplit;
  // Bytes per weight in the tile: f32, f16, or f16 hi + lo.
  const int64_t elem = split ? 4 : f16 ? 2 : 4;
  const int64_t tile_rows = std::min<int64_t>(w.rows, options_.tile_bytes / (w.cols * elem));
  const void* b = x;
  uint16_t* x_hi = x_f16_.as<uint16_t>();
  uint16_t* x_lo = split ? x_hi + n * w.cols : nullptr;
  if (f16) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchF32ToF16(x, n * w.cols, x_hi, stream, x_lo));
    b = x_hi;
  }
  const float alpha = 1.0f, beta0 = 0.0f, beta1 = 1.0f;
  const cudaDataType_t type = f16 ? CUDA_R_16F : CUDA_R_32F;
  const cublasComputeType_t compute = f16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
  for (int64_t r0 = 0; r0 < w.rows; r0 += tile_rows) {
    const int64_t rt = std::min(tile_rows, w.rows - r0);
    void* w_hi = tile_.get();
    void* w_lo = split ? static_cast<void*>(tile_.as<uint16_t>() + rt * w.cols) : nullptr;
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDequantizeRows(w, r0, rt, f16, w_hi, stream, w_lo));
    // Column-major view: the tile is cols × rt (lda = cols), x is cols × n, y is rows × n.
    auto gemm = [&](const void* wa, const void* xb, const float* beta) {
      return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rt), static_cast<int>(n),
                                       static_cast<int>(w.cols), &alpha, wa, type, static_cast<int>(w.cols), xb, type,
                                       static_cast<int>(w.cols), beta, y + r0, CUDA_R_32F, static_cast<int>(w.rows),
                                       compute, CUBLAS_GEMM_DEFAULT),
                          "cublasGemmEx");
    };
    if (absl::Status s = gemm(w_hi, b, &beta0); !s.ok()) return s;
    if (split) {
      // The small cross terms after the main one; lo·lo (~2^-22 relative) is left out.
      if (absl::Status s = gemm(w_hi, x_lo, &beta1); !s.ok()) return s;
      if (absl::Status s = gemm(w_lo, x_hi, &beta1); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
