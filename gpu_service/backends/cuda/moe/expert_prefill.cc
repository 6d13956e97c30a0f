#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <cublas_v2.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"

namespace tandem::cuda {
namespace {

absl::Status BlasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error in ", what, ": ", cublasGetStatusName(s), ": ",
                                          cublasGetStatusString(s)));
}

absl::Status Alloc(DeviceBuffer& b, size_t bytes) {
  absl::StatusOr<DeviceBuffer> d = DeviceBuffer::Allocate(bytes);
  if (!d.ok()) return d.status();
  b = *std::move(d);
  return absl::OkStatus();
}

}  // namespace

struct ExpertPrefillRunner::Blas {
  cublasHandle_t handle = nullptr;
  ~Blas() {
    if (handle != nullptr) cublasDestroy(handle);
  }
};

ExpertPrefillRunner::ExpertPrefillRunner(ExpertPrefillRunner&&) noexcept = default;
ExpertPrefillRunner& ExpertPrefillRunner::operator=(ExpertPrefillRunner&&) noexcept = default;
ExpertPrefillRunner::~ExpertPrefillRunner() = default;

std::vector<PrefillGroup> GroupUnits(std::span<const ExpertUnit> units) {
  std::vector<PrefillGroup> groups;
  for (const ExpertUnit& u : units) {
    if (!groups.empty()) {
      PrefillGroup& g = groups.back();
      if (g.where.gate == u.gate && g.where.up == u.up && g.where.down == u.down && g.first_slot + g.rows == u.first_slot) {
        g.rows += u.rows;
        continue;
      }
    }
    groups.push_back(PrefillGroup{ExpertLocation{u.gate, u.up, u.down}, u.first_slot, u.rows});
  }
  return groups;
}

absl::StatusOr<ExpertPrefillRunner> ExpertPrefillRunner::Create(const ExpertDecodeRunner::Shape& shape,
                                                                int64_t max_slots) {
  if (max_slots < 1 || shape.h < 1 || shape.inner < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: h=", shape.h, " I=", shape.inner,
                                                   " max_slots=", max_slots));
  }
  ExpertPrefillRunner r;
  r.shape_ = shape;
  r.max_slots_ = max_slots;
  r.blas_ = std::make_unique<Blas>();
  if (absl::Status s = BlasStatus(cublasCreate(&r.blas_->handle), "cublasCreate"); !s.ok()) return s;
  const size_t h = static_cast<size_t>(shape.h), I = static_cast<size_t>(shape.inner), m = static_cast<size_t>(max_slots);
  if (absl::Status s = Alloc(r.w_gate_up_, 2 * I * h * 2); !s.ok()) return s;
  if (absl::Status s = Alloc(r.w_down_, h * I * 2); !s.ok()) return s;
  if (absl::Status s = Alloc(r.x_rows_, m * h * 2); !s.ok()) return s;
  if (absl::Status s = Alloc(r.gu_, m * 2 * I * 4); !s.ok()) return s;
  if (absl::Status s = Alloc(r.act_, m * I * 2); !s.ok()) return s;
  if (absl::Status s = Alloc(r.index_, m * 4); !s.ok()) return s;
  absl::StatusOr<PinnedBuffer> p = PinnedBuffer::Allocate(m * 4);
  if (!p.ok()) return p.status();
  r.index_staging_ = *std::move(p);
  absl::StatusOr<Event> e = Event::Create(/*timing=*/false);
  if (!e.ok()) return e.status();
  r.staged_ = *std::move(e);
  return r;
}

absl::Status ExpertPrefillRunner::Run(std::span<const ExpertUnit> units, const float* x, float* partial,
                                      cudaStream_t stream) {
  if (units.empty()) return absl::OkStatus();
  const int h = static_cast<int>(shape_.h), I = static_cast<int>(shape_.inner);
  const uint32_t gu_type = static_cast<uint32_t>(shape_.gate_up_type);
  const uint32_t d_type = static_cast<uint32_t>(shape_.down_type);
  // Input row of every slot.
  int32_t slots = 0;
  for (const ExpertUnit& u : units) slots = std::max(slots, u.first_slot + u.rows);
  if (slots > max_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("ExpertPrefillRunner: slots up to ", slots, ", capacity ", max_slots_));
  }
  if (pending_) TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_.get()));
  int32_t* index = index_staging_.as<int32_t>();
  std::memset(index, 0, static_cast<size_t>(slots) * sizeof(int32_t));
  for (size_t i = 0; i < units.size(); ++i) {
    const ExpertUnit& u = units[i];
    if (u.rows < 1 || u.rows > kMaxUnitRows || u.first_slot < 0) {
      return absl::InvalidArgumentError(absl::StrCat("expert unit ", i, ": rows=", u.rows, " first_slot=", u.first_slot));
    }
    for (int r = 0; r < u.rows; ++r) index[u.first_slot + r] = u.input_row[r];
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(index_.get(), index, static_cast<size_t>(slots) * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_.get(), stream));
  pending_ = true;
  if (absl::Status s = BlasStatus(cublasSetStream(blas_->handle, stream), "cublasSetStream"); !s.ok()) return s;

  uint16_t* wgu = w_gate_up_.as<uint16_t>();
  uint16_t* wd = w_down_.as<uint16_t>();
  const float one = 1.0f, zero = 0.0f;
  for (const PrefillGroup& g : GroupUnits(units)) {
    const int m = g.rows;
    const cudaError_t e1 = LaunchDequantizeToBf16(gu_type, g.where.gate, h, I, wgu, stream);
    const cudaError_t e2 = LaunchDequantizeToBf16(gu_type, g.where.up, h, I, wgu + static_cast<size_t>(I) * h, stream);
    const cudaError_t e3 = LaunchDequantizeToBf16(d_type, g.where.down, I, h, wd, stream);
    for (cudaError_t e : {e1, e2, e3}) {
      if (e == cudaErrorInvalidValue) {
        return absl::InvalidArgumentError(absl::StrCat("prefill expert at slot ", g.first_slot,
                                                       ": type, shape or alignment refused by the bf16 dequantizer"));
      }
      TANDEM_CUDA_RETURN_IF_ERROR(e);
    }
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchGatherRowsBf16(x, h, index_.as<int32_t>() + g.first_slot, m, x_rows_.as<uint16_t>(), stream));
    // Row-major gu (m × 2I) = X (m × h)·Wgu^T is column-major gu^T (2I × m) = op_T(Wgu as h × 2I)·X^T.
    if (absl::Status s = BlasStatus(
            cublasGemmEx(blas_->handle, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, m, h, &one, wgu, CUDA_R_16BF, h,
                         x_rows_.get(), CUDA_R_16BF, h, &zero, gu_.get(), CUDA_R_32F, 2 * I, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "gate/up GEMM");
        !s.ok()) {
      return s;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchSiluMulToBf16(gu_.as<float>(), m, I, act_.as<uint16_t>(), stream));
    if (absl::Status s = BlasStatus(
            cublasGemmEx(blas_->handle, CUBLAS_OP_T, CUBLAS_OP_N, h, m, I, &one, wd, CUDA_R_16BF, I, act_.get(),
                         CUDA_R_16BF, I, &zero, partial + static_cast<int64_t>(g.first_slot) * h, CUDA_R_32F, h,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "down GEMM");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
