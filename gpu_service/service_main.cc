// tandem-gpu-service: serves tandem.v1.Generation for one model.
//
//   tandem-gpu-service --model models/tiny.gguf [--listen 127.0.0.1:50051]
//       [--metrics-listen 127.0.0.1:9090] [--backend cpu|cuda|auto] ...
//
// Flags may be written with dashes (--max-running) or underscores (--max_running).
//
// Start-up: load the model on the backend, start the engine, the gRPC server (health NOT_SERVING)
// and the metrics endpoint, then mark health SERVING (and write --ready-file). On SIGTERM or
// SIGINT: health NOT_SERVING, admit nothing new (UNAVAILABLE), let queued and running requests
// finish within --drain-timeout, cancel what is left, shut the server down and exit 0.
#include <signal.h>

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
#include "gpu_service/engine/engine.h"
#include "gpu_service/metrics/metrics_http_server.h"
#include "gpu_service/metrics/metrics_registry.h"
#include "gpu_service/metrics/service_metrics.h"
#include "gpu_service/server/generation_service.h"
#include "gpu_service/server/grpc_server.h"

ABSL_FLAG(std::string, model, "", "the model's GGUF file (required)");
ABSL_FLAG(std::string, model_id, "", "the id clients name the model by (default: the file's stem)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address; port 0 picks a free port");
ABSL_FLAG(std::string, backend, "auto", "cpu, cuda, or auto (cuda when built with it, else cpu)");
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

absl::StatusOr<std::unique_ptr<Backend>> OpenBackend() {
  const std::string kind = absl::GetFlag(FLAGS_backend);
  if (kind != "cpu" && kind != "cuda" && kind != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: '", kind, "' is not cpu, cuda or auto"));
  }
  if (kind == "cuda") {
    return absl::UnimplementedError(
        "--backend cuda: this build has no CUDA backend (use --backend cpu or auto)");
  }
  absl::StatusOr<ExpertBudget> budget = ParseExpertBudget(absl::GetFlag(FLAGS_gpu_expert_budget));
  if (!budget.ok()) return budget.status();
  CpuBackendOptions options;
  options.model.threads = absl::GetFlag(FLAGS_threads);
  options.model.max_state_pages = absl::GetFlag(FLAGS_max_state_pages);
  options.expert_budget = *budget;
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
      CpuBackend::Open(absl::GetFlag(FLAGS_model), options);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(*std::move(backend));
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

  absl::StatusOr<std::unique_ptr<Backend>> backend = OpenBackend();
  if (!backend.ok()) return Fail(backend.status());

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

  // Health follows the backend (a lost worker) from now on.
  GrpcServer* grpc_server = server->get();
  std::atomic<bool> draining{false};
  (*backend)->SetHealthListener([grpc_server, &draining](bool serving) {
    grpc_server->SetServing(serving && !draining.load());
    Log("health", absl::StrCat("\"serving\":", serving ? "true" : "false"));
  });
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

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("serves tandem.v1.Generation: tandem-gpu-service --model F.gguf");
  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return tandem::Run();
}
