// The request a Tandem host expert worker serves, run on ggml's CPU backend (llama.cpp's CPU
// kernels) instead, for a side-by-side figure with `tandem bench worker`:
//   per (expert, row) pair: down_e · (SiLU(gate_e · x) ⊙ up_e · x)
// at Qwen3-Next-80B-A3B expert shapes (h = 2048, I = 512, Q4_K gate/up/down, 64 experts per layer),
// as ggml_mul_mat_id(gate) and (up), ggml_swiglu_split, ggml_mul_mat_id(down) (what llama.cpp's
// MoE FFN builds, without the router and the weighted sum over experts, which the worker does
// not do either), computed by ggml_backend_graph_compute on a persistent ggml thread pool.
//
// Measured like `tandem bench worker` (host_expert_worker/bench/bench_command.cc): synthetic
// random Q4_K blocks (d = 0.002, dmin = 0.001) filling `--gb` GB of 64-expert layers; request i
// uses layer i mod L and experts (7 i + e * 64 / K) mod 64, e < K, so its weights were last
// touched hundreds of MB earlier and come from DRAM; 3 warm-up requests, then at least 20
// requests and 1.5 s; "weights GB/s" = K x one expert's weight bytes x requests / total compute
// time (only ggml_backend_graph_compute is timed; graph allocation and input upload are not).
//
// Layouts: "plain" keeps ggml's block_q4_K rows in a CPU buffer (ggml_vec_dot_q4_K_q8_K);
// "repack" puts them in the CPU backend's extra buffer type CPU_REPACK (interleaved 8-row
// block_q4_Kx8 with the GEMV/GEMM kernels), which llama.cpp uses for CPU weights by default when
// the CPU has it (AVX2 and up for Q4_K). Both layouts are computed from the same bytes, and the
// first request of each case is compared (relative L2 of the outputs) as a sanity check.
//
//   ggml_expert_bench [--threads N] [--gb G] [--layout plain|repack|both] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

constexpr int64_t kHidden = 2048, kInner = 512, kExperts = 64;
constexpr size_t kQ4KBlockBytes = 144;  // f16 d, f16 dmin, 12 scale bytes, 128 quant bytes

struct Flags {
  int threads = 16;
  double gb = 4.0;
  std::string layout = "both";
  bool json = false;
};

struct Layer {
  ggml_tensor* gate = nullptr;  // {h, I, E}
  ggml_tensor* up = nullptr;    // {h, I, E}
  ggml_tensor* down = nullptr;  // {I, h, E}
};

struct WeightSet {
  std::string name;
  ggml_context* ctx = nullptr;
  ggml_backend_buffer_t buffer = nullptr;
  std::vector<Layer> layers;
};

struct CaseResult {
  int experts = 0, rows = 0, requests = 0;
  double weight_bytes = 0, p50_us = 0, weight_gbps = 0;
  std::vector<float> first_output;
};

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "ggml_expert_bench: %s\n", what);
  std::exit(1);
}

// xorshift bytes (any bytes are valid Q4_K quants and scales), then every block's d / dmin set to
// small normal f16 values so the outputs stay finite; the same recipe as tandem bench worker.
void FillQ4K(uint8_t* p, size_t bytes, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    std::memcpy(p + i, &s, 8);
  }
  const ggml_fp16_t d = ggml_fp32_to_fp16(0.002f), dmin = ggml_fp32_to_fp16(0.001f);
  for (size_t b = 0; b < bytes / kQ4KBlockBytes; ++b) {
    std::memcpy(p + b * kQ4KBlockBytes, &d, 2);
    std::memcpy(p + b * kQ4KBlockBytes + 2, &dmin, 2);
  }
}

// Runs fn(i) for i < n on `threads` threads.
template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn fn) {
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) fn(i);
    });
  }
  for (std::thread& th : team) th.join();
}

WeightSet MakeWeights(const std::string& name, ggml_backend_buffer_type_t buft, int layers) {
  WeightSet w;
  w.name = name;
  ggml_init_params params = {static_cast<size_t>(3 * layers + 8) * ggml_tensor_overhead(), nullptr, true};
  w.ctx = ggml_init(params);
  for (int l = 0; l < layers; ++l) {
    Layer layer;
    layer.gate = ggml_new_tensor_3d(w.ctx, GGML_TYPE_Q4_K, kHidden, kInner, kExperts);
    layer.up = ggml_new_tensor_3d(w.ctx, GGML_TYPE_Q4_K, kHidden, kInner, kExperts);
    layer.down = ggml_new_tensor_3d(w.ctx, GGML_TYPE_Q4_K, kInner, kHidden, kExperts);
    w.layers.push_back(layer);
  }
  w.buffer = ggml_backend_alloc_ctx_tensors_from_buft(w.ctx, buft);
  if (w.buffer == nullptr) Die("could not allocate the weights");
  ggml_backend_buffer_set_usage(w.buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  return w;
}

// Fills the plain set in place (host memory), one piece per expert matrix, in parallel.
void FillPlain(WeightSet& w, int threads) {
  std::vector<ggml_tensor*> tensors;
  for (Layer& l : w.layers) tensors.insert(tensors.end(), {l.gate, l.up, l.down});
  ParallelFor(static_cast<int64_t>(tensors.size()) * kExperts, threads, [&](int64_t i) {
    ggml_tensor* t = tensors[i / kExperts];
    const size_t slice = ggml_nbytes(t) / kExperts;
    FillQ4K(static_cast<uint8_t*>(t->data) + (i % kExperts) * slice, slice, static_cast<uint64_t>(i) + 1);
  });
}

// Copies the plain set's bytes into the repack set (ggml_backend_tensor_set converts them to
// the interleaved layout), one tensor per task.
void CopyInto(const WeightSet& from, WeightSet& to, int threads) {
  std::vector<std::pair<ggml_tensor*, ggml_tensor*>> pairs;
  for (size_t l = 0; l < from.layers.size(); ++l) {
    pairs.push_back({from.layers[l].gate, to.layers[l].gate});
    pairs.push_back({from.layers[l].up, to.layers[l].up});
    pairs.push_back({from.layers[l].down, to.layers[l].down});
  }
  ParallelFor(static_cast<int64_t>(pairs.size()), threads, [&](int64_t i) {
    ggml_backend_tensor_set(pairs[i].second, pairs[i].first->data, 0, ggml_nbytes(pairs[i].first));
  });
}

double ExpertBytes(const Layer& l) {
  return static_cast<double>(ggml_nbytes(l.gate) + ggml_nbytes(l.up) + ggml_nbytes(l.down)) / kExperts;
}

CaseResult RunCase(ggml_backend_t backend, const WeightSet& w, int experts, int rows) {
  const int layers = static_cast<int>(w.layers.size());
  // One graph per layer, sharing the inputs; intermediates allocated per request by one gallocr.
  ggml_init_params params = {ggml_tensor_overhead() * static_cast<size_t>(16 * layers + 16) +
                                 ggml_graph_overhead() * static_cast<size_t>(layers),
                             nullptr, true};
  ggml_context* ctx = ggml_init(params);
  std::vector<ggml_cgraph*> graphs;
  std::vector<ggml_tensor*> xs, idss, outs;
  for (int l = 0; l < layers; ++l) {
    ggml_tensor* x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, kHidden, 1, rows);
    ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, experts, rows);
    ggml_set_input(x);
    ggml_set_input(ids);
    ggml_tensor* g = ggml_mul_mat_id(ctx, w.layers[l].gate, x, ids);  // {I, K, rows}
    ggml_tensor* u = ggml_mul_mat_id(ctx, w.layers[l].up, x, ids);
    ggml_tensor* a = ggml_swiglu_split(ctx, g, u);                     // SiLU(g) * u
    ggml_tensor* y = ggml_mul_mat_id(ctx, w.layers[l].down, a, ids);  // {h, K, rows}
    ggml_set_output(y);
    ggml_cgraph* graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, y);
    graphs.push_back(graph);
    xs.push_back(x);
    idss.push_back(ids);
    outs.push_back(y);
  }
  ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
  if (!ggml_gallocr_reserve(galloc, graphs[0])) Die("gallocr reserve failed");

  std::vector<float> x(static_cast<size_t>(rows) * kHidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
  std::vector<int32_t> ids(static_cast<size_t>(rows) * experts);
  CaseResult r;
  r.experts = experts;
  r.rows = rows;
  r.weight_bytes = ExpertBytes(w.layers[0]) * experts;
  std::vector<double> us;
  double total_us = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  for (int i = 0; i < 4 || elapsed < 1.5 || us.size() < 20; ++i) {
    const int l = i % layers;
    for (int e = 0; e < experts; ++e) {
      const int32_t expert = static_cast<int32_t>((i * 7 + e * (kExperts / experts)) % kExperts);
      for (int row = 0; row < rows; ++row) ids[static_cast<size_t>(row) * experts + e] = expert;
    }
    if (!ggml_gallocr_alloc_graph(galloc, graphs[l])) Die("gallocr alloc failed");
    ggml_backend_tensor_set(xs[l], x.data(), 0, x.size() * sizeof(float));
    ggml_backend_tensor_set(idss[l], ids.data(), 0, ids.size() * sizeof(int32_t));
    const auto t0 = std::chrono::steady_clock::now();
    if (ggml_backend_graph_compute(backend, graphs[l]) != GGML_STATUS_SUCCESS) Die("graph compute failed");
    const auto t1 = std::chrono::steady_clock::now();
    if (i == 0) {
      r.first_output.resize(ggml_nelements(outs[l]));
      ggml_backend_tensor_get(outs[l], r.first_output.data(), 0, ggml_nbytes(outs[l]));
    }
    if (i >= 3) {
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      total_us += us.back();
    }
    elapsed = std::chrono::duration<double>(t1 - start).count();
  }
  r.requests = static_cast<int>(us.size());
  std::sort(us.begin(), us.end());
  r.p50_us = us[us.size() / 2];
  r.weight_gbps = r.weight_bytes * r.requests / (total_us * 1e-6) / 1e9;
  ggml_gallocr_free(galloc);
  ggml_free(ctx);
  return r;
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

ggml_backend_buffer_type_t FindRepackBufferType() {
  ggml_backend_reg_t reg = ggml_backend_cpu_reg();
  auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  if (get == nullptr) return nullptr;
  for (ggml_backend_buffer_type_t* b = get(ggml_backend_reg_dev_get(reg, 0)); b != nullptr && *b != nullptr; ++b) {
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      flags.json = true;
    } else if (a == "--threads" && i + 1 < argc) {
      flags.threads = std::atoi(argv[++i]);
    } else if (a == "--gb" && i + 1 < argc) {
      flags.gb = std::atof(argv[++i]);
    } else if (a == "--layout" && i + 1 < argc) {
      flags.layout = argv[++i];
    } else {
      std::fprintf(stderr, "usage: ggml_expert_bench [--threads N] [--gb G] [--layout plain|repack|both] [--json]\n");
      return 2;
    }
  }
  if (flags.threads < 1 || flags.gb <= 0 ||
      (flags.layout != "plain" && flags.layout != "repack" && flags.layout != "both")) {
    Die("bad --threads, --gb or --layout");
  }
  // Quiet: the repack buffer logs one line per tensor it converts.
  ggml_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
  }, nullptr);
  ggml_cpu_init();
  const double layer_bytes = 3.0 * kHidden * kInner / 256 * kQ4KBlockBytes * kExperts;
  const int layers = std::max(2, static_cast<int>(flags.gb * 1e9 / layer_bytes + 0.5));

  ggml_backend_t backend = ggml_backend_cpu_init();
  ggml_threadpool_params tpp = ggml_threadpool_params_default(flags.threads);
  ggml_threadpool_t pool = ggml_threadpool_new(&tpp);
  ggml_backend_cpu_set_n_threads(backend, flags.threads);
  ggml_backend_cpu_set_threadpool(backend, pool);

  std::vector<WeightSet> sets;
  sets.push_back(MakeWeights("plain", ggml_backend_cpu_buffer_type(), layers));
  FillPlain(sets[0], flags.threads);
  if (flags.layout != "plain") {
    ggml_backend_buffer_type_t repack = FindRepackBufferType();
    if (repack == nullptr) Die("this ggml build has no CPU_REPACK buffer type");
    sets.push_back(MakeWeights("repack", repack, layers));
    CopyInto(sets[0], sets[1], flags.threads);
  }
  if (flags.layout == "repack") {  // keep the plain bytes only as the source
    ggml_backend_buffer_free(sets[0].buffer);
    ggml_free(sets[0].ctx);
    sets.erase(sets.begin());
  }
  const double working_set = layer_bytes * layers;
  const char* sys = ggml_cpu_has_avx512_vnni() ? "avx512 vnni" : (ggml_cpu_has_avx2() ? "avx2" : "other");

  if (!flags.json) {
    std::printf("ggml_expert_bench: %d threads (ggml thread pool), ggml CPU backend (%s), %.2f GB working set "
                "(%d layers x 64 q4_K experts h=%lld I=%lld)\n\n",
                flags.threads, sys, working_set / 1e9, layers, static_cast<long long>(kHidden),
                static_cast<long long>(kInner));
    std::printf("%-7s %-22s %9s %9s %12s %15s %s\n", "layout", "request", "MB/req", "p50 us", "weights GB/s",
                "x rows GB/s", "requests");
  } else {
    std::printf("{\"threads\": %d, \"working_set_bytes\": %.0f, \"cases\": [", flags.threads, working_set);
  }
  bool first = true;
  std::vector<std::vector<float>> reference;  // first set's first outputs, per case
  for (size_t s = 0; s < sets.size(); ++s) {
    int c = 0;
    for (auto [e, r] : {std::pair{10, 1}, std::pair{10, 8}, std::pair{64, 4}}) {
      CaseResult res = RunCase(backend, sets[s], e, r);
      double diff = -1;
      if (s == 0) {
        reference.push_back(res.first_output);
      } else {
        diff = RelativeL2(res.first_output, reference[c]);
      }
      const std::string name = std::to_string(e) + " experts x " + std::to_string(r) + (r == 1 ? " row" : " rows");
      if (flags.json) {
        std::printf("%s{\"layout\": \"%s\", \"experts\": %d, \"rows_per_expert\": %d, \"requests\": %d, "
                    "\"weight_bytes_per_request\": %.0f, \"p50_us\": %.1f, \"weight_gbps\": %.3f, "
                    "\"effective_gbps\": %.3f, \"rel_l2_vs_plain\": %.3g}",
                    first ? "" : ", ", sets[s].name.c_str(), e, r, res.requests, res.weight_bytes, res.p50_us,
                    res.weight_gbps, res.weight_gbps * r, diff);
      } else {
        std::printf("%-7s %-22s %9.2f %9.1f %12.2f %15.2f %d", sets[s].name.c_str(), name.c_str(),
                    res.weight_bytes / 1e6, res.p50_us, res.weight_gbps, res.weight_gbps * r, res.requests);
        if (diff >= 0) std::printf("  (rel L2 vs plain %.2g)", diff);
        std::printf("\n");
      }
      first = false;
      ++c;
    }
  }
  if (flags.json) std::printf("]}\n");
  for (WeightSet& w : sets) {
    ggml_backend_buffer_free(w.buffer);
    ggml_free(w.ctx);
  }
  ggml_backend_free(backend);
  ggml_threadpool_free(pool);
  return 0;
}
