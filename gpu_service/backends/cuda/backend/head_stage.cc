// The head of a step on the GPU (the last read's norm, the output matrix over the rows whose logits
// are wanted) and the logits' way to the caller: which rows go through the head (PlanHead), where
// the one-row Q6_K head kernel writes (HeadDestination: a page-locked caller's row itself), the
// device-to-host copies (EnqueueLogitsCopy) and the host copy for pageable callers (CopyLogitsOut).
#include <algorithm>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"

namespace tandem {

using cuda::Stage;

using backend_internal::Launch;

absl::Status CudaBackend::Impl::EnqueueHead(const StepPlan& plan, std::span<const Backend::StepInput> inputs) {
  const int64_t h = c->h;
  cudaStream_t st = stream.get();
  timer->Mark(Stage::kHead, st);
  // Only the rows whose logits are wanted go through the output matrix (PlanHead chose them).
  if (head_rows == 0) return absl::OkStatus();
  const cuda::PendingShared shared_term = inject_pending ? TakePendingShared() : cuda::PendingShared{};
  if (absl::Status s = Read(dm->output_read, plan.tokens, x, nullptr, inject_pending ? PendingY() : nullptr,
                            cuda::GemmMode::kExact, nullptr, &shared_term);
      !s.ok()) {
    return s;
  }
  inject_pending = false;
  // The head's rows gathered into xh, unless they are x's own rows in order (a decode step whose
  // every sequence wants its logits): then the head reads x and no copy stands between the norm
  // and the head in the PDL chain. TANDEM_OLD_HEAD_COPY=1: always gathered.
  static const bool old_head_copy = cuda::EnvSwitch("TANDEM_OLD_HEAD_COPY");
  // Input i's head rows: x's rows [first_row(i), first_row(i) + its rows) go to head row head_first[i].
  auto first_row = [&](size_t i) { return plan.offsets[i] + (inputs[i].all_positions ? 0 : plan.counts[i] - 1); };
  bool in_place = !old_head_copy;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (head_first[i] >= 0) in_place = in_place && first_row(i) == head_first[i];
  }
  const float* head_in = x;
  if (!in_place) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (head_first[i] < 0) continue;
      const int64_t rows = inputs[i].all_positions ? plan.counts[i] : 1;
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(xh + head_first[i] * h, x + first_row(i) * h,
                                                  static_cast<size_t>(rows * h) * sizeof(float),
                                                  cudaMemcpyDeviceToDevice, st));
    }
    head_in = xh;
  }
  if (head_y_at) {  // PlanHead: one row through the Q6_K head kernel, into *head_dest()
    cuda::MatVecOptions o;
    o.kernel = cuda::MatVecKernel::kQ6Head;
    o.y_at = head_dest();
    o.int16_x = options.mode == CudaMode::kFast && cuda::HeadInt16();
    if (absl::Status s = Launch(cuda::LaunchDenseMatVec(dm->output, head_in, h, 1, logits, c->vocab, o, st), "head");
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = Product(dm->output, head_in, head_rows, logits); !s.ok()) {
    return s;
  }
  timer->Mark(Stage::kIo, st);
  return absl::OkStatus();
}

namespace {

// A caller's logits in page-locked memory get the head's rows straight from the device, as
// llama.cpp's pinned output buffer does; pageable ones through host_logits and CopyLogitsOut (one
// host copy more: ~60 us a step for one 152k-entry row on the H200's host, where one thread reads
// ~10 GB/s). TANDEM_OLD_LOGITS_COPY=1 stages every row (an A/B switch).
bool OldLogitsCopy() {
  static const bool old = cuda::EnvSwitch("TANDEM_OLD_LOGITS_COPY");
  return old;
}

}  // namespace

float* CudaBackend::Impl::HeadDestination(std::span<const Backend::StepInput> inputs) {
  head_wrote_host = false;
  if (!head_y_at || OldLogitsCopy()) return logits;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (head_first[i] != 0) continue;
    void* mapped = nullptr;
    if (backend_internal::PinnedHost(inputs[i].logits, static_cast<size_t>(c->vocab) * sizeof(float)) &&
        cudaHostGetDevicePointer(&mapped, inputs[i].logits, 0) == cudaSuccess) {
      head_wrote_host = true;
      return static_cast<float*>(mapped);
    }
    (void)cudaGetLastError();  // a failed query is "no": the copy after the head
  }
  return logits;
}

absl::Status CudaBackend::Impl::EnqueueLogitsCopy(const StepPlan& plan, std::span<const Backend::StepInput> inputs) {
  const int64_t V = c->vocab;
  cudaStream_t st = stream.get();
  logits_direct.assign(inputs.size(), false);
  const bool old = OldLogitsCopy();
  // Adjacent rows whose destinations are adjacent too go in one copy.
  const float* run_src = nullptr;
  float* run_dst = nullptr;
  int64_t run_len = 0;
  auto flush = [&]() -> absl::Status {
    if (run_len > 0) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(run_dst, run_src, static_cast<size_t>(run_len) * sizeof(float),
                                                  cudaMemcpyDeviceToHost, st));
    }
    run_len = 0;
    return absl::OkStatus();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (head_first[i] < 0) continue;
    if (head_wrote_host) {  // the head kernel wrote the one row there itself (Step)
      logits_direct[i] = true;
      continue;
    }
    const int64_t len = (inputs[i].all_positions ? plan.counts[i] : 1) * V;
    const bool direct = !old && backend_internal::PinnedHost(inputs[i].logits, static_cast<size_t>(len) * sizeof(float));
    logits_direct[i] = direct;
    const float* src = logits + head_first[i] * V;
    float* dst = direct ? inputs[i].logits : host_logits.as<float>() + head_first[i] * V;
    if (run_len > 0 && run_src + run_len == src && run_dst + run_len == dst) {
      run_len += len;
      continue;
    }
    if (absl::Status s = flush(); !s.ok()) return s;
    run_src = src;
    run_dst = dst;
    run_len = len;
  }
  return flush();
}

void CudaBackend::Impl::PlanHead(const StepPlan& plan, std::span<const Backend::StepInput> inputs) {
  head_first.assign(inputs.size(), -1);
  head_rows = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].logits == nullptr) continue;
    head_first[i] = head_rows;
    head_rows += inputs[i].all_positions ? plan.counts[i] : 1;
  }
  static const bool old_dest = cuda::EnvSwitch("TANDEM_OLD_HEAD_DEST");
  head_y_at = !old_dest && head_rows == 1 && cuda::DenseMatVecQ6HeadTakes(dm->output, 1);
}

void CudaBackend::Impl::CopyLogitsOut(const StepPlan& plan, std::span<const Backend::StepInput> inputs) const {
  const int64_t V = c->vocab;
  for (size_t i = 0; i < inputs.size() && i < head_first.size(); ++i) {
    if (head_first[i] < 0 || (i < logits_direct.size() && logits_direct[i])) continue;
    const int64_t n = plan.counts[i];
    const int64_t rows = inputs[i].all_positions ? n : 1;
    std::copy(host_logits.as<float>() + head_first[i] * V, host_logits.as<float>() + (head_first[i] + rows) * V,
              inputs[i].logits);
  }
}

}  // namespace tandem
