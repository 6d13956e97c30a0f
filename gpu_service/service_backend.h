// The service's backend, opened from its command-line settings: the CPU reference backend
// (optionally with host expert workers, spawned or hand-started) or the CUDA backend, and the
// --backend auto choice between them. service_main.cc fills ServiceBackendOptions from its flags;
// errors name the flag to fix.
#ifndef TANDEM_GPU_SERVICE_SERVICE_BACKEND_H_
#define TANDEM_GPU_SERVICE_SERVICE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu_service/backend/backend.h"
#include "gpu_service/backend/remote_experts.h"

namespace tandem {

// One structured log line: an event name and its JSON fields (without braces).
using ServiceLogFn = std::function<void(const std::string& event, const std::string& fields)>;

// The flags that decide the backend (service_main.cc documents each).
struct ServiceBackendOptions {
  std::string backend = "auto";  // --backend: cpu, cuda or auto
  std::string model;             // --model
  std::string gpu_expert_budget = "1.0";
  std::vector<std::string> spawn_workers;    // --worker, in order
  std::vector<std::string> connect_workers;  // --connect-worker, in order
  int64_t max_running = 32;
  int64_t step_token_budget = 256;
  int64_t max_context = 0;
  // CPU backend and host workers.
  int32_t threads = 0;
  int64_t max_state_pages = 0;
  std::string worker_binary;  // empty: DefaultWorkerBinary()
  bool worker_exact = false;
  std::string worker_channel_file;
  absl::Duration worker_call_timeout = absl::Seconds(30);
  // CUDA backend.
  std::string cuda_mode = "fast";
  bool cuda_graphs = true;
  bool cuda_pdl = true;
  int32_t cuda_l2_prefetch = 0;
  bool cuda_dense_copies = true;
  bool cuda_dense_split = false;
  bool cuda_dense_out_single = true;
  int64_t kv_pages = 0;
  ServiceLogFn log;  // required
};

// The backend and, when experts are offloaded, the host workers it uses (which must outlive it:
// destroy the backend first).
struct OpenedBackend {
  std::unique_ptr<HostExpertWorkers> workers;
  std::unique_ptr<Backend> backend;
};

// --backend: cpu, cuda (an error naming the flag when this build or this machine has no CUDA, or
// when host workers are asked for), or auto (cuda when possible, else cpu with the reason logged).
absl::StatusOr<OpenedBackend> OpenServiceBackend(const ServiceBackendOptions& options);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVICE_BACKEND_H_
