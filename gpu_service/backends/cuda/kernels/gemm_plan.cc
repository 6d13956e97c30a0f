#include "gpu_service/backends/cuda/kernels/gemm_plan.h"

#include <algorithm>
#include <bit>
#include <cmath>

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
    // f16 activations: hi and lo halves (tiled kFastSplit), or rows [hi | hi | lo] (prepared
    // kFastSplit), 6 bytes per value at most.
    absl::StatusOr<DeviceBuffer> xb =
        DeviceBuffer::Allocate(static_cast<size_t>(options.max_n * options.max_cols * 6));
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
  if (const Prepared* p = FindPrepared(w, mode); p != nullptr) return RunPrepared(*p, x, n, y, stream, mode);
  return RunTiled(w, x, n, y, stream, mode);
}

absl::Status DenseGemm::RunTiled(const DeviceMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                                 GemmMode mode) {
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

namespace {
// Copies of each weight in a prepared row (gemm.cuh's layout).
int PreparedCopies(GemmMode mode, const DenseGemmOptions& options) {
  return mode == GemmMode::kFast ? 1 : options.split_one_product ? 3 : 2;
}
}  // namespace

int64_t DenseGemm::PreparedBytes(const DeviceMatrix& w, GemmMode mode, const DenseGemmOptions& options) {
  if (mode == GemmMode::kExact) return 0;
  return w.rows * w.cols * 2 * PreparedCopies(mode, options);
}

const DenseGemm::Prepared* DenseGemm::FindPrepared(const DeviceMatrix& w, GemmMode mode) const {
  if (mode == GemmMode::kExact) return nullptr;
  const auto it = prepared_.find(w.data);
  if (it == prepared_.end()) return nullptr;
  const Prepared& p = it->second;
  if (p.source.type != w.type || p.source.cols != w.cols || p.source.rows != w.rows ||
      p.source.row_bytes != w.row_bytes) {
    return nullptr;
  }
  if (mode == GemmMode::kFastSplit && p.copies < 2) return nullptr;
  return &p;
}

absl::Status DenseGemm::Prepare(const DeviceMatrix& w, GemmMode mode, cudaStream_t stream) {
  if (mode == GemmMode::kExact) return absl::OkStatus();
  if (options_.mode == GemmMode::kExact) {
    return absl::InvalidArgumentError("DenseGemm::Prepare: an f16 copy needs a kFast or kFastSplit plan");
  }
  if (w.data == nullptr || w.rows <= 0 || w.cols <= 0 || !DenseKernelsSupportType(w.type) ||
      w.cols % RowLengthMultiple(w.type) != 0 || w.cols > options_.max_cols) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemm::Prepare: weight type ", w.type, " with cols=", w.cols,
                                                   " rows=", w.rows, " is not supported (max_cols=",
                                                   options_.max_cols, ")"));
  }
  if (FindPrepared(w, mode) != nullptr) return absl::OkStatus();
  // The scale: max |w| (device reduction, one wait: this runs at load time).
  if (max_bits_.get() == nullptr) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(sizeof(unsigned int));
    if (!b.ok()) return b.status();
    max_bits_ = *std::move(b);
  }
  unsigned int bits = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(max_bits_.get(), 0, sizeof(unsigned int), stream));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchMaxAbs(w, max_bits_.as<unsigned int>(), stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&bits, max_bits_.get(), sizeof(bits), cudaMemcpyDeviceToHost, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const float max_abs = std::bit_cast<float>(bits);
  // 2^e·max |w| in [2^13, 2^14): far from f16's overflow (65504) even after rounding, and a
  // weight 2^-20 of the largest still has a normal lo half (f16's normals start at 2^-14).
  int e = 0;
  if (std::isfinite(max_abs) && max_abs > 0.0f) {
    int exponent = 0;
    std::frexp(max_abs, &exponent);  // max_abs < 2^exponent
    e = std::clamp(14 - exponent, -100, 100);
  }
  Prepared p;
  p.source = w;
  p.copies = PreparedCopies(mode, options_);
  p.alpha = std::ldexp(1.0f, -e);
  absl::StatusOr<DeviceBuffer> data = DeviceBuffer::Allocate(static_cast<size_t>(PreparedBytes(w, mode, options_)));
  if (!data.ok()) return data.status();
  p.data = *std::move(data);
  TANDEM_CUDA_RETURN_IF_ERROR(
      LaunchDequantizeToF16Layout(w, p.copies, std::ldexp(1.0f, e), p.data.as<uint16_t>(), stream));
  // Runs may come on other streams: the copy is complete before Prepare returns.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (auto it = prepared_.find(w.data); it != prepared_.end()) {
    prepared_bytes_ -= static_cast<int64_t>(it->second.data.bytes());
    prepared_.erase(it);
  }
  prepared_bytes_ += static_cast<int64_t>(p.data.bytes());
  prepared_.emplace(w.data, std::move(p));
  return absl::OkStatus();
}

absl::Status DenseGemm::RunPrepared(const Prepared& p, const float* x, int64_t n, float* y, cudaStream_t stream,
                                    GemmMode mode) {
  const int64_t cols = p.source.cols, rows = p.source.rows;
  const uint16_t* w16 = p.data.as<uint16_t>();
  uint16_t* x16 = x_f16_.as<uint16_t>();
  const float beta0 = 0.0f, beta1 = 1.0f;
  // Column-major view: the copy is (copies · cols) × rows with the K range of one product at the
  // start of each column; x16 holds n columns; y is rows × n.
  auto gemm = [&](const uint16_t* a, int64_t lda, int64_t k, const uint16_t* b, int64_t ldb, const float* beta) {
    return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                                     static_cast<int>(k), &p.alpha, a, CUDA_R_16F, static_cast<int>(lda), b,
                                     CUDA_R_16F, static_cast<int>(ldb), beta, y, CUDA_R_32F, static_cast<int>(rows),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx (prepared)");
  };
  const int64_t lda = p.copies * cols;
  if (mode == GemmMode::kFast) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchF32ToF16(x, n * cols, x16, stream));
    return gemm(w16, lda, cols, x16, cols, &beta0);
  }
  // [hi | hi | lo] activation rows against [hi | lo | hi] (one product: hi·hi + lo·hi + hi·lo) or
  // [hi | lo] (the first two thirds, then hi·lo onto the output).
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchF32ToF16SplitRows(x, n, cols, x16, stream));
  if (p.copies == 3) return gemm(w16, lda, 3 * cols, x16, 3 * cols, &beta0);
  if (absl::Status s = gemm(w16, lda, 2 * cols, x16, 3 * cols, &beta0); !s.ok()) return s;
  return gemm(w16, lda, cols, x16 + 2 * cols, 3 * cols, &beta1);
}

}  // namespace tandem::cuda
