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
  if (options.mode == GemmMode::kFast) {
    absl::StatusOr<DeviceBuffer> xb =
        DeviceBuffer::Allocate(static_cast<size_t>(options.max_n * options.max_cols * 2));
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
  if (mode == GemmMode::kFast && options_.mode != GemmMode::kFast) {
    return absl::InvalidArgumentError("DenseGemm::Run: a product in kFast needs a kFast plan (f16 scratch)");
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
  const bool fast = mode == GemmMode::kFast;
  const int64_t elem = fast ? 2 : 4;
  const int64_t tile_rows = std::min<int64_t>(w.rows, options_.tile_bytes / (w.cols * elem));
  const void* b = x;
  if (fast) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchF32ToF16(x, n * w.cols, x_f16_.as<uint16_t>(), stream));
    b = x_f16_.get();
  }
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t r0 = 0; r0 < w.rows; r0 += tile_rows) {
    const int64_t rt = std::min(tile_rows, w.rows - r0);
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDequantizeRows(w, r0, rt, fast, tile_.get(), stream));
    // Column-major view: the tile is cols × rt (lda = cols), x is cols × n, y is rows × n.
    const cublasStatus_t st = cublasGemmEx(
        handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rt), static_cast<int>(n),
        static_cast<int>(w.cols), &alpha, tile_.get(), fast ? CUDA_R_16F : CUDA_R_32F,
        static_cast<int>(w.cols), b, fast ? CUDA_R_16F : CUDA_R_32F, static_cast<int>(w.cols), &beta,
        y + r0, CUDA_R_32F, static_cast<int>(w.rows),
        fast ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
    if (absl::Status s = CublasStatus(st, "cublasGemmEx"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
