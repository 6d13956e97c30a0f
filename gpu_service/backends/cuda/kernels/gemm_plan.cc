#include "gpu_service/backends/cuda/kernels/gemm_plan.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"

namespace tandem::cuda {

GemmAlgo GemmAlgoFromEnv() {
  static const GemmAlgo algo = EnvSwitch("TANDEM_GEMM_NO_SPLITK") ? GemmAlgo::kLtNoSplitK
                               : EnvSwitch("TANDEM_GEMM_LT")      ? GemmAlgo::kLt
                                                                  : GemmAlgo::kGemmEx;
  return algo;
}

F8Terms F8TermsFromEnv() {
  static const F8Terms terms = EnvChoice<F8Terms>(
      "TANDEM_GEMM_F8_TERMS",
      {{"xlo", F8Terms::kActivationLo}, {"both", F8Terms::kBoth}, {"wlo", F8Terms::kWeightLo}},
      F8Terms::kActivationLo);
  return terms;
}

namespace {
// On unless TANDEM_GEMM_SPLIT_F8=0 (measured faster end to end; gemm_plan.h). Unlike
// EnvSwitchDefaultOn, an empty value leaves it on.
ProcessSwitch g_split_f8{[] {
  const char* v = std::getenv("TANDEM_GEMM_SPLIT_F8");
  return v == nullptr || std::strcmp(v, "0") != 0;
}};
ProcessInteger g_split_f8_min_weights{[] {
  return EnvInteger("TANDEM_GEMM_SPLIT_F8_MIN_WEIGHTS", int64_t{2048} * 2048, 0, std::numeric_limits<long long>::max());
}};
}  // namespace

bool SplitOneProduct() {
  static const bool on = EnvSwitchDefaultOn("TANDEM_GEMM_SPLIT_ONE_PRODUCT");
  return on;
}

void SetSplitF8(bool on) { g_split_f8.set(on); }
bool SplitF8() { return g_split_f8.on(); }

void SetSplitF8MinWeights(int64_t weights) { g_split_f8_min_weights.set(weights); }
int64_t SplitF8MinWeights() { return static_cast<int64_t>(g_split_f8_min_weights.value()); }

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
    // f16 activations: hi and lo halves (tiled kFastSplit), or split rows [lo | hi | hi] (prepared
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
  if (options.mode != GemmMode::kExact && (options.prepared_algo != GemmAlgo::kGemmEx || options.split_f8)) {
    if (absl::Status s = CublasStatus(cublasLtCreate(&g->lt_), "cublasLtCreate"); !s.ok()) return s;
  }
  if (options.mode != GemmMode::kExact && options.split_f8) {
    absl::StatusOr<DeviceBuffer> st = DeviceBuffer::Allocate(256);
    if (!st.ok()) return st.status();
    g->f8_state_ = *std::move(st);
    // The max |x| and its block counter start at 0; every conversion leaves them so.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(g->f8_state_.get(), 0, 256));
    absl::StatusOr<DeviceBuffer> x8 = DeviceBuffer::Allocate(static_cast<size_t>(options.max_n * options.max_cols * 2));
    if (!x8.ok()) return x8.status();
    g->x8_ = *std::move(x8);
  }
  // Exact mode must not let cuBLAS pick TF32 or other reduced-precision paths.
  const cublasMath_t math = options.mode == GemmMode::kExact ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH;
  if (absl::Status s = CublasStatus(cublasSetMathMode(g->handle_, math), "cublasSetMathMode"); !s.ok()) {
    return s;
  }
  return g;
}

DenseGemm::~DenseGemm() {
  lt_plans_.clear();  // their descriptors before the handle
  f8_plans_.clear();
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (handle_ != nullptr) cublasDestroy(handle_);
}

DenseGemm::LtPlan::~LtPlan() {
  if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
  if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
  if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
  if (op != nullptr) cublasLtMatmulDescDestroy(op);
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
  ForgetConverted();  // the f16 scratch is rewritten below
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

// The exponent e of the prepared copy's scale 2^e: 2^e·max |w| in [2^13, 2^14), far from f16's
// overflow (65504) even after rounding, and a weight 2^-20 of the largest still has a normal lo
// half (f16's normals start at 2^-14). 0 for a zero or non-finite maximum.
int ScaleExponent(float max_abs) {
  if (!std::isfinite(max_abs) || max_abs <= 0.0f) return 0;
  int exponent = 0;
  std::frexp(max_abs, &exponent);  // max_abs < 2^exponent
  return std::clamp(14 - exponent, -100, 100);
}
}  // namespace

int64_t DenseGemm::PreparedBytes(const DeviceMatrix& w, GemmMode mode, const DenseGemmOptions& options) {
  if (mode == GemmMode::kExact) return 0;
  if (UsesF8(mode, w.rows, w.cols, options)) return F8CopyBytes(w.rows, w.cols);
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
  if (mode == GemmMode::kFastSplit && p.copies < 2 && !p.f8) return nullptr;
  return &p;
}

absl::Status DenseGemm::CheckPreparable(const DeviceMatrix& w, const char* who) const {
  if (w.data == nullptr || w.rows <= 0 || w.cols <= 0 || !DenseKernelsSupportType(w.type) ||
      w.cols % RowLengthMultiple(w.type) != 0 || w.cols > options_.max_cols) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": weight type ", w.type, " with cols=", w.cols, " rows=",
                                                   w.rows, " is not supported (max_cols=", options_.max_cols, ")"));
  }
  return absl::OkStatus();
}

absl::Status DenseGemm::Prepare(const DeviceMatrix& w, GemmMode mode, cudaStream_t stream) {
  if (mode == GemmMode::kExact) return absl::OkStatus();
  if (options_.mode == GemmMode::kExact) {
    return absl::InvalidArgumentError("DenseGemm::Prepare: an f16 copy needs a kFast or kFastSplit plan");
  }
  if (absl::Status s = CheckPreparable(w, "DenseGemm::Prepare"); !s.ok()) return s;
  if (FindPrepared(w, mode) != nullptr) return absl::OkStatus();
  absl::StatusOr<float> max_abs = MaxAbs(w, stream);
  if (!max_abs.ok()) return max_abs.status();
  const int e = ScaleExponent(*max_abs);
  Prepared p;
  p.source = w;
  p.copies = PreparedCopies(mode, options_);
  p.alpha = std::ldexp(1.0f, -e);
  if (UsesF8(mode, w.rows, w.cols, options_)) {
    const DeviceMatrix* parts[] = {&w};
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> copy = MakeF8Copy(parts, w.rows, e, *max_abs, stream);
    if (!copy.ok()) return copy.status();
    p.data = *std::move(copy);
    SetF8Offsets(p, w.rows);
  } else {
    absl::StatusOr<DeviceBuffer> data = DeviceBuffer::Allocate(static_cast<size_t>(PreparedBytes(w, mode, options_)));
    if (!data.ok()) return data.status();
    p.data = std::make_shared<DeviceBuffer>(*std::move(data));
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchDequantizeToF16Layout(w, p.copies, std::ldexp(1.0f, e), p.data->as<uint16_t>(), stream));
  }
  // Runs may come on other streams: the copy is complete before Prepare returns.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  Erase(w.data);
  prepared_bytes_ += static_cast<int64_t>(p.data->bytes());
  prepared_.emplace(w.data, std::move(p));
  return absl::OkStatus();
}

void DenseGemm::Erase(const void* data) {
  auto it = prepared_.find(data);
  if (it == prepared_.end()) return;
  // A stack's buffer counts until its last part lets go of it.
  if (it->second.data.use_count() == 1) prepared_bytes_ -= static_cast<int64_t>(it->second.data->bytes());
  prepared_.erase(it);
}

absl::StatusOr<float> DenseGemm::MaxAbs(const DeviceMatrix& w, cudaStream_t stream) {
  // max |w| (device reduction, one wait: this runs at load time).
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
  return std::bit_cast<float>(bits);
}

absl::StatusOr<int64_t> DenseGemm::PrepareStack(std::span<const DeviceMatrix* const> parts, GemmMode mode,
                                                cudaStream_t stream) {
  if (mode == GemmMode::kExact || options_.mode == GemmMode::kExact) {
    return absl::InvalidArgumentError("DenseGemm::PrepareStack: needs an f16 mode and a kFast or kFastSplit plan");
  }
  if (parts.empty()) return absl::InvalidArgumentError("DenseGemm::PrepareStack: no parts");
  const int64_t cols = parts[0]->cols;
  int64_t rows = 0;
  float max_abs = 0.0f, min_max = INFINITY;
  for (const DeviceMatrix* w : parts) {
    if (absl::Status s = CheckPreparable(*w, "DenseGemm::PrepareStack"); !s.ok()) return s;
    if (w->cols != cols) return absl::FailedPreconditionError("DenseGemm::PrepareStack: parts differ in cols");
    if (prepared_.count(w->data) != 0) {
      return absl::FailedPreconditionError("DenseGemm::PrepareStack: a part is already prepared");
    }
    for (const DeviceMatrix* o : parts) {
      if (o != w && o->data == w->data) return absl::FailedPreconditionError("DenseGemm::PrepareStack: a part twice");
    }
    absl::StatusOr<float> m = MaxAbs(*w, stream);
    if (!m.ok()) return m.status();
    if (!std::isfinite(*m)) return absl::FailedPreconditionError("DenseGemm::PrepareStack: a non-finite weight");
    max_abs = std::max(max_abs, *m);
    min_max = std::min(min_max, *m);
    rows += w->rows;
  }
  if (min_max > 0.0f && max_abs > std::ldexp(min_max, 12)) {
    return absl::FailedPreconditionError("DenseGemm::PrepareStack: the parts' scales are more than 2^12 apart");
  }
  const int64_t stack_rows = (rows + 7) / 8 * 8;
  const int copies = PreparedCopies(mode, options_);
  const int e = ScaleExponent(max_abs);
  const bool f8 = UsesF8(mode, stack_rows, cols, options_);
  std::shared_ptr<DeviceBuffer> buffer;
  if (f8) {
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> copy = MakeF8Copy(parts, stack_rows, e, max_abs, stream);
    if (!copy.ok()) return copy.status();
    buffer = *std::move(copy);
  } else {
    absl::StatusOr<DeviceBuffer> data = DeviceBuffer::Allocate(static_cast<size_t>(stack_rows * cols * 2 * copies));
    if (!data.ok()) return data.status();
    buffer = std::make_shared<DeviceBuffer>(*std::move(data));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer->get(), 0, buffer->bytes(), stream));  // the padding rows
  }
  std::vector<Prepared> made;
  int64_t offset = 0;
  for (const DeviceMatrix* w : parts) {
    Prepared p;
    p.source = *w;
    p.data = buffer;
    p.row_offset = offset;
    p.stack_rows = stack_rows;
    p.stack_first = parts[0]->data;
    p.copies = copies;
    p.alpha = std::ldexp(1.0f, -e);
    if (f8) {
      SetF8Offsets(p, stack_rows);  // MakeF8Copy wrote the rows
    } else {
      TANDEM_CUDA_RETURN_IF_ERROR(LaunchDequantizeToF16Layout(*w, copies, std::ldexp(1.0f, e),
                                                              const_cast<uint16_t*>(p.weights()), stream));
    }
    offset += w->rows;
    made.push_back(std::move(p));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  prepared_bytes_ += static_cast<int64_t>(buffer->bytes());
  for (Prepared& p : made) prepared_.emplace(p.source.data, std::move(p));
  return stack_rows;
}

int64_t DenseGemm::StackRows(std::span<const DeviceMatrix* const> parts) const {
  if (parts.empty()) return 0;
  int64_t offset = 0, stack_rows = 0;
  const DeviceBuffer* buffer = nullptr;
  for (const DeviceMatrix* w : parts) {
    const auto it = prepared_.find(w->data);
    if (it == prepared_.end()) return 0;
    const Prepared& p = it->second;
    if (p.source.type != w->type || p.source.cols != w->cols || p.source.rows != w->rows ||
        p.source.row_bytes != w->row_bytes || p.stack_first != parts[0]->data || p.row_offset != offset) {
      return 0;
    }
    if (buffer != nullptr && p.data.get() != buffer) return 0;
    buffer = p.data.get();
    stack_rows = p.stack_rows;
    offset += w->rows;
  }
  return offset <= stack_rows ? stack_rows : 0;
}

DenseGemm::F16Input DenseGemm::HiThirdsOf(const F16Input& split) {
  return F16Input{split.data + kSplitHiThird * split.cols, split.n, split.cols, GemmMode::kFast, 3 * split.cols};
}

absl::Status DenseGemm::CheckInput(const F16Input& in, int64_t cols) const {
  if (in.mode == GemmMode::kExact || in.data == nullptr || in.cols != cols || in.n < 0 || in.n > options_.max_n ||
      (in.ld != 0 && (in.mode != GemmMode::kFast || in.ld < cols))) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemm: converted input of ", in.n, " x ", in.cols,
                                                   " does not fit a product of ", cols, " columns"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DenseGemm::F16Input> DenseGemm::ConvertInput(const float* x, int64_t n, int64_t cols, GemmMode mode,
                                                            cudaStream_t stream) {
  if (mode == GemmMode::kExact || options_.mode == GemmMode::kExact) {
    return absl::InvalidArgumentError("DenseGemm::ConvertInput: needs an f16 mode and a kFast or kFastSplit plan");
  }
  if (n < 0 || n > options_.max_n || cols <= 0 || cols > options_.max_cols) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemm::ConvertInput: n=", n, " cols=", cols,
                                                   " exceed the plan"));
  }
  uint16_t* x16 = x_f16_.as<uint16_t>();
  // A fused kernel already left exactly these rows in the scratch (SetConverted). (In a split_f8
  // plan, the F8 products derive their fp8 rows from the split rows when they first need them.)
  if (HoldsConverted(x, n, cols, mode)) return F16Input{x16, n, cols, mode};
  ForgetConverted();
  if (mode == GemmMode::kFast) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchF32ToF16(x, n * cols, x16, stream));
  } else {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchF32ToF16SplitRows(x, n, cols, x16, stream));
  }
  return F16Input{x16, n, cols, mode};
}

absl::Status DenseGemm::RunInput(const DeviceMatrix& w, const F16Input& in, float* y, cudaStream_t stream) {
  if (absl::Status s = CheckInput(in, w.cols); !s.ok()) return s;
  const Prepared* p = FindPrepared(w, in.mode);
  if (p == nullptr) return absl::FailedPreconditionError("DenseGemm::RunInput: the matrix is not prepared for the mode");
  if (in.n == 0) return absl::OkStatus();
  if (absl::Status s = CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"); !s.ok()) return s;
  return Gemm16(*p, w.rows, in, y, w.rows, stream);
}

absl::Status DenseGemm::RunStack(std::span<const DeviceMatrix* const> parts, const F16Input& in, float* y,
                                 cudaStream_t stream) {
  const int64_t stack_rows = StackRows(parts);
  if (stack_rows == 0) return absl::FailedPreconditionError("DenseGemm::RunStack: the parts are not one prepared stack");
  const Prepared* p = FindPrepared(*parts[0], in.mode);
  if (p == nullptr) return absl::FailedPreconditionError("DenseGemm::RunStack: the stack is not prepared for the mode");
  if (absl::Status s = CheckInput(in, parts[0]->cols); !s.ok()) return s;
  if (in.n == 0) return absl::OkStatus();
  if (absl::Status s = CublasStatus(cublasSetStream(handle_, stream), "cublasSetStream"); !s.ok()) return s;
  return Gemm16(*p, stack_rows, in, y, stack_rows, stream);
}

absl::Status DenseGemm::Gemm16(const Prepared& p, int64_t rows, const F16Input& in, float* y, int64_t ldy,
                               cudaStream_t stream) {
  if (p.f8 && in.mode == GemmMode::kFastSplit) return GemmF8(p, rows, in, y, ldy, stream);
  const int64_t cols = p.source.cols, n = in.n;
  const uint16_t* w16 = p.weights();
  const float beta0 = 0.0f, beta1 = 1.0f;
  // Column-major view: the copy is (copies · cols) × rows with the K range of one product at the
  // start of each column; the input holds n columns; y is rows × n (leading dimension ldy).
  auto gemm = [&](const uint16_t* a, int64_t lda, int64_t k, const uint16_t* b, int64_t ldb, const float* beta) {
    if (options_.prepared_algo != GemmAlgo::kGemmEx) {
      return GemmLt(rows, n, k, p.alpha, a, lda, b, ldb, *beta, y, ldy, stream);
    }
    return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                                     static_cast<int>(k), &p.alpha, a, CUDA_R_16F, static_cast<int>(lda), b,
                                     CUDA_R_16F, static_cast<int>(ldb), beta, y, CUDA_R_32F, static_cast<int>(ldy),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx (prepared)");
  };
  const int64_t lda = p.copies * cols;
  if (in.mode == GemmMode::kFast) return gemm(w16, lda, cols, in.data, in.ld > 0 ? in.ld : cols, &beta0);
  // Split rows [lo | hi | hi] (gemm.cuh) against [hi | lo | hi] (one product: hi·lo + lo·hi, then
  // hi·hi) or [hi | lo] (against the two hi thirds, then hi·lo onto the output).
  static_assert(kSplitLoThird == 0 && kSplitHiThird == 1, "the products below read [lo | hi | hi]");
  if (p.copies == 3) return gemm(w16, lda, 3 * cols, in.data, 3 * cols, &beta0);
  if (absl::Status s = gemm(w16, lda, 2 * cols, in.data + kSplitHiThird * cols, 3 * cols, &beta0); !s.ok()) return s;
  return gemm(w16, lda, cols, in.data + kSplitLoThird * cols, 3 * cols, &beta1);
}

cublasStatus_t DenseGemm::LtHeuristic(const LtPlan& plan, uint32_t align_a, uint32_t align_b, uint32_t align_d,
                                      int want, cublasLtMatmulHeuristicResult_t* results, int* found) const {
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t hs = cublasLtMatmulPreferenceCreate(&pref);
  if (hs != CUBLAS_STATUS_SUCCESS) return hs;
  const size_t ws = static_cast<size_t>(options_.workspace_bytes);
  hs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  // Only algorithms that work with the pointers' real alignment (a part of a stack, the lo third
  // of split rows may start off a 256-byte boundary).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attr, value] : aligns) {
    if (hs == CUBLAS_STATUS_SUCCESS) hs = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  }
  if (hs == CUBLAS_STATUS_SUCCESS) {
    hs = cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.d, plan.d, pref, want, results, found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return hs;
}

absl::StatusOr<const DenseGemm::LtPlan*> DenseGemm::FindLtPlan(const LtKey& key) {
  if (auto it = lt_plans_.find(key); it != lt_plans_.end()) return it->second.get();
  if (lt_ == nullptr) return absl::FailedPreconditionError("DenseGemm: no cublasLt handle (prepared_algo is kGemmEx)");
  const auto [m, n, k, lda, ldb, ldd, beta_zero, align_a, align_b, align_d] = key;
  // A server sees every step size: the plans of old sizes go before they pile up (a few hundred
  // bytes each, rebuilt on the host in microseconds).
  if (lt_plans_.size() >= 4096) lt_plans_.clear();
  auto plan = std::make_unique<LtPlan>();
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const auto ok = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
  bool made = ok(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
              ok(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) &&
              ok(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) &&
              ok(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16F, static_cast<uint64_t>(k), static_cast<uint64_t>(m),
                                            lda)) &&
              ok(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16F, static_cast<uint64_t>(k), static_cast<uint64_t>(n),
                                            ldb)) &&
              ok(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n),
                                            ldd));
  if (!made) return absl::InternalError("DenseGemm: cublasLt descriptors could not be made");
  cublasLtMatmulHeuristicResult_t results[16];
  int found = 0;
  // The result would be used with beta 0 or 1; beta does not enter the heuristic's query, the key
  // keeps the two apart anyway (an in-place reduction would differ).
  const cublasStatus_t hs = LtHeuristic(*plan, align_a, align_b, align_d, 16, results, &found);
  if (absl::Status s = CublasStatus(hs, "cublasLtMatmulAlgoGetHeuristic"); !s.ok()) return s;
  if (found <= 0) return absl::InternalError(absl::StrCat("DenseGemm: cublasLt offers no algorithm for m=", m, " n=", n,
                                                          " k=", k));
  int pick = 0;
  if (options_.prepared_algo == GemmAlgo::kLtNoSplitK) {
    // The heuristic's order is its estimate of speed: the first one with a single K slice.
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      int32_t splits = 1;
      size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                               sizeof(splits), &written) == CUBLAS_STATUS_SUCCESS &&
          splits <= 1) {
        pick = i;
        break;
      }
    }
  }
  plan->algo = results[pick].algo;
  const LtPlan* out = plan.get();
  lt_plans_.emplace(key, std::move(plan));
  return out;
}

absl::Status DenseGemm::GemmLt(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                               const uint16_t* b, int64_t ldb, float beta, float* d, int64_t ldd, cudaStream_t stream) {
  // The largest power of two up to 256 that divides the address.
  const auto align = [](const void* ptr) {
    const uintptr_t v = reinterpret_cast<uintptr_t>(ptr);
    uint32_t a = 256;
    while (a > 1 && v % a != 0) a /= 2;
    return a;
  };
  absl::StatusOr<const LtPlan*> plan =
      FindLtPlan(LtKey{m, n, k, lda, ldb, ldd, beta == 0.0f, align(a), align(b), align(d)});
  if (!plan.ok()) return plan.status();
  const LtPlan& p = **plan;
  return CublasStatus(cublasLtMatmul(lt_, p.op, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo,
                                     workspace_.get(), static_cast<size_t>(options_.workspace_bytes), stream),
                      "cublasLtMatmul (prepared)");
}

absl::Status DenseGemm::RunPrepared(const Prepared& p, const float* x, int64_t n, float* y, cudaStream_t stream,
                                    GemmMode mode) {
  absl::StatusOr<F16Input> in = ConvertInput(x, n, p.source.cols, mode, stream);
  if (!in.ok()) return in.status();
  return Gemm16(p, p.source.rows, *in, y, p.source.rows, stream);
}

}  // namespace tandem::cuda
