// tandem-host-worker: holds a share of a model's routed experts in NUMA-local memory and serves
// the GPU service's offload channel with the expert kernels.
//
//   tandem-host-worker --model=M.gguf --channel=NAME [--numa-node=0] [--cpus=0-15] [--threads=16]
//                      [--share=0/2] [--exact]
// Exit codes: 0 served until stopped, 1 bad flags or load failure, 3 the channel refused or could
// not be attached, 4 serving ended with an error (e.g. the service went away).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/gguf/gguf_file.h"
#include "host_expert_worker/channel/channel_server.h"
#include "host_expert_worker/kernels/kernel_isa.h"
#include "host_expert_worker/store/expert_store.h"
#include "host_expert_worker/store/numa_memory.h"

ABSL_FLAG(std::string, model, "", "the model's GGUF file");
ABSL_FLAG(std::string, channel, "", "shared-memory segment name made by the GPU service");
ABSL_FLAG(int, numa_node, -1, "NUMA node for the experts' memory (-1: no binding)");
ABSL_FLAG(std::string, cpus, "", "CPUs for the compute threads, e.g. 0-7,16 (default: the node's, "
                                 "or every CPU this process may use)");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per CPU of --cpus)");
ABSL_FLAG(std::string, share, "0/1", "K/N: hold experts [K*E/N, (K+1)*E/N) of every layer");
ABSL_FLAG(bool, exact, false, "compute every request in the exact mode (f32 activations)");
ABSL_FLAG(std::string, isa, "auto", "kernel family: auto, scalar, avx2, avx512vnni");
ABSL_FLAG(int64_t, spin_us, 2000, "after each reply, spin this long for the next request, then sleep");
ABSL_FLAG(int64_t, sleep_slice_us, 5000, "longest single sleep while waiting for a request");
ABSL_FLAG(int64_t, pool_spin_us, 2000, "compute threads: spin this long between requests, then sleep");
ABSL_FLAG(int64_t, max_pairs, 4096, "pairs per compute pass (larger requests take several passes)");
ABSL_FLAG(int64_t, max_rows, 1024, "largest activation_row_count a request may have");
ABSL_FLAG(int64_t, test_stall_after_requests, -1,
          "for tests of stuck-worker handling: after this many requests, stop answering while "
          "staying alive (-1: never)");

namespace tandem {
namespace {

std::string CpuListText(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

int Fail(const absl::Status& s, int code) {
  std::fprintf(stderr, "tandem-host-worker: %s\n", std::string(s.message()).c_str());
  return code;
}

// The --test_stall_after_requests hook: answers the first `limit` requests, then blocks in
// Compute until the process is stopped (its heartbeat thread keeps beating: a stuck worker).
class StallingComputer : public ExpertRowComputer {
 public:
  StallingComputer(ExpertRowComputer* inner, int64_t limit) : inner_(inner), limit_(limit) {}
  const ExpertModelShape& shape() const override { return inner_->shape(); }
  absl::Status Compute(const ExpertBatch& batch, float* outputs) override {
    if (limit_ >= 0 && served_++ >= limit_) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return inner_->Compute(batch, outputs);
  }

 private:
  ExpertRowComputer* inner_;
  int64_t limit_;
  int64_t served_ = 0;
};

int Run() {
  // SIGINT / SIGTERM are taken by one thread with sigwait (blocked everywhere else, so set before
  // any thread starts) and turned into ChannelServer::Stop.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGUSR1);  // only to wake the signal thread at exit
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_channel).empty()) {
    return Fail(absl::InvalidArgumentError("--model and --channel are required"), 1);
  }
  absl::StatusOr<ExpertShare> share = ParseExpertShare(absl::GetFlag(FLAGS_share));
  if (!share.ok()) return Fail(share.status(), 1);
  const int node = absl::GetFlag(FLAGS_numa_node);
  if (absl::Status s = CheckNumaNode(node); !s.ok()) return Fail(s, 1);
  absl::StatusOr<std::vector<int>> cpus = absl::GetFlag(FLAGS_cpus).empty()
                                              ? NumaNodeCpus(node)
                                              : ParseCpuList(absl::GetFlag(FLAGS_cpus));
  if (!cpus.ok()) return Fail(cpus.status(), 1);
  absl::StatusOr<KernelIsa> isa = ParseKernelIsa(absl::GetFlag(FLAGS_isa));
  if (!isa.ok()) return Fail(isa.status(), 1);

  // A compute team larger than the machine is a mistake, and tens of thousands of threads take the
  // system's limit and most of a minute to start and tear down before failing.
  const int max_threads = std::max(1024, static_cast<int>(std::thread::hardware_concurrency()));
  if (absl::GetFlag(FLAGS_threads) < 0 || absl::GetFlag(FLAGS_threads) > max_threads) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--threads: ", absl::GetFlag(FLAGS_threads),
                                                        " is outside [0, ", max_threads, "]")),
                1);
  }
  WorkerThreadPoolOptions pool_options;
  pool_options.threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                          : static_cast<int>(cpus->size());
  pool_options.cpus = *cpus;
  pool_options.spin = absl::Microseconds(absl::GetFlag(FLAGS_pool_spin_us));
  absl::StatusOr<std::unique_ptr<WorkerThreadPool>> pool = WorkerThreadPool::Create(pool_options);
  if (!pool.ok()) return Fail(pool.status(), 1);

  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(absl::GetFlag(FLAGS_model));
  if (!file.ok()) return Fail(file.status(), 1);
  ExpertStoreOptions store_options;
  store_options.share = *share;
  store_options.numa_node = node;
  absl::StatusOr<std::unique_ptr<ExpertStore>> store =
      ExpertStore::Load(**file, store_options, pool->get());
  if (!store.ok()) return Fail(store.status(), 1);
  file->reset();  // the experts are copied; unmap the file

  const ExpertModelShape& shape = (*store)->shape();
  ExpertFfnEngineOptions engine_options;
  engine_options.hidden = shape.hidden_size;
  engine_options.inner = (*store)->inner();
  engine_options.max_pairs = absl::GetFlag(FLAGS_max_pairs);
  engine_options.max_activation_rows = absl::GetFlag(FLAGS_max_rows);
  engine_options.isa = *isa;
  absl::StatusOr<std::unique_ptr<ExpertFfnEngine>> engine =
      ExpertFfnEngine::Create(engine_options, pool->get());
  if (!engine.ok()) return Fail(engine.status(), 1);
  std::vector<std::string> kernels;
  for (uint32_t l = 0; l < shape.layer_count; ++l) {
    const ExpertLayerView& layer = (*store)->layer(l);
    if (absl::Status s = (*engine)->CheckLayer(layer); !s.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", s.message())), 1);
    }
    for (WeightType t : {layer.gate.type, layer.up.type, layer.down.type}) {
      const std::string k = absl::StrCat(std::string(GetWeightTypeInfo(t).name), ":",
                                         std::string(KernelIsaName((*engine)->IsaFor(t))));
      if (std::find(kernels.begin(), kernels.end(), k) == kernels.end()) kernels.push_back(k);
    }
  }
  HostExpertComputer real_computer(store->get(), engine->get(), absl::GetFlag(FLAGS_exact));
  StallingComputer computer(&real_computer, absl::GetFlag(FLAGS_test_stall_after_requests));

  ChannelServerOptions server_options;
  server_options.wait.spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  server_options.wait.sleep_slice = absl::Microseconds(absl::GetFlag(FLAGS_sleep_slice_us));
  absl::StatusOr<std::unique_ptr<ChannelServer>> server =
      ChannelServer::Attach(absl::GetFlag(FLAGS_channel), &computer, server_options);
  if (!server.ok()) return Fail(server.status(), 3);

  std::printf(
      "tandem-host-worker ready: share %d/%d (experts [%u, %u) of %u, %u layers), %.3f GB of "
      "experts on NUMA node %s, CPUs %s, %d threads, kernels %s (%s), %s mode, channel %s\n",
      share->index, share->count, shape.expert_begin, shape.expert_end, shape.expert_count,
      shape.layer_count, static_cast<double>((*store)->bytes()) / 1e9,
      node < 0 ? "none" : absl::StrCat(node).c_str(), CpuListText(*cpus).c_str(), (*pool)->size(),
      std::string(KernelIsaName(*isa)).c_str(), absl::StrJoin(kernels, " ").c_str(),
      absl::GetFlag(FLAGS_exact) ? "exact" : "per-request", absl::GetFlag(FLAGS_channel).c_str());
  std::fflush(stdout);

  ChannelServer* serving = server->get();
  std::thread signal_thread([&stop_signals, serving] {
    int sig = 0;
    if (sigwait(&stop_signals, &sig) == 0 && sig != SIGUSR1) serving->Stop();
  });
  absl::Status served = serving->Serve();
  // Wake the signal thread if no signal came.
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  std::printf("tandem-host-worker: stopped after %llu requests%s%s\n",
              static_cast<unsigned long long>(serving->requests_served()), served.ok() ? "" : ": ",
              served.ok() ? "" : std::string(served.message()).c_str());
  return served.ok() ? 0 : 4;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "serves a share of a model's routed experts to the GPU service over shared memory");
  // Flags may be spelled with dashes (--numa-node) or underscores (--numa_node): Abseil knows
  // only the latter, so rewrite the name part of every --flag before parsing.
  std::vector<std::string> normalized(argv, argv + argc);
  std::vector<char*> args;
  for (std::string& a : normalized) {
    if (a.rfind("--", 0) == 0) {
      for (size_t i = 2; i < a.size() && a[i] != '='; ++i) {
        if (a[i] == '-') a[i] = '_';
      }
    }
    args.push_back(a.data());
  }
  argv = args.data();
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
