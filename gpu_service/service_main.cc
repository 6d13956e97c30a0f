// tandem-gpu-service: serves tandem.v1.Generation for one model.
//
//   tandem-gpu-service --model models/tiny.gguf [--listen 127.0.0.1:50051]
//       [--metrics-listen 127.0.0.1:9090] [--backend cpu|cuda|auto] [--cuda-mode exact|fast] ...
//
// Backends: cpu (the reference model, optionally with host expert workers) or cuda (CudaBackend,
// in builds with TANDEM_WITH_CUDA_BACKEND: every routed expert resident on one GPU, so no
// --worker / --connect-worker and a --gpu-expert-budget covering every expert). auto: cuda when
// built with it, no host workers are asked for and a CUDA device is present, else cpu (the log's
// backend_choice event says why).
//
// Flags may be written with dashes (--max-running) or underscores (--max_running).
//
// Host expert workers (the routed experts outside --gpu-expert-budget):
//   --worker=SPEC            repeatable; the service spawns tandem-host-worker with SPEC's binding
//                            (gpu_service/backend/remote_experts_spec.h: share=K/N,numa=N,
//                            cpus=LIST,threads=N,isa=NAME) and restarts it if it dies
//   --connect-worker=SPEC    repeatable; the service creates the channel and waits for a worker
//                            started by hand with the channel name it logs (and writes to
//                            --worker-channel-file): tandem-host-worker --model=F --share=K/N
//                            --channel=NAME [--exact]
// Health is SERVING only once the model is loaded and every worker serves; NOT_SERVING while a
// worker is lost (its in-flight requests end with UNAVAILABLE; see remote_experts.h).
//
// Start-up: load the model on the backend, start the engine, the gRPC server (health NOT_SERVING)
// and the metrics endpoint, then mark health SERVING (and write --ready-file). On SIGTERM or
// SIGINT: health NOT_SERVING, admit nothing new (UNAVAILABLE), let queued and running requests
// finish within --drain-timeout, cancel what is left, shut the server down and exit 0.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gpu_service/backend/cpu_backend.h"
#include "gpu_service/backend/expert_placement.h"
#include "gpu_service/backend/remote_experts.h"
#include "gpu_service/backend/remote_experts_spec.h"
#include "gpu_service/engine/engine.h"
#include "gpu_service/metrics/metrics_http_server.h"
#include "gpu_service/metrics/metrics_registry.h"
#include "gpu_service/metrics/service_metrics.h"
#include "gpu_service/server/generation_service.h"
#include "gpu_service/server/grpc_server.h"

#if TANDEM_WITH_CUDA_BACKEND
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#endif

ABSL_FLAG(std::string, model, "", "the model's GGUF file (required)");
ABSL_FLAG(std::string, model_id, "", "the id clients name the model by (default: the file's stem)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address; port 0 picks a free port");
ABSL_FLAG(std::string, backend, "auto",
          "cpu, cuda, or auto (cuda when built with it, without host workers, and a CUDA device "
          "is present; else cpu)");
ABSL_FLAG(std::string, cuda_mode, "fast",
          "CUDA backend arithmetic: fast (f16 tensor-core prefill products and attention, tf32 GDN; "
          "routing agrees with the reference at >= 99% of (token, layer) pairs, docs/VALIDATION.md) "
          "or exact (f32 throughout, matches the CPU reference to 1e-6: for validation)");
ABSL_FLAG(bool, cuda_graphs, true, "CUDA backend: replay decode steps as CUDA graphs (one per batch size)");
ABSL_FLAG(bool, cuda_pdl, true,
          "CUDA backend: programmatic dependent launch (each kernel of a step starts while the one "
          "before it finishes; false: plain launches, for A/B measurements)");
ABSL_FLAG(int32_t, cuda_l2_prefetch, 0,
          "CUDA backend, steps of up to 8 tokens: weights brought into L2 ahead of their products on a "
          "side stream (0: none, measured fastest; 1: within each layer; 2: also the next layer's "
          "mixer inputs)");
ABSL_FLAG(bool, cuda_dense_copies, true,
          "CUDA backend, fast mode: persistent f16 copies of the dense matrices for prefill products "
          "(no per-step dequantization; 6 bytes per weight with --cuda-dense-split, else 2)");
ABSL_FLAG(bool, cuda_dense_split, true,
          "CUDA backend, fast mode: dense prefill products as three f16 products of hi/lo halves "
          "(near-f32 accuracy; false: one f16 product, less accurate and faster)");
ABSL_FLAG(int64_t, kv_pages, 0,
          "CUDA backend: KV-cache pages of 64 positions shared by all requests (0: enough for every "
          "running request at the full context, --max-running x --max-context / 64)");
ABSL_FLAG(int64_t, max_running, 32, "requests in the running batch at once");
ABSL_FLAG(int64_t, max_queue, 256, "waiting requests; beyond this, RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_context, 0, "prompt + generated tokens per request (0: the model's limit)");
ABSL_FLAG(int64_t, max_new_tokens_cap, 1024, "largest max_new_tokens a request may ask for");
ABSL_FLAG(int64_t, default_max_new_tokens, 20, "max_new_tokens of a request that sets none");
ABSL_FLAG(int64_t, step_token_budget, 256, "tokens per engine step, prefill and decode together");
ABSL_FLAG(std::string, metrics_listen, "", "Prometheus /metrics address (empty: off)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM, how long in-flight requests may take to finish");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads (0: every hardware thread)");
ABSL_FLAG(int64_t, max_state_pages, 0, "state pool page limit (0: unbounded)");
ABSL_FLAG(std::string, gpu_expert_budget, "1.0",
          "routed experts computed by the service: bytes (8GiB) or a fraction of all routed "
          "expert bytes (0.5, 50%); the rest go to host workers");
// --worker and --connect-worker may be given several times (Abseil keeps only the last value of a
// flag), so main() takes every occurrence out of argv before Abseil parses the rest; these
// definitions are for --help.
ABSL_FLAG(std::string, worker, "",
          "repeatable: spawn a host expert worker, SPEC = comma-separated key=value items: "
          "share=K/N (required with several workers), numa=N, cpus=LIST (e.g. 0-3,8-11), "
          "threads=N, isa=auto|scalar|avx2|avx512vnni; e.g. --worker=share=0/2,numa=0,cpus=0-7,"
          "threads=8 --worker=share=1/2,numa=1,cpus=8-15,threads=8");
ABSL_FLAG(std::string, connect_worker, "",
          "repeatable: wait for a host worker started by hand; SPEC = share=K/N or empty (0/1). "
          "The service creates the channel, logs {\"event\":\"worker_channel\",...} with its name "
          "(and writes it to --worker-channel-file); start the worker with "
          "tandem-host-worker --model=F.gguf --share=K/N --channel=NAME [--exact]");
ABSL_FLAG(std::string, worker_binary, "",
          "the tandem-host-worker to spawn (default: the one next to this binary, or in the build "
          "tree's host_expert_worker/)");
ABSL_FLAG(bool, worker_exact, false,
          "workers compute in their exact mode (f32 activations; default: int8 activations)");
ABSL_FLAG(std::string, worker_channel_file, "",
          "write 'share=K/N channel=NAME' lines here for hand-started workers (--connect-worker)");
ABSL_FLAG(absl::Duration, worker_ready_timeout, absl::Minutes(5),
          "how long start-up waits for every worker to serve");
ABSL_FLAG(absl::Duration, worker_call_timeout, absl::Seconds(30),
          "how long one MoE layer waits for the workers' reply; a worker that misses it is given up "
          "as stuck (killed and restarted if spawned) and the step fails with UNAVAILABLE");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20, "gRPC receive and send message size limit");
ABSL_FLAG(std::string, ready_file, "",
          "once SERVING, write 'grpc_port=N' and 'metrics_port=M' lines to this file");

namespace tandem {
namespace {

void Log(const std::string& event, const std::string& fields) {
  std::fprintf(stderr, "{\"event\":\"%s\"%s%s}\n", event.c_str(), fields.empty() ? "" : ",",
               fields.c_str());
  std::fflush(stderr);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem-gpu-service: %s\n", std::string(s.message()).c_str());
  return 1;
}

// --worker / --connect-worker values, taken out of argv by main().
std::vector<std::string>& SpawnWorkerSpecs() {
  static std::vector<std::string> specs;
  return specs;
}
std::vector<std::string>& ConnectWorkerSpecs() {
  static std::vector<std::string> specs;
  return specs;
}

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

absl::StatusOr<std::vector<RemoteWorkerSpec>> WorkerSpecsFromFlags() {
  std::vector<RemoteWorkerSpec> specs;
  for (const std::string& text : SpawnWorkerSpecs()) {
    absl::StatusOr<RemoteWorkerSpec> spec = ParseRemoteWorkerSpec(text, true, "--worker");
    if (!spec.ok()) return spec.status();
    specs.push_back(*spec);
  }
  for (const std::string& text : ConnectWorkerSpecs()) {
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

// The backend and, when experts are offloaded, the host workers it uses (which must outlive it:
// destroy the backend first).
struct OpenedBackend {
  std::unique_ptr<HostExpertWorkers> workers;
  std::unique_ptr<Backend> backend;
};

// Text for a JSON string value (quotes and backslashes escaped, control characters dropped).
std::string JsonText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) out.push_back(c);
  }
  return out;
}

void LogBackendChoice(const std::string& chosen, const std::string& reason) {
  Log("backend_choice",
      absl::StrCat("\"backend\":\"", chosen, "\",\"reason\":\"", JsonText(reason), "\""));
}

#if TANDEM_WITH_CUDA_BACKEND
// CudaBackend over --model: every routed expert resident (the budget must cover them all), one
// sequence per running request (--max-running), --step-token-budget tokens per step, and state
// for the service's context limit (--max-context, capped by the model's).
absl::StatusOr<std::unique_ptr<Backend>> OpenCudaBackend(const ExpertBudget& budget) {
  CudaBackendOptions options;
  const std::string mode = absl::GetFlag(FLAGS_cuda_mode);
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
      ReferenceModel::Open(absl::GetFlag(FLAGS_model), model_options);
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
  int64_t max_context = absl::GetFlag(FLAGS_max_context);
  if (max_context <= 0) max_context = model_limit;
  if (model_limit > 0) max_context = std::min(max_context, model_limit);
  if (max_context <= 0) {
    return absl::InvalidArgumentError("--max-context: the model has no context length; set it");
  }
  options.max_sequences = absl::GetFlag(FLAGS_max_running);
  options.max_batch_tokens = absl::GetFlag(FLAGS_step_token_budget);
  options.max_context = max_context;
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.fast_dense_split = absl::GetFlag(FLAGS_cuda_dense_split);
  options.pdl = absl::GetFlag(FLAGS_cuda_pdl);
  options.prepare_dense_weights = absl::GetFlag(FLAGS_cuda_dense_copies);
  options.l2_prefetch = absl::GetFlag(FLAGS_cuda_l2_prefetch);
  if (options.l2_prefetch < 0 || options.l2_prefetch > 2) {
    return absl::InvalidArgumentError("--cuda-l2-prefetch: must be 0, 1 or 2");
  }
  options.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  if (options.kv_pages < 0) return absl::InvalidArgumentError("--kv-pages: must be >= 0");
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
      CudaBackend::Create(*std::move(model), options);
  if (!backend.ok()) return backend.status();
  Log("cuda_backend", absl::StrCat("\"mode\":\"", mode,
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

absl::StatusOr<OpenedBackend> OpenCpuBackend(const ExpertBudget& budget,
                                             const std::vector<RemoteWorkerSpec>& specs);

// --backend: cpu, cuda (an error naming the flag when this build or this machine has no CUDA, or
// when host workers are asked for), or auto (cuda when possible, else cpu with the reason logged).
absl::StatusOr<OpenedBackend> OpenBackend() {
  const std::string kind = absl::GetFlag(FLAGS_backend);
  if (kind != "cpu" && kind != "cuda" && kind != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: '", kind, "' is not cpu, cuda or auto"));
  }
  absl::StatusOr<ExpertBudget> budget = ParseExpertBudget(absl::GetFlag(FLAGS_gpu_expert_budget));
  if (!budget.ok()) return budget.status();
  absl::StatusOr<std::vector<RemoteWorkerSpec>> specs = WorkerSpecsFromFlags();
  if (!specs.ok()) return specs.status();
  if (kind == "cpu") return OpenCpuBackend(*budget, *specs);
#if TANDEM_WITH_CUDA_BACKEND
  if (!specs->empty()) {
    const std::string why =
        "host expert workers (--worker / --connect-worker) are not supported by the CUDA backend "
        "yet: it keeps every routed expert on the GPU";
    if (kind == "cuda") {
      return absl::InvalidArgumentError(absl::StrCat("--backend cuda: ", why,
                                                     "; use --backend cpu with workers"));
    }
    LogBackendChoice("cpu", why);
    return OpenCpuBackend(*budget, *specs);
  }
  // Asked of the CUDA runtime directly, before any model is opened.
  if (const std::string no_device = CudaDeviceUnavailableReason(); !no_device.empty()) {
    if (kind == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend cuda: ", no_device, "; use --backend cpu or auto"));
    }
    LogBackendChoice("cpu", no_device);
    return OpenCpuBackend(*budget, *specs);
  }
  absl::StatusOr<std::unique_ptr<Backend>> cuda = OpenCudaBackend(*budget);
  if (cuda.ok()) {
    if (kind == "auto") LogBackendChoice("cuda", "built with the CUDA backend; a device is present");
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
  LogBackendChoice("cpu", "this build has no CUDA backend");
  return OpenCpuBackend(*budget, *specs);
#endif
}

// The CPU backend, with host expert workers when `specs` names any.
absl::StatusOr<OpenedBackend> OpenCpuBackend(const ExpertBudget& budget,
                                             const std::vector<RemoteWorkerSpec>& specs) {
  CpuBackendOptions options;
  options.model.threads = absl::GetFlag(FLAGS_threads);
  options.model.max_state_pages = absl::GetFlag(FLAGS_max_state_pages);
  options.expert_budget = budget;
  const std::string model_path = absl::GetFlag(FLAGS_model);
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model =
      ReferenceModel::Open(model_path, options.model);
  if (!model.ok()) return model.status();

  OpenedBackend opened;
  if (!specs.empty()) {
    HostExpertWorkersOptions w;
    w.workers = specs;
    w.worker_binary = absl::GetFlag(FLAGS_worker_binary).empty() ? DefaultWorkerBinary()
                                                                 : absl::GetFlag(FLAGS_worker_binary);
    w.model_path = std::filesystem::absolute(model_path).string();
    w.exact = absl::GetFlag(FLAGS_worker_exact);
    w.call_timeout = absl::GetFlag(FLAGS_worker_call_timeout);
    w.max_rows_per_request = static_cast<uint32_t>(
        std::clamp<int64_t>(absl::GetFlag(FLAGS_step_token_budget), 1, 1024));
    w.log = [](const std::string& event, const std::string& fields) { Log(event, fields); };
    absl::StatusOr<std::unique_ptr<HostExpertWorkers>> workers = HostExpertWorkers::Start(
        (*model)->file(), (*model)->config(),
        static_cast<uint32_t>((*model)->weights().layers.size()), std::move(w));
    if (!workers.ok()) return workers.status();
    opened.workers = *std::move(workers);
    options.remote = opened.workers.get();
    for (const HostExpertWorkers::WorkerStatus& ws : opened.workers->worker_status()) {
      Log("worker_channel", absl::StrCat("\"share\":\"", ws.share, "\",\"channel\":\"", ws.channel,
                                         "\",\"spawned\":", ws.spawned ? "true" : "false"));
    }
    if (!absl::GetFlag(FLAGS_worker_channel_file).empty()) {
      if (absl::Status s = WriteWorkerChannelFile(absl::GetFlag(FLAGS_worker_channel_file),
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
    Log("expert_placement",
        absl::StrCat("\"local_experts\":", p.local_count(), ",\"worker_experts\":",
                     p.remote_count(), ",\"local_bytes\":", p.local_bytes(),
                     ",\"all_bytes\":", p.all_bytes()));
  }
  opened.backend = *std::move(backend);
  return opened;
}

absl::Status WriteReadyFile(const std::string& path, int grpc_port, int metrics_port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "grpc_port=" << grpc_port << "\nmetrics_port=" << metrics_port << "\n";
    if (!out) return absl::UnavailableError(absl::StrCat("--ready-file: cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("--ready-file: ", path, ": ", ec.message()));
  return absl::OkStatus();
}

int Run() {
  if (absl::GetFlag(FLAGS_model).empty()) {
    return Fail(absl::InvalidArgumentError("--model is required"));
  }
  // Signals are taken by sigwait below; block them before any thread starts so that every
  // thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<OpenedBackend> opened = OpenBackend();
  if (!opened.ok()) return Fail(opened.status());
  HostExpertWorkers* workers = opened->workers.get();
  std::unique_ptr<Backend>* backend = &opened->backend;

  EngineOptions engine_options;
  engine_options.scheduler.max_running = absl::GetFlag(FLAGS_max_running);
  engine_options.scheduler.max_queue = absl::GetFlag(FLAGS_max_queue);
  engine_options.scheduler.step_token_budget = absl::GetFlag(FLAGS_step_token_budget);
  engine_options.max_context = absl::GetFlag(FLAGS_max_context);
  if (absl::Status s = CheckSchedulerOptions(engine_options.scheduler); !s.ok()) return Fail(s);
  if (engine_options.max_context < 0) {
    return Fail(absl::InvalidArgumentError("--max-context: must be >= 0"));
  }
  if (absl::GetFlag(FLAGS_max_new_tokens_cap) < 1 || absl::GetFlag(FLAGS_default_max_new_tokens) < 1) {
    return Fail(absl::InvalidArgumentError(
        "--max-new-tokens-cap and --default-max-new-tokens: must be >= 1"));
  }

  MetricsRegistry registry;
  ServiceMetrics metrics(&registry, backend->get());
  Engine engine(backend->get(), engine_options, &metrics);
  if (engine.max_context() < 2) {
    return Fail(absl::InvalidArgumentError("--max-context: the model has no context length; set it"));
  }

  ServingLimits limits;
  limits.model_id = absl::GetFlag(FLAGS_model_id);
  if (limits.model_id.empty()) {
    limits.model_id = std::filesystem::path(absl::GetFlag(FLAGS_model)).stem().string();
  }
  limits.vocab = std::min<int64_t>((*backend)->config().vocab, (*backend)->tokenizer().vocab_size());
  limits.max_context = engine.max_context();
  limits.max_new_tokens_cap = absl::GetFlag(FLAGS_max_new_tokens_cap);
  limits.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  GenerationService service(&engine, backend->get(), limits);

  GrpcServerOptions server_options;
  server_options.listen = absl::GetFlag(FLAGS_listen);
  server_options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(server_options, &service);
  if (!server.ok()) return Fail(server.status());

  std::unique_ptr<MetricsHttpServer> metrics_http;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> m = MetricsHttpServer::Start(
        absl::GetFlag(FLAGS_metrics_listen), [&registry] { return registry.Render(); });
    if (!m.ok()) return Fail(m.status());
    metrics_http = *std::move(m);
  }

  // Health: SERVING once the model is loaded (it is, here) and every worker serves. With workers,
  // it follows their availability, which covers the backend's only reason to report unhealthy
  // (a lost worker) and also its recovery (the backend itself would only report healthy again
  // after a successful step, which no load balancer would send while NOT_SERVING).
  GrpcServer* grpc_server = server->get();
  std::atomic<bool> draining{false};
  if (workers != nullptr) {
    (*backend)->SetHealthListener([](bool serving) {
      Log("backend_health", absl::StrCat("\"serving\":", serving ? "true" : "false"));
    });
    const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_worker_ready_timeout);
    if (absl::Status s = workers->WaitUntilReady(deadline); !s.ok()) return Fail(s);
    workers->SetAvailabilityListener([grpc_server, &draining](bool serving) {
      grpc_server->SetServing(serving && !draining.load());
      Log("health", absl::StrCat("\"serving\":", serving ? "true" : "false"));
    });
  } else {
    (*backend)->SetHealthListener([grpc_server, &draining](bool serving) {
      grpc_server->SetServing(serving && !draining.load());
      Log("health", absl::StrCat("\"serving\":", serving ? "true" : "false"));
    });
  }
  const int metrics_port = metrics_http ? metrics_http->port() : 0;
  if (!absl::GetFlag(FLAGS_ready_file).empty()) {
    if (absl::Status s = WriteReadyFile(absl::GetFlag(FLAGS_ready_file), grpc_server->port(),
                                        metrics_port);
        !s.ok()) {
      return Fail(s);
    }
  }
  Log("serving", absl::StrCat("\"model_id\":\"", limits.model_id, "\",\"backend\":\"",
                              (*backend)->name(), "\",\"grpc_port\":", grpc_server->port(),
                              ",\"metrics_port\":", metrics_port,
                              ",\"max_context\":", limits.max_context));

  int signal = 0;
  sigwait(&signals, &signal);

  // Drain.
  const auto drain_deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_drain_timeout));
  Log("draining", absl::StrCat("\"signal\":", signal, ",\"running\":", engine.running(),
                               ",\"waiting\":", engine.waiting()));
  draining = true;
  grpc_server->SetServing(false);
  engine.StopAdmitting();
  bool drained = engine.WaitUntilIdle(drain_deadline);
  if (!drained) {
    engine.CancelAll();
    engine.WaitUntilIdle(SteadyTime::max());
  }
  // Calls whose last message is still being written get a moment to complete.
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*backend)->SetHealthListener(nullptr);
  if (workers != nullptr) workers->SetAvailabilityListener(nullptr);
  Log("stopped", absl::StrCat("\"drained\":", drained ? "true" : "false"));
  return 0;
}

}  // namespace
}  // namespace tandem

// Abseil flag names are identifiers (--max_running); the documented spelling is --max-running.
// Both are accepted: dashes in a flag's name (not its value) become underscores.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    const size_t end = std::min(a.find('='), a.size());
    for (size_t j = 2; j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  return args;
}

// Removes every --worker / --connect-worker (as --flag=SPEC or --flag SPEC) from the arguments and
// keeps their values in order (Abseil would keep only the last of a repeated flag).
std::vector<std::string> TakeWorkerFlags(std::vector<std::string> args) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i > 0 && a == "--") {
      rest.insert(rest.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    std::vector<std::string>* into = nullptr;
    std::string name;
    if (a == "--worker" || a.rfind("--worker=", 0) == 0) {
      into = &tandem::SpawnWorkerSpecs();
      name = "--worker";
    } else if (a == "--connect_worker" || a.rfind("--connect_worker=", 0) == 0) {
      into = &tandem::ConnectWorkerSpecs();
      name = "--connect_worker";
    }
    if (i == 0 || into == nullptr) {
      rest.push_back(a);
      continue;
    }
    if (a.size() > name.size()) {
      into->push_back(a.substr(name.size() + 1));
    } else if (i + 1 < args.size()) {
      into->push_back(args[++i]);
    } else {
      into->push_back("");
    }
  }
  return rest;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("serves tandem.v1.Generation: tandem-gpu-service --model F.gguf");
  std::vector<std::string> args = TakeWorkerFlags(NormalizeFlagNames(argc, argv));
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return tandem::Run();
}
