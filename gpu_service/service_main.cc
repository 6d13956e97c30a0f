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
#include "gpu_service/backend/remote_experts.h"
#include "gpu_service/engine/engine.h"
#include "gpu_service/metrics/metrics_http_server.h"
#include "gpu_service/metrics/metrics_registry.h"
#include "gpu_service/metrics/service_metrics.h"
#include "gpu_service/server/generation_service.h"
#include "gpu_service/server/grpc_server.h"
#include "gpu_service/server/listen_check.h"
#include "gpu_service/service_backend.h"

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
ABSL_FLAG(bool, cuda_dense_split, false,
          "CUDA backend, fast mode: dense prefill products as three f16 products of hi/lo halves, or "
          "one f16 product plus an fp8 correction for large matrices (near-f32 accuracy, slower; "
          "false, the default: one f16 product each; the router and shared expert stay split)");
ABSL_FLAG(bool, cuda_dense_out_single, true,
          "CUDA backend, fast mode with --cuda-dense-split: the mixers' output products (GDN ssm_out, "
          "attention o) as one f16 product, the other dense products split (false: those split too; "
          "docs/VALIDATION.md has the routing agreement of both)");
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

ServiceBackendOptions BackendOptionsFromFlags() {
  ServiceBackendOptions o;
  o.backend = absl::GetFlag(FLAGS_backend);
  o.model = absl::GetFlag(FLAGS_model);
  o.gpu_expert_budget = absl::GetFlag(FLAGS_gpu_expert_budget);
  o.spawn_workers = SpawnWorkerSpecs();
  o.connect_workers = ConnectWorkerSpecs();
  o.max_running = absl::GetFlag(FLAGS_max_running);
  o.step_token_budget = absl::GetFlag(FLAGS_step_token_budget);
  o.max_context = absl::GetFlag(FLAGS_max_context);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.max_state_pages = absl::GetFlag(FLAGS_max_state_pages);
  o.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  o.worker_exact = absl::GetFlag(FLAGS_worker_exact);
  o.worker_channel_file = absl::GetFlag(FLAGS_worker_channel_file);
  o.worker_call_timeout = absl::GetFlag(FLAGS_worker_call_timeout);
  o.cuda_mode = absl::GetFlag(FLAGS_cuda_mode);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.cuda_pdl = absl::GetFlag(FLAGS_cuda_pdl);
  o.cuda_l2_prefetch = absl::GetFlag(FLAGS_cuda_l2_prefetch);
  o.cuda_dense_copies = absl::GetFlag(FLAGS_cuda_dense_copies);
  o.cuda_dense_split = absl::GetFlag(FLAGS_cuda_dense_split);
  o.cuda_dense_out_single = absl::GetFlag(FLAGS_cuda_dense_out_single);
  o.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  o.log = Log;
  return o;
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

SchedulerOptions SchedulerOptionsFromFlags() {
  SchedulerOptions o;
  o.max_running = absl::GetFlag(FLAGS_max_running);
  o.max_queue = absl::GetFlag(FLAGS_max_queue);
  o.step_token_budget = absl::GetFlag(FLAGS_step_token_budget);
  return o;
}

// The flags that need no model to check, checked before the model loads (minutes for an 80B
// file), so that a typo or a port already taken fails at once and names its flag.
absl::Status CheckServiceFlags() {
  if (absl::Status s = CheckSchedulerOptions(SchedulerOptionsFromFlags()); !s.ok()) return s;
  auto at_least = [](const char* flag, int64_t value, int64_t min) {
    return value >= min ? absl::OkStatus()
                        : absl::InvalidArgumentError(absl::StrCat(flag, ": ", value, " < ", min));
  };
  const int64_t cap = absl::GetFlag(FLAGS_max_new_tokens_cap);
  const int64_t by_default = absl::GetFlag(FLAGS_default_max_new_tokens);
  for (absl::Status s : {at_least("--max-context", absl::GetFlag(FLAGS_max_context), 0),
                         at_least("--max-new-tokens-cap", cap, 1),
                         at_least("--default-max-new-tokens", by_default, 1),
                         at_least("--kv-pages", absl::GetFlag(FLAGS_kv_pages), 0),
                         at_least("--threads", absl::GetFlag(FLAGS_threads), 0),
                         at_least("--max-state-pages", absl::GetFlag(FLAGS_max_state_pages), 0),
                         at_least("--max-message-bytes", absl::GetFlag(FLAGS_max_message_bytes), 1)}) {
    if (!s.ok()) return s;
  }
  if (by_default > cap) {
    return absl::InvalidArgumentError(absl::StrCat("--default-max-new-tokens: ", by_default,
                                                   " is above --max-new-tokens-cap ", cap));
  }
  if (absl::Status s = CheckListenAddressFree("--listen", absl::GetFlag(FLAGS_listen)); !s.ok()) {
    return s;
  }
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    return CheckListenAddressFree("--metrics-listen", absl::GetFlag(FLAGS_metrics_listen));
  }
  return absl::OkStatus();
}

int Run() {
  if (absl::GetFlag(FLAGS_model).empty()) {
    return Fail(absl::InvalidArgumentError("--model is required"));
  }
  if (absl::Status s = CheckServiceFlags(); !s.ok()) return Fail(s);
  // Signals are taken by sigwait below; block them before any thread starts so that every
  // thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<OpenedBackend> opened = OpenServiceBackend(BackendOptionsFromFlags());
  if (!opened.ok()) return Fail(opened.status());
  HostExpertWorkers* workers = opened->workers.get();
  std::unique_ptr<Backend>* backend = &opened->backend;

  EngineOptions engine_options;
  engine_options.scheduler = SchedulerOptionsFromFlags();  // checked by CheckServiceFlags
  engine_options.max_context = absl::GetFlag(FLAGS_max_context);

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
