#include "gpu_service/backends/cuda/kernels/sampling_plan.h"

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"

namespace tandem::cuda {

absl::StatusOr<std::unique_ptr<GpuSampler>> GpuSampler::Create(int max_rows, int vocab) {
  if (max_rows <= 0 || vocab <= 0 || static_cast<int64_t>(max_rows) * vocab > 0x7FFFFFFF) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuSampler: max_rows=", max_rows, " vocab=", vocab, " must be positive with a product below 2^31"));
  }
  std::unique_ptr<GpuSampler> s(new GpuSampler(max_rows, vocab));
  size_t temp_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(SampleSortTempBytes(max_rows, vocab, &temp_bytes));
  const size_t cells = static_cast<size_t>(max_rows) * vocab;
  auto take = [](DeviceBuffer* b, size_t bytes) -> absl::Status {
    absl::StatusOr<DeviceBuffer> r = DeviceBuffer::Allocate(bytes);
    if (!r.ok()) return r.status();
    *b = *std::move(r);
    return absl::OkStatus();
  };
  if (absl::Status st = take(&s->temp_, temp_bytes); !st.ok()) return st;
  if (absl::Status st = take(&s->sorted_logits_, cells * sizeof(float)); !st.ok()) return st;
  if (absl::Status st = take(&s->ids_, cells * sizeof(int32_t)); !st.ok()) return st;
  if (absl::Status st = take(&s->sorted_ids_, cells * sizeof(int32_t)); !st.ok()) return st;
  if (absl::Status st = take(&s->offsets_, (max_rows + 1) * sizeof(int32_t)); !st.ok()) return st;
  return s;
}

absl::Status GpuSampler::CheckRows(int rows) const {
  if (rows < 0 || rows > max_rows_) {
    return absl::InvalidArgumentError(absl::StrCat("GpuSampler: rows=", rows, " outside [0, ", max_rows_, "]"));
  }
  return absl::OkStatus();
}

absl::Status GpuSampler::Greedy(const float* logits, int rows, int32_t* tokens, cudaStream_t stream) {
  if (absl::Status s = CheckRows(rows); !s.ok()) return s;
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchArgmax(logits, rows, vocab_, tokens, stream));
  return absl::OkStatus();
}

absl::Status GpuSampler::Sample(const float* logits, int rows, const SamplingRowParams* params,
                                int32_t* tokens, cudaStream_t stream) {
  if (absl::Status s = CheckRows(rows); !s.ok()) return s;
  SampleScratch scratch;
  scratch.temp = temp_.get();
  scratch.temp_bytes = temp_.bytes();
  scratch.sorted_logits = sorted_logits_.as<float>();
  scratch.ids = ids_.as<int32_t>();
  scratch.sorted_ids = sorted_ids_.as<int32_t>();
  scratch.offsets = offsets_.as<int32_t>();
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchSample(logits, rows, vocab_, params, scratch, tokens, stream));
  return absl::OkStatus();
}

}  // namespace tandem::cuda
