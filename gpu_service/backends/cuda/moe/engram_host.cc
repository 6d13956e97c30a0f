#include "gpu_service/backends/cuda/moe/engram_host.h"

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/engram.cuh"

namespace tandem::cuda {
namespace {

absl::Status Alloc(DeviceBuffer& b, int64_t floats) {
  absl::StatusOr<DeviceBuffer> d = DeviceBuffer::Allocate(static_cast<size_t>(floats) * sizeof(float));
  if (!d.ok()) return d.status();
  b = *std::move(d);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GpuEngramLayer> GpuEngramLayer::Create(const EngramConfig& config, int64_t S, int64_t h, int64_t max_n) {
  if (absl::Status s = CheckEngramConfig(config); !s.ok()) return s;
  if (S < 1 || h < 1 || max_n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GpuEngramLayer: S=", S, " h=", h, " max_n=", max_n));
  }
  GpuEngramLayer g;
  g.config_ = config;
  g.S_ = S;
  g.h_ = h;
  g.max_n_ = max_n;
  const int64_t width = S * h;
  absl::StatusOr<PinnedBuffer> p = PinnedBuffer::Allocate(static_cast<size_t>(max_n * config.pin()) * sizeof(float));
  if (!p.ok()) return p.status();
  g.e_staging_ = *std::move(p);
  if (absl::Status s = Alloc(g.e_, max_n * config.pin()); !s.ok()) return s;
  if (absl::Status s = Alloc(g.kv_, max_n * width); !s.ok()) return s;
  if (absl::Status s = Alloc(g.v_, max_n * h); !s.ok()) return s;
  if (absl::Status s = Alloc(g.u_, max_n * width); !s.ok()) return s;
  if (absl::Status s = Alloc(g.window_, (config.conv_history() + max_n) * width); !s.ok()) return s;
  absl::StatusOr<Event> e = Event::Create(/*timing=*/false);
  if (!e.ok()) return e.status();
  g.staged_ = *std::move(e);
  return g;
}

absl::Status GpuEngramLayer::Stage(const MatrixView& embd, std::span<const int64_t> rows, int64_t n,
                                   cudaStream_t stream) {
  const int64_t rpt = config_.rows_per_token();
  if (n < 1 || n > max_n_ || static_cast<int64_t>(rows.size()) != n * rpt) {
    return absl::InvalidArgumentError(absl::StrCat("GpuEngramLayer::Stage: n=", n, " (capacity ", max_n_, "), ",
                                                   rows.size(), " rows for ", rpt, " per position"));
  }
  if (embd.cols != config_.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("engram_embd has ", embd.cols, " columns, head_dim is ", config_.head_dim));
  }
  if (pending_) TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_.get()));
  float* e = e_staging_.as<float>();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= embd.rows) {
      return absl::InvalidArgumentError(absl::StrCat("engram row ", rows[i], " (entry ", i, ") outside [0, ", embd.rows, ")"));
    }
    DequantizeMatrixRow(embd, rows[i], e + static_cast<int64_t>(i) * config_.head_dim);
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(e_.get(), e, static_cast<size_t>(n * config_.pin()) * sizeof(float),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(staged_.get(), stream));
  pending_ = true;
  staged_n_ = n;
  return absl::OkStatus();
}

absl::Status GpuEngramLayer::Forward(const EngramDeviceWeights& w, float* H, int64_t n, float eps, float* conv_state,
                                     cudaStream_t stream) {
  if (n != staged_n_) {
    return absl::FailedPreconditionError(absl::StrCat("GpuEngramLayer::Forward: ", n, " positions, ", staged_n_, " staged"));
  }
  const int64_t width = S_ * h_;
  const int64_t pin = config_.pin();
  if (w.key.cols != pin || w.key.rows != width) {
    return absl::InvalidArgumentError(absl::StrCat("engram_key is {", w.key.cols, ", ", w.key.rows, "}, expected {", pin, ", ", width, "}"));
  }
  if (w.value.cols != pin || w.value.rows != h_) {
    return absl::InvalidArgumentError(absl::StrCat("engram_value is {", w.value.cols, ", ", w.value.rows, "}, expected {", pin, ", ", h_, "}"));
  }
  if (absl::Status s = DenseMatVec("engram_key", w.key, e_.as<float>(), n, kv_.as<float>(), stream); !s.ok()) return s;
  if (absl::Status s = DenseMatVec("engram_value", w.value, e_.as<float>(), n, v_.as<float>(), stream); !s.ok()) return s;
  const int64_t hist = config_.conv_history();
  float* window = window_.as<float>();
  const size_t hist_bytes = static_cast<size_t>(hist * width) * sizeof(float);
  if (hist > 0) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(window, conv_state, hist_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchEngramGate(kv_.as<float>(), v_.as<float>(), H, w.key_norm, w.query_norm, w.conv_norm,
                                               static_cast<int>(n), static_cast<int>(S_), static_cast<int>(h_), eps,
                                               u_.as<float>(), window + hist * width, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchEngramConvInject(window, w.conv, u_.as<float>(), static_cast<int>(n),
                                                     static_cast<int>(width), static_cast<int>(config_.conv_kernel),
                                                     static_cast<int>(config_.dilation), H, stream));
  if (hist > 0) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(conv_state, window + n * width, hist_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  return absl::OkStatus();
}

}  // namespace tandem::cuda
