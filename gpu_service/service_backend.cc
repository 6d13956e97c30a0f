// OpenServiceBackend (service_backend.h): the CPU or CUDA backend from the service's settings.
#include "gpu_service/service_backend.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_service/backend/cpu_backend.h"
#include "gpu_service/backend/expert_placement.h"
#include "gpu_service/backend/remote_experts_spec.h"

#if TANDEM_WITH_CUDA_BACKEND
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#endif

namespace tandem {
namespace {

// The default --worker-binary: next to this executable, else the build tree's layout
// (build/gpu_service/tandem-gpu-service, build/host_expert_worker/tandem-host-worker).
std::string DefaultWorkerBinary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "tandem-host-worker";
  const std::filesystem::path beside = self.parent_path() / "tandem-host-worker";
  if (std::filesystem::exists(beside)) return beside.string();
  const std::filesystem::path build_tree =
      self.parent_path().parent_path() / "host_expert_worker" / "tandem-host-worker";
  if (std::filesystem::exists(build_tree)) return build_tree.string();
  return beside.string();
}

absl::StatusOr<std::vector<RemoteWorkerSpec>> WorkerSpecs(const ServiceBackendOptions& o) {
  std::vector<RemoteWorkerSpec> specs;
  for (const std::string& text : o.spawn_workers) {
    absl::StatusOr<RemoteWorkerSpec> spec = ParseRemoteWorkerSpec(text, true, "--worker");
    if (!spec.ok()) return spec.status();
    specs.push_back(*spec);
  }
  for (const std::string& text : o.connect_workers) {
    absl::StatusOr<RemoteWorkerSpec> spec =
        ParseRemoteWorkerSpec(text, false, "--connect-worker");
    if (!spec.ok()) return spec.status();
    specs.push_back(*spec);
  }
  if (specs.empty()) return specs;
  return OrderWorkerShares(std::move(specs));
}

absl::Status WriteWorkerChannelFile(const std::string& path,
                                    const std::vector<HostExpertWorkers::WorkerStatus>& workers) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    for (const HostExpertWorkers::WorkerStatus& w : workers) {
      if (!w.spawned) out << "share=" << w.share << " channel=" << w.channel << "\n";
    }
    if (!out) return absl::UnavailableError(absl::StrCat("--worker-channel-file: cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("--worker-channel-file: ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Text for a JSON string value (quotes and backslashes escaped, control characters dropped).
std::string JsonText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) out.push_back(c);
  }
  return out;
}

void LogBackendChoice(const ServiceLogFn& log, const std::string& chosen, const std::string& reason) {
  log("backend_choice",
      absl::StrCat("\"backend\":\"", chosen, "\",\"reason\":\"", JsonText(reason), "\""));
}

#if TANDEM_WITH_CUDA_BACKEND
// CudaBackend over --model: every routed expert resident (the budget must cover them all), one
// sequence per running request (--max-running), --step-token-budget tokens per step, and state
// for the service's context limit (--max-context, capped by the model's).
absl::StatusOr<std::unique_ptr<Backend>> OpenCudaBackend(const ServiceBackendOptions& o, const ExpertBudget& budget) {
  CudaBackendOptions options;
  const std::string mode = o.cuda_mode;
  if (mode == "exact") {
    options.mode = CudaMode::kExact;
  } else if (mode == "fast") {
    options.mode = CudaMode::kFast;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-mode: '", mode, "' is not exact or fast"));
  }
  ReferenceModelOptions model_options;
  model_options.threads = 1;  // CudaBackend uses the file, config, weights and tokenizer only
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model =
      ReferenceModel::Open(o.model, model_options);
  if (!model.ok()) return model.status();
  const StaticExpertPlacement placement = StaticExpertPlacement::FromBudget(
      (*model)->weights(), (*model)->config().moe.E, budget);
  if (!placement.all_local()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-expert-budget: the budget keeps ", placement.local_count(), " of ",
        placement.local_count() + placement.remote_count(),
        " routed experts, but --backend cuda keeps every routed expert on the GPU (host-worker "
        "experts are not supported by the CUDA backend yet); use --gpu-expert-budget=1.0 or "
        "--backend cpu"));
  }
  const int64_t model_limit = (*model)->config().context_length;
  int64_t max_context = o.max_context;
  if (max_context <= 0) max_context = model_limit;
  if (model_limit > 0) max_context = std::min(max_context, model_limit);
  if (max_context <= 0) {
    return absl::InvalidArgumentError("--max-context: the model has no context length; set it");
  }
  options.max_sequences = o.max_running;
  options.max_batch_tokens = o.step_token_budget;
  options.max_context = max_context;
  options.cuda_graphs = o.cuda_graphs;
  options.fast_dense_split = o.cuda_dense_split;
  options.fast_dense_out_single = o.cuda_dense_out_single;
  options.pdl = o.cuda_pdl;
  options.prepare_dense_weights = o.cuda_dense_copies;
  options.l2_prefetch = o.cuda_l2_prefetch;
  if (options.l2_prefetch < 0 || options.l2_prefetch > 2) {
    return absl::InvalidArgumentError("--cuda-l2-prefetch: must be 0, 1 or 2");
  }
  options.kv_pages = o.kv_pages;
  if (options.kv_pages < 0) return absl::InvalidArgumentError("--kv-pages: must be >= 0");
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
      CudaBackend::Create(*std::move(model), options);
  if (!backend.ok()) return backend.status();
  o.log("cuda_backend", absl::StrCat("\"mode\":\"", mode,
                                   "\",\"max_sequences\":", options.max_sequences,
                                   ",\"max_batch_tokens\":", options.max_batch_tokens,
                                   ",\"max_context\":", options.max_context,
                                   ",\"cuda_graphs\":", options.cuda_graphs ? "true" : "false",
                                   ",\"pdl\":", options.pdl ? "true" : "false",
                                   ",\"l2_prefetch\":", options.l2_prefetch,
                                   ",\"weight_bytes\":", (*backend)->weight_bytes(),
                                   ",\"state_bytes\":", (*backend)->state_bytes()));
  return std::unique_ptr<Backend>(*std::move(backend));
}
#endif  // TANDEM_WITH_CUDA_BACKEND

// The CPU backend, with host expert workers when `specs` names any.
absl::StatusOr<OpenedBackend> OpenCpuBackend(const ServiceBackendOptions& o, const ExpertBudget& budget,
                                             const std::vector<RemoteWorkerSpec>& specs) {
  CpuBackendOptions options;
  options.model.threads = o.threads;
  options.model.max_state_pages = o.max_state_pages;
  options.expert_budget = budget;
  const std::string model_path = o.model;
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model =
      ReferenceModel::Open(model_path, options.model);
  if (!model.ok()) return model.status();

  OpenedBackend opened;
  if (!specs.empty()) {
    HostExpertWorkersOptions w;
    w.workers = specs;
    w.worker_binary = o.worker_binary.empty() ? DefaultWorkerBinary()
                                                                 : o.worker_binary;
    w.model_path = std::filesystem::absolute(model_path).string();
    w.exact = o.worker_exact;
    w.call_timeout = o.worker_call_timeout;
    w.max_rows_per_request = static_cast<uint32_t>(
        std::clamp<int64_t>(o.step_token_budget, 1, 1024));
    w.log = o.log;
    absl::StatusOr<std::unique_ptr<HostExpertWorkers>> workers = HostExpertWorkers::Start(
        (*model)->file(), (*model)->config(),
        static_cast<uint32_t>((*model)->weights().layers.size()), std::move(w));
    if (!workers.ok()) return workers.status();
    opened.workers = *std::move(workers);
    options.remote = opened.workers.get();
    for (const HostExpertWorkers::WorkerStatus& ws : opened.workers->worker_status()) {
      o.log("worker_channel", absl::StrCat("\"share\":\"", ws.share, "\",\"channel\":\"", ws.channel,
                                         "\",\"spawned\":", ws.spawned ? "true" : "false"));
    }
    if (!o.worker_channel_file.empty()) {
      if (absl::Status s = WriteWorkerChannelFile(o.worker_channel_file,
                                                  opened.workers->worker_status());
          !s.ok()) {
        return s;
      }
    }
  }
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
      CpuBackend::Create(*std::move(model), options);
  if (!backend.ok()) return backend.status();
  if (opened.workers != nullptr) {
    const StaticExpertPlacement& p = (*backend)->expert_placement();
    o.log("expert_placement",
        absl::StrCat("\"local_experts\":", p.local_count(), ",\"worker_experts\":",
                     p.remote_count(), ",\"local_bytes\":", p.local_bytes(),
                     ",\"all_bytes\":", p.all_bytes()));
  }
  opened.backend = *std::move(backend);
  return opened;
}

}  // namespace

absl::StatusOr<OpenedBackend> OpenServiceBackend(const ServiceBackendOptions& o) {
  if (!o.log) return absl::InvalidArgumentError("OpenServiceBackend: no log function");
  const std::string kind = o.backend;
  if (kind != "cpu" && kind != "cuda" && kind != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: '", kind, "' is not cpu, cuda or auto"));
  }
  absl::StatusOr<ExpertBudget> budget = ParseExpertBudget(o.gpu_expert_budget);
  if (!budget.ok()) return budget.status();
  absl::StatusOr<std::vector<RemoteWorkerSpec>> specs = WorkerSpecs(o);
  if (!specs.ok()) return specs.status();
  if (kind == "cpu") return OpenCpuBackend(o, *budget, *specs);
#if TANDEM_WITH_CUDA_BACKEND
  if (!specs->empty()) {
    const std::string why =
        "host expert workers (--worker / --connect-worker) are not supported by the CUDA backend "
        "yet: it keeps every routed expert on the GPU";
    if (kind == "cuda") {
      return absl::InvalidArgumentError(absl::StrCat("--backend cuda: ", why,
                                                     "; use --backend cpu with workers"));
    }
    LogBackendChoice(o.log, "cpu", why);
    return OpenCpuBackend(o, *budget, *specs);
  }
  // Asked of the CUDA runtime directly, before any model is opened.
  if (const std::string no_device = CudaDeviceUnavailableReason(); !no_device.empty()) {
    if (kind == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend cuda: ", no_device, "; use --backend cpu or auto"));
    }
    LogBackendChoice(o.log, "cpu", no_device);
    return OpenCpuBackend(o, *budget, *specs);
  }
  absl::StatusOr<std::unique_ptr<Backend>> cuda = OpenCudaBackend(o, *budget);
  if (cuda.ok()) {
    if (kind == "auto") LogBackendChoice(o.log, "cuda", "built with the CUDA backend; a device is present");
    OpenedBackend opened;
    opened.backend = *std::move(cuda);
    return opened;
  }
  // With a device present, any failure (bad flags, a bad model file, device memory) is an error in
  // auto mode too: falling back would hide it.
  return absl::Status(cuda.status().code(),
                      absl::StrCat(kind == "cuda" ? "--backend cuda: " : "--backend auto (cuda): ",
                                   cuda.status().message()));
#else
  if (kind == "cuda") {
    return absl::FailedPreconditionError(
        "--backend cuda: this build has no CUDA backend (configure with -DTANDEM_ENABLE_CUDA=ON "
        "on a machine with nvcc, or use --backend cpu or auto)");
  }
  LogBackendChoice(o.log, "cpu", "this build has no CUDA backend");
  return OpenCpuBackend(o, *budget, *specs);
#endif
}

}  // namespace tandem
