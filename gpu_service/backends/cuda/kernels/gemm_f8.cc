// DenseGemm's fp8-corrected split product (DenseGemmOptions::split_f8; the kernels and the scales
// are described in gemm_f8_convert.cuh): the F8 weight copies, the activations' F8 rows and the
// two products (fp8 correction through cublasLt, then hi·hi in f16 added onto it).
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_f8_convert.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"

namespace tandem::cuda {
namespace {

constexpr float kE4m3Max = 448.0f;

// The largest power of two up to 256 that divides the address.
uint32_t Alignment(const void* ptr) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(ptr);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

// s_w for hi values up to hi_max: the largest power of two with s_w · hi_max <= 448 (1 for 0).
float WeightF8Scale(float hi_max) {
  if (!std::isfinite(hi_max) || hi_max <= 0.0f) return 1.0f;
  int e = 0;
  std::frexp(kE4m3Max / hi_max, &e);
  float s = std::ldexp(1.0f, e - 1);
  while (s * hi_max > kE4m3Max) s *= 0.5f;
  return s;
}

}  // namespace

void DenseGemm::SetF8Offsets(Prepared& p, int64_t total_rows) {
  p.f8 = true;
  p.copies = 1;
  p.f8_offset = (total_rows + 16) * p.source.cols * 2;
  p.scale_offset = (total_rows + 16) * p.source.cols * 4;
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> DenseGemm::MakeF8Copy(std::span<const DeviceMatrix* const> parts,
                                                                    int64_t total_rows, int e, float max_abs,
                                                                    cudaStream_t stream) {
  const int64_t cols = parts[0]->cols;
  // e4m3 GEMMs need K (2 · cols) and the leading dimensions in multiples of 16 bytes.
  if (cols % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DenseGemm: an F8 copy needs cols % 8 == 0, got ", cols));
  }
  int64_t max_rows = 0;
  for (const DeviceMatrix* w : parts) max_rows = std::max(max_rows, w->rows);
  absl::StatusOr<DeviceBuffer> data = DeviceBuffer::Allocate(static_cast<size_t>(F8CopyBytes(total_rows, cols)));
  if (!data.ok()) return data.status();
  auto buffer = std::make_shared<DeviceBuffer>(*std::move(data));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer->get(), 0, buffer->bytes(), stream));  // padding rows
  // The [hi | lo] rows of one part at a time (load time: a temporary buffer).
  absl::StatusOr<DeviceBuffer> tmp = DeviceBuffer::Allocate(static_cast<size_t>(max_rows * cols * 4));
  if (!tmp.ok()) return tmp.status();
  // hi = f16(2^e · w) rounds max |w| up by at most 2^-11 relative.
  const float s_w = WeightF8Scale(std::ldexp(max_abs, e) * (1.0f + 0x1p-10f));
  uint16_t* hi = buffer->as<uint16_t>();
  uint8_t* f8 = buffer->as<uint8_t>() + (total_rows + 16) * cols * 2;
  int64_t offset = 0;
  for (const DeviceMatrix* w : parts) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDequantizeToF16Layout(*w, 2, std::ldexp(1.0f, e), tmp->as<uint16_t>(), stream));
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchSplitWeightsToF8(tmp->as<uint16_t>(), w->rows, cols, s_w, hi + offset * cols, f8 + offset * 2 * cols,
                               stream));
    offset += w->rows;
  }
  // The A scale: undoes s_w and the copy's 2^e (both powers of two: exact).
  const float a_scale = std::ldexp(1.0f, -e) / s_w;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer->as<uint8_t>() + (total_rows + 16) * cols * 4, &a_scale, sizeof(a_scale),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return buffer;
}

absl::Status DenseGemm::EnsureF8Rows(const uint16_t* data, int64_t n, int64_t cols, cudaStream_t stream) {
  if (f8_rows_.data == data && f8_rows_.n == n && f8_rows_.cols == cols) return absl::OkStatus();
  uint16_t* x16 = x_f16_.as<uint16_t>();
  if (data != x16) {
    return absl::FailedPreconditionError("DenseGemm: an F8 product reads split rows in input_scratch() only");
  }
  if (cols % 8 != 0) return absl::InvalidArgumentError(absl::StrCat("DenseGemm: F8 rows need cols % 8 == 0, got ", cols));
  unsigned int* amax = f8_state_.as<unsigned int>();  // 0 between calls (the conversion resets it)
  float* b_scale = reinterpret_cast<float*>(f8_state_.as<uint8_t>() + 16);
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchF8AmaxSplitRows(x16, n, cols, amax, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchSplitRowsToF8(x16, n, cols, amax, amax + 1, x8_.as<uint8_t>(), b_scale, stream));
  f8_rows_ = {x16, n, cols};
  return absl::OkStatus();
}

absl::Status DenseGemm::GemmF8(const Prepared& p, int64_t rows, const F16Input& in, float* y, int64_t ldy,
                               cudaStream_t stream) {
  const int64_t cols = p.source.cols, n = in.n;
  if (n == 0) return absl::OkStatus();
  if (absl::Status s = EnsureF8Rows(in.data, n, cols, stream); !s.ok()) return s;
  // The correction [x_lo8 | x_hi8]·[w_hi8 | w_lo8]ᵀ (K = 2 · cols) writes y; the activations' fp8
  // rows are x8_'s (row stride 2 · cols bytes). One term (options_.f8_terms) reads one half of
  // both rows (K = cols, the same strides): x_lo8·w_hi8 from the first halves, x_hi8·w_lo8 from
  // the second.
  const uint8_t* a = p.weights8();
  const uint8_t* b = x8_.as<uint8_t>();
  // (cols % 16 != 0: both terms, K = 2 · cols, which e4m3 products take for any cols % 8 == 0.)
  int64_t k = 2 * cols;
  if (options_.f8_terms != F8Terms::kBoth && cols % 16 == 0) {
    k = cols;
    if (options_.f8_terms == F8Terms::kWeightLo) {
      a += cols;
      b += cols;
    }
  }
  // The documented tensor-core rule (16-byte multiples of m and ldd, 16-byte aligned D) first.
  const bool direct_shape = rows % 4 == 0 && ldy % 4 == 0 && Alignment(y) >= 16;
  absl::StatusOr<const LtPlan*> plan = direct_shape ? FindF8Plan(LtKey{rows, n, k, 2 * cols, 2 * cols, ldy, true,
                                                                       Alignment(a), Alignment(b), Alignment(y)})
                                                    : absl::StatusOr<const LtPlan*>(nullptr);
  if (!plan.ok()) return plan.status();
  const LtPlan* lp = *plan;
  // cublasLt's fp8 kernels want 16-byte multiples for m and ldd too (4 f32 outputs); a shape it
  // refuses (a 1-row part of a stack, an odd output stride, an unaligned y) writes rows padded to
  // 16 into the tile scratch instead (the weights' fp8 rows are followed by zero rows for that),
  // copied into y before the f16 product adds onto it.
  float* d = y;
  int64_t m = rows, ldd = ldy;
  if (lp == nullptr) {
    m = ldd = (rows + 15) / 16 * 16;
    d = tile_.as<float>();
    if (m * n * static_cast<int64_t>(sizeof(float)) > options_.tile_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("DenseGemm: the fp8 product of ", rows, " rows x ", n,
                                                     " tokens needs a padded output beyond the tile"));
    }
    plan = FindF8Plan(LtKey{m, n, k, 2 * cols, 2 * cols, ldd, true, Alignment(a), Alignment(b), Alignment(d)});
    if (!plan.ok()) return plan.status();
    lp = *plan;
    if (lp == nullptr) {
      return absl::InternalError(absl::StrCat("DenseGemm: cublasLt has no fp8 algorithm for m=", m, " n=", n,
                                              " k=", k));
    }
  }
  const float* a_scale = p.a_scale();  // set per call: the plan is shared by matrices of one shape
  if (absl::Status s = CublasStatus(cublasLtMatmulDescSetAttribute(lp->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                                   &a_scale, sizeof(a_scale)),
                                    "cublasLtMatmulDescSetAttribute (A scale)");
      !s.ok()) {
    return s;
  }
  const float one = 1.0f, zero = 0.0f;
  if (absl::Status s = CublasStatus(cublasLtMatmul(lt_, lp->op, &one, a, lp->a, b, lp->b, &zero, d, lp->d, d, lp->d,
                                                   &lp->algo, workspace_.get(),
                                                   static_cast<size_t>(options_.workspace_bytes), stream),
                                    "cublasLtMatmul (fp8 correction)");
      !s.ok()) {
    return s;
  }
  if (d != y) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(y, static_cast<size_t>(ldy) * sizeof(float), d,
                                                  static_cast<size_t>(ldd) * sizeof(float),
                                                  static_cast<size_t>(rows) * sizeof(float), static_cast<size_t>(n),
                                                  cudaMemcpyDeviceToDevice, stream));
  }
  // hi·hi (K = cols; the activations' hi third, gemm.cuh's kSplitHiThird) added onto it.
  const uint16_t* w16 = p.weights();
  const uint16_t* x_hi = in.data + kSplitHiThird * cols;
  if (options_.prepared_algo != GemmAlgo::kGemmEx) {
    return GemmLt(rows, n, cols, p.alpha, w16, cols, x_hi, 3 * cols, 1.0f, y, ldy, stream);
  }
  return CublasStatus(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                                   static_cast<int>(cols), &p.alpha, w16, CUDA_R_16F, static_cast<int>(cols), x_hi,
                                   CUDA_R_16F, static_cast<int>(3 * cols), &one, y, CUDA_R_32F, static_cast<int>(ldy),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx (F8 hi·hi)");
}

absl::StatusOr<const DenseGemm::LtPlan*> DenseGemm::FindF8Plan(const LtKey& key) {
  // A shape cublasLt refuses is kept as a null plan (the caller pads it), not asked again.
  if (auto it = f8_plans_.find(key); it != f8_plans_.end()) return it->second.get();
  if (lt_ == nullptr) return absl::FailedPreconditionError("DenseGemm: no cublasLt handle for the fp8 product");
  const auto [m, n, k, lda, ldb, ldd, beta_zero, align_a, align_b, align_d] = key;
  if (f8_plans_.size() >= 4096) f8_plans_.clear();  // as FindLtPlan: old step sizes go
  auto plan = std::make_unique<LtPlan>();
  // fp8 takes only the TN form, which y^T = W·x^T already is (A = W: k × m transposed, B = x^T).
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const float* b_scale = reinterpret_cast<const float*>(f8_state_.as<uint8_t>() + 16);
  const auto ok = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
  bool made = ok(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
              ok(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) &&
              ok(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) &&
              ok(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale,
                                                sizeof(b_scale))) &&  // replaced per call
              ok(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                sizeof(b_scale))) &&
              ok(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, static_cast<uint64_t>(k),
                                            static_cast<uint64_t>(m), lda)) &&
              ok(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, static_cast<uint64_t>(k),
                                            static_cast<uint64_t>(n), ldb)) &&
              ok(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n),
                                            ldd));
  if (!made) return absl::InternalError("DenseGemm: cublasLt fp8 descriptors could not be made");
  cublasLtMatmulHeuristicResult_t results[8];
  int found = 0;
  const cublasStatus_t hs = LtHeuristic(*plan, align_a, align_b, align_d, 8, results, &found);
  if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found <= 0)) {
    f8_plans_.emplace(key, nullptr);
    return nullptr;
  }
  if (absl::Status s = CublasStatus(hs, "cublasLtMatmulAlgoGetHeuristic (fp8)"); !s.ok()) return s;
  plan->algo = results[0].algo;
  const LtPlan* out = plan.get();
  f8_plans_.emplace(key, std::move(plan));
  return out;
}

}  // namespace tandem::cuda
