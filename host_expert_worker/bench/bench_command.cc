#include "host_expert_worker/bench/bench_command.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "common/weights/block_layouts.h"
#include "common/weights/half.h"
#include "gpu_service/offload/channel_bench.h"
#include "host_expert_worker/bench/dram_bandwidth.h"
#include "host_expert_worker/kernels/expert_ffn_engine.h"
#include "host_expert_worker/store/expert_store.h"
#include "host_expert_worker/store/numa_memory.h"

namespace tandem {
namespace {

constexpr char kUsage[] =
    "usage: tandem bench worker [--model F.gguf] [--json] [--threads N] [--gb G] [--isa I]\n"
    "                           [--worker PATH] [--no-channel]\n";

struct BenchFlags {
  std::string model;
  bool json = false;
  int threads = 0;
  double gb = 2.0;
  std::string isa = "auto";
  std::string worker = TANDEM_BINARY_DIR "/host_expert_worker/tandem-host-worker";
  bool channel = true;
};

struct CaseResult {
  int experts = 0;
  int rows = 0;
  int requests = 0;
  double weight_bytes = 0;  // per request
  double p50_us = 0;
  double weight_gbps = 0;      // weight bytes read per second
  double effective_gbps = 0;   // weight bytes x rows per second
};

// Fills [p, p + n) with xorshift bytes (any bytes are valid Q4_K quants and scales).
void FillRandom(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
}

// Makes every Q4_K block's d / dmin a small normal f16, so the outputs stay finite.
void FixHalves(uint8_t* p, uint64_t blocks) {
  const uint16_t d = Fp32ToFp16(0.002f), dmin = Fp32ToFp16(0.001f);
  for (uint64_t b = 0; b < blocks; ++b) {
    std::memcpy(p + b * sizeof(BlockQ4_K), &d, 2);
    std::memcpy(p + b * sizeof(BlockQ4_K) + 2, &dmin, 2);
  }
}

struct SyntheticExperts {
  std::unique_ptr<NumaRegion> region;
  std::vector<ExpertLayerView> layers;
  int64_t h = 2048, inner = 512, experts = 64;
};

SyntheticExperts MakeSyntheticExperts(double gb, WorkerThreadPool* pool) {
  SyntheticExperts s;
  const int64_t row_gate = s.h / 256 * 144, row_down = s.inner / 256 * 144;
  const uint64_t matrix = static_cast<uint64_t>(s.inner * row_gate);  // = h * row_down
  const uint64_t layer_bytes = 3 * matrix * s.experts;
  const int layers = std::max<int>(2, static_cast<int>(gb * 1e9 / layer_bytes + 0.5));
  s.region = *NumaRegion::Allocate(layer_bytes * layers, kNoNumaNode);
  uint8_t* base = s.region->data();
  const uint64_t total = layer_bytes * layers, piece = uint64_t{1} << 22;
  std::atomic<uint64_t> next{0};
  pool->Run([&](int) {
    for (uint64_t i; (i = next.fetch_add(1)) * piece < total;) {
      const uint64_t begin = i * piece, end = std::min(total, begin + piece);
      FillRandom(base + begin, end - begin, i + 1);
    }
  });
  FixHalves(base, total / sizeof(BlockQ4_K));
  for (int l = 0; l < layers; ++l) {
    uint8_t* layer = base + l * layer_bytes;
    ExpertLayerView v;
    v.gate = ExpertMatrixView{WeightType::kQ4_K, layer, s.h, s.inner, s.experts, row_gate};
    v.up = ExpertMatrixView{WeightType::kQ4_K, layer + matrix * s.experts, s.h, s.inner, s.experts, row_gate};
    v.down = ExpertMatrixView{WeightType::kQ4_K, layer + 2 * matrix * s.experts, s.inner, s.h, s.experts, row_down};
    s.layers.push_back(v);
  }
  return s;
}

uint64_t ExpertBytes(const ExpertLayerView& v) {
  return static_cast<uint64_t>(v.gate.rows * v.gate.row_bytes + v.up.rows * v.up.row_bytes +
                               v.down.rows * v.down.row_bytes);
}

CaseResult RunCase(ExpertFfnEngine& engine, const std::vector<ExpertLayerView>& layers, int experts,
                   int rows) {
  const int64_t h = engine.options().hidden;
  const uint32_t held = static_cast<uint32_t>(layers[0].gate.experts);
  experts = std::min<int>(experts, static_cast<int>(held));
  std::vector<float> x(static_cast<size_t>(rows * h));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
  std::vector<ExpertRowPair> pairs(static_cast<size_t>(experts * rows));
  std::vector<float> out(pairs.size() * h);
  std::vector<double> us;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  for (int i = 0; i < 4 || elapsed < 1.5 || us.size() < 20; ++i) {
    const ExpertLayerView& layer = layers[i % layers.size()];
    for (int e = 0; e < experts; ++e) {
      // Distinct experts that move with the request, spread over the layer.
      const uint32_t expert = layer.first_expert + (static_cast<uint32_t>(i) * 7 + e * (held / experts)) % held;
      for (int r = 0; r < rows; ++r) pairs[e * rows + r] = {expert, static_cast<uint32_t>(r)};
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = engine.Compute(layer, pairs, x.data(), rows, false, out.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (!s.ok()) std::fprintf(stderr, "compute failed: %s\n", std::string(s.message()).c_str());
    if (i >= 3) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    elapsed = std::chrono::duration<double>(t1 - start).count();
  }
  CaseResult r;
  r.experts = experts;
  r.rows = rows;
  r.requests = static_cast<int>(us.size());
  r.weight_bytes = static_cast<double>(ExpertBytes(layers[0])) * experts;
  double total_us = 0;
  for (double u : us) total_us += u;
  std::sort(us.begin(), us.end());
  r.p50_us = us[us.size() / 2];
  r.weight_gbps = r.weight_bytes * r.requests / (total_us * 1e-6) / 1e9;
  r.effective_gbps = r.weight_gbps * rows;
  return r;
}

// One expert x one row on a one-thread team, the same expert every request, so its 1.77 MB stay
// in the core's L2 / the L3: the per-core compute rate of the 1-row path (quantize, gate, up,
// SiLU, two-term down input, down), free of DRAM. Median of 200-request passes over 0.3 s.
CaseResult RunSingleCoreWarm(const ExpertLayerView& layer, const ExpertFfnEngineOptions& options, int cpu) {
  WorkerThreadPoolOptions po;
  po.threads = 1;
  if (cpu >= 0) po.cpus = {cpu};
  std::unique_ptr<WorkerThreadPool> pool = *WorkerThreadPool::Create(po);
  std::unique_ptr<ExpertFfnEngine> engine = *ExpertFfnEngine::Create(options, pool.get());
  const int64_t h = options.hidden;
  std::vector<float> x(static_cast<size_t>(h)), out(static_cast<size_t>(h));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
  const ExpertRowPair pair{layer.first_expert, 0};
  std::vector<double> pass_us;
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < 5 || std::chrono::steady_clock::now() - start < std::chrono::milliseconds(300); ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) {
      (void)engine->Compute(layer, std::span<const ExpertRowPair>(&pair, 1), x.data(), 1, false, out.data());
    }
    pass_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200);
  }
  std::sort(pass_us.begin(), pass_us.end());
  CaseResult r;
  r.experts = 1;
  r.rows = 1;
  r.requests = static_cast<int>(pass_us.size()) * 200;
  r.weight_bytes = static_cast<double>(ExpertBytes(layer));
  r.p50_us = pass_us[pass_us.size() / 2];
  r.weight_gbps = r.weight_bytes / (r.p50_us * 1e-6) / 1e9;
  r.effective_gbps = r.weight_gbps;
  return r;
}

// The channel's round trips with a spawned tandem-host-worker. Returns a note when it cannot run.
absl::StatusOr<ChannelBenchResult> RunChannel(const BenchFlags& flags, int threads, std::string* model_used) {
  std::string path = flags.model;
  std::string generated;
  if (path.empty()) {
    // One MoE layer with the 80B expert shapes (the rest of the model small).
    absl::StatusOr<GenModelSpec> spec = PresetSpec("tiny-q3n");
    if (!spec.ok()) return spec.status();
    spec->h = 2048;
    spec->layers = 1;
    spec->nextn = 0;
    spec->experts = 16;
    spec->experts_used = 10;
    spec->expert_ffn = 512;
    spec->shared_ffn = 512;
    spec->expert_gate_up_type = WeightType::kQ4_K;
    spec->expert_down_type = WeightType::kQ4_K;
    generated = absl::StrCat("/tmp/tandem_bench_worker_", getpid(), ".gguf");
    if (absl::Status s = GenerateModel(*spec, generated); !s.ok()) return s;
    path = generated;
  }
  *model_used = flags.model.empty() ? "generated 1-layer model, 16 experts h=2048 I=512 q4_K" : path;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  ChannelBenchOptions o;
  o.worker_path = flags.worker;
  // The worker gets CPUs 1.., leaving CPU 0 to the spinning client, so the two spinning sides
  // never share a core.
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const int worker_threads = hw > 1 ? std::min(threads, hw - 1) : threads;
  o.worker_args = {absl::StrCat("--model=", path), absl::StrCat("--threads=", worker_threads),
                   absl::StrCat("--isa=", flags.isa)};
  if (hw > 1) o.worker_args.push_back(absl::StrCat("--cpus=1-", hw - 1));
  absl::StatusOr<ModelConfig> config = ReadModelConfig(**file);
  if (!config.ok()) return config.status();
  o.layer_count = static_cast<uint32_t>(config->n_layers + config->nextn);
  o.expert_count = static_cast<uint32_t>(config->moe.E);
  o.hidden_size = static_cast<uint32_t>(config->h);
  o.decode_pairs = std::min<uint32_t>(10, o.expert_count);
  o.round_trips = 2000;
  absl::StatusOr<uint64_t> fingerprint = ExpertTensorsFingerprint(**file, o.layer_count);
  if (!fingerprint.ok()) return fingerprint.status();
  o.model_fingerprint = *fingerprint;
  file->reset();
  absl::StatusOr<ChannelBenchResult> r = RunChannelBench(o);
  if (!generated.empty()) unlink(generated.c_str());
  return r;
}

}  // namespace

int RunBenchCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "worker") != 0) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  BenchFlags flags;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = absl::StrCat(name, "=");
      if (a.rfind(prefix, 0) == 0) return argv[i] + prefix.size();
      if (a == name && i + 1 < argc) return argv[++i];
      return nullptr;
    };
    const char* v = nullptr;
    if (a == "--json") {
      flags.json = true;
    } else if (a == "--no-channel") {
      flags.channel = false;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if ((v = value("--model"))) {
      flags.model = v;
    } else if ((v = value("--threads"))) {
      if (!absl::SimpleAtoi(v, &flags.threads) || flags.threads < 1) {
        std::fprintf(stderr, "tandem bench worker: --threads must be a positive integer\n");
        return 2;
      }
    } else if ((v = value("--gb"))) {
      if (!absl::SimpleAtod(v, &flags.gb) || flags.gb <= 0) {
        std::fprintf(stderr, "tandem bench worker: --gb must be positive\n");
        return 2;
      }
    } else if ((v = value("--isa"))) {
      flags.isa = v;
    } else if ((v = value("--worker"))) {
      flags.worker = v;
    } else {
      std::fprintf(stderr, "tandem bench worker: unexpected argument '%s'\n%s", argv[i], kUsage);
      return 2;
    }
  }
  const int threads = flags.threads > 0 ? flags.threads
                                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  absl::StatusOr<KernelIsa> isa = ParseKernelIsa(flags.isa);
  if (!isa.ok()) {
    std::fprintf(stderr, "tandem bench worker: %s\n", std::string(isa.status().message()).c_str());
    return 2;
  }
  std::vector<int> cpus = *NumaNodeCpus(kNoNumaNode);
  WorkerThreadPoolOptions po;
  po.threads = threads;
  if (static_cast<int>(cpus.size()) >= threads) po.cpus.assign(cpus.begin(), cpus.begin() + threads);
  std::unique_ptr<WorkerThreadPool> pool = *WorkerThreadPool::Create(po);

  // The experts: synthetic, or the file's (share 0/1).
  SyntheticExperts synthetic;
  std::unique_ptr<ExpertStore> store;
  std::vector<ExpertLayerView> layers;
  int64_t h = 0, inner = 0;
  std::string source;
  if (flags.model.empty()) {
    synthetic = MakeSyntheticExperts(flags.gb, pool.get());
    layers = synthetic.layers;
    h = synthetic.h;
    inner = synthetic.inner;
    source = absl::StrFormat("synthetic q4_K experts h=%d I=%d, %d experts x %d layers", h, inner,
                             synthetic.experts, layers.size());
  } else {
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(flags.model);
    absl::StatusOr<std::unique_ptr<ExpertStore>> loaded =
        file.ok() ? ExpertStore::Load(**file, ExpertStoreOptions{}, pool.get())
                  : absl::StatusOr<std::unique_ptr<ExpertStore>>(file.status());
    if (!loaded.ok()) {
      std::fprintf(stderr, "tandem bench worker: %s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    store = std::move(*loaded);
    for (uint32_t l = 0; l < store->shape().layer_count; ++l) layers.push_back(store->layer(l));
    h = store->shape().hidden_size;
    inner = store->inner();
    source = absl::StrFormat("%s: h=%d I=%d, %d experts x %d layers", flags.model, h, inner,
                             store->shape().expert_count, layers.size());
  }
  uint64_t working_set = 0;
  for (const ExpertLayerView& l : layers) working_set += ExpertBytes(l) * l.gate.experts;

  ExpertFfnEngineOptions eo;
  eo.hidden = h;
  eo.inner = inner;
  eo.max_pairs = 512;
  eo.max_activation_rows = 64;
  eo.isa = *isa;
  absl::StatusOr<std::unique_ptr<ExpertFfnEngine>> engine = ExpertFfnEngine::Create(eo, pool.get());
  if (!engine.ok()) {
    std::fprintf(stderr, "tandem bench worker: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = (*engine)->CheckLayer(layers[0]); !s.ok()) {
    std::fprintf(stderr, "tandem bench worker: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  std::vector<CaseResult> cases;
  for (auto [e, r] : {std::pair{10, 1}, std::pair{10, 8}, std::pair{64, 4}}) {
    cases.push_back(RunCase(**engine, layers, e, r));
  }
  const CaseResult single = RunSingleCoreWarm(layers[0], eo, po.cpus.empty() ? -1 : po.cpus.front());
  // DRAM: a buffer as large as the working set (at least 1 GB), after the cases so that both
  // see the same machine state.
  const uint64_t dram_bytes = std::max<uint64_t>(working_set, uint64_t{1} << 30) / 4096 * 4096;
  double dram_gbps = 0;
  {
    std::unique_ptr<NumaRegion> buffer = *NumaRegion::Allocate(dram_bytes, kNoNumaNode);
    pool->Run([&](int t) {  // touch the pages from the reading threads
      const uint64_t slice = dram_bytes / threads;
      std::memset(buffer->data() + slice * t, 1, slice);
    });
    dram_gbps = MeasureReadBandwidth(buffer->data(), dram_bytes, 5, pool.get()) / 1e9;
  }

  std::string channel_model;
  absl::StatusOr<ChannelBenchResult> channel = absl::UnavailableError("skipped (--no-channel)");
  if (flags.channel) {
    // Unpin this thread (the client) so that the spawned worker inherits every CPU.
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c : cpus) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof(all), &all);
    channel = RunChannel(flags, threads, &channel_model);
  }

  const std::string isa_name(KernelIsaName(*isa));
  if (flags.json) {
    std::printf("{\"threads\": %d, \"isa\": \"%s\", \"experts\": \"%s\", \"working_set_bytes\": %llu, "
                "\"dram_read_gbps\": %.3f, \"cases\": [",
                threads, isa_name.c_str(), source.c_str(), static_cast<unsigned long long>(working_set), dram_gbps);
    for (size_t i = 0; i < cases.size(); ++i) {
      const CaseResult& c = cases[i];
      std::printf("%s{\"experts\": %d, \"rows_per_expert\": %d, \"requests\": %d, \"weight_bytes_per_request\": %.0f, "
                  "\"p50_us\": %.1f, \"weight_gbps\": %.3f, \"fraction_of_dram\": %.3f, \"effective_gbps\": %.3f, "
                  "\"effective_fraction_of_dram\": %.3f}",
                  i ? ", " : "", c.experts, c.rows, c.requests, c.weight_bytes, c.p50_us, c.weight_gbps,
                  c.weight_gbps / dram_gbps, c.effective_gbps, c.effective_gbps / dram_gbps);
    }
    std::printf("], \"single_core_warm\": {\"experts\": 1, \"rows_per_expert\": 1, \"requests\": %d, "
                "\"weight_bytes_per_request\": %.0f, \"median_us\": %.2f, \"weight_gbps\": %.3f}",
                single.requests, single.weight_bytes, single.p50_us, single.weight_gbps);
    if (channel.ok()) {
      auto j = [](const char* name, const LatencySummary& s) {
        std::printf(", \"%s\": {\"samples\": %d, \"p50_us\": %.2f, \"p99_us\": %.2f, \"max_us\": %.2f, "
                    "\"worker_us\": %.2f}", name, s.samples, s.p50_us, s.p99_us, s.max_us, s.mean_worker_compute_us);
      };
      std::printf(", \"channel\": {\"model\": \"%s\"", channel_model.c_str());
      j("empty_spinning", channel->empty_spinning);
      j("decode_spinning", channel->decode_spinning);
      j("wake_from_sleep", channel->wake_from_sleep);
      std::printf("}");
    } else {
      std::printf(", \"channel_note\": \"%s\"", std::string(channel.status().message()).c_str());
    }
    std::printf("}\n");
    return 0;
  }
  std::printf("tandem bench worker: %d threads (CPUs %s), kernels %s\n", threads,
              po.cpus.empty() ? "unpinned" : absl::StrCat(po.cpus.front(), "-", po.cpus.back()).c_str(),
              isa_name.c_str());
  std::printf("experts: %s, %.2f GB working set\n", source.c_str(), working_set / 1e9);
  std::printf("DRAM read bandwidth (same threads, %.2f GB buffer): %.2f GB/s\n\n", dram_bytes / 1e9, dram_gbps);
  std::printf("%-22s %9s %9s %11s %8s %15s %8s\n", "request", "MB/req", "p50 us", "weights GB/s", "of DRAM",
              "x rows GB/s", "of DRAM");
  for (const CaseResult& c : cases) {
    std::printf("%-22s %9.2f %9.1f %11.2f %8.2f %15.2f %8.2f\n",
                absl::StrCat(c.experts, " experts x ", c.rows, c.rows == 1 ? " row" : " rows").c_str(),
                c.weight_bytes / 1e6, c.p50_us, c.weight_gbps, c.weight_gbps / dram_gbps, c.effective_gbps,
                c.effective_gbps / dram_gbps);
  }
  std::printf("single core, warm cache: 1 expert x 1 row, %.2f MB in %.2f us (median), %.2f GB/s of weights per core\n\n",
              single.weight_bytes / 1e6, single.p50_us, single.weight_gbps);
  if (channel.ok()) {
    std::printf("channel round trips with tandem-host-worker (%s):\n", channel_model.c_str());
    auto line = [](const char* what, const LatencySummary& s) {
      std::printf("  %-34s n=%6d  p50 %8.2f us  p99 %8.2f us  max %9.2f us  worker %8.2f us\n", what,
                  s.samples, s.p50_us, s.p99_us, s.max_us, s.mean_worker_compute_us);
    };
    line("empty request, worker spinning", channel->empty_spinning);
    line("decode-shaped request, spinning", channel->decode_spinning);
    line("empty request, worker asleep", channel->wake_from_sleep);
  } else {
    std::printf("channel round trips: not measured: %s\n", std::string(channel.status().message()).c_str());
  }
  return 0;
}

}  // namespace tandem
