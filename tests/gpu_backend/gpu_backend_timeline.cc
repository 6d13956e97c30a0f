// A kernel timeline of the CUDA backend's steps as they really run (not a test): CUPTI's Activity
// API records every kernel, memcpy and memset (start, end, stream, correlation id, graph node id,
// grid and block) of N batch-1 decode steps replayed as CUDA graphs after warm-up, and optionally
// of one prefill step. Nsight Compute serializes kernels and the backend's stage profile runs steps
// without graphs; this shows a replayed step's critical path, the gaps between dependent kernels
// (negative where programmatic dependent launch overlaps a kernel with its predecessor's tail),
// side-stream joins, and the time when nothing runs. The analysis (tests/timeline/) is plain C++
// and tested on the CPU; this file only collects.
//
// Graph dependencies: a resource callback queries each captured graph's edges (with their PDL
// type) when it is instantiated, and maps the executable graph's cloned node ids (what activity
// records carry) back to the captured graph's node ids. --edges off skips the query (then joins are
// inferred from times; see timeline_analysis.h).
//
// Tracing costs: the step time is printed untraced and traced (host wall time of N steps over N,
// as gpu_backend_bench times decode), so the distortion is known. --trace-from warm (the default)
// enables activity tracing after the decode graph is captured, with the untraced timing before it;
// if CUPTI then reports no graph kernels, rerun with --trace-from open (tracing on before the
// backend opens; the untraced timing comes after tracing is switched off).
//
//   gpu_backend_timeline --model q3n-80b.gguf | --preset small   [--steps 32] [--prefill 512] [--out DIR]
//                        [--mode fast|exact] [--pdl on|off] [--edges on|off] [--trace-from warm|open]
//                        [--top 25]
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "tests/gpu_backend/backend_test_util.h"
#include "tests/gpu_backend/bench_args.h"
#include "tests/timeline/timeline_analysis.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
namespace tl = timeline;

struct Args {
  std::string model;
  std::string preset;  // a generated test model (backend_test_util.h), for a quick first run
  int steps = 32;
  int prefill = 0;
  std::string out;
  std::string mode = "fast";
  bool pdl = true;
  bool edges = true;
  bool trace_from_open = false;
  int top = 25;
};

absl::Status Cupti(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return absl::OkStatus();
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return absl::InternalError(absl::StrCat(what, ": ", s != nullptr ? s : "unknown CUPTI error"));
}
#define TIMELINE_RETURN_IF_ERROR(expr) \
  do {                                 \
    absl::Status s_ = (expr);          \
    if (!s_.ok()) return s_;           \
  } while (0)

// What the CUPTI callbacks gather (they run on CUDA's and CUPTI's threads).
struct Collected {
  std::mutex mu;
  std::vector<tl::Record> records;
  std::set<std::pair<uint64_t, uint64_t>> edge_set;  // (from, to), captured-graph node ids
  std::vector<tl::Edge> edges;
  std::unordered_map<uint64_t, uint64_t> clone_to_original;
  size_t queried_edges = 0, callback_edges = 0, edge_query_errors = 0, graphs_instantiated = 0;
  size_t dropped = 0;
  bool query_edges = true;
};
Collected* g = nullptr;

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && d != nullptr ? std::string(d.get()) : std::string(name);
}

void AddEdge(uint64_t from, uint64_t to, bool pdl, bool queried) {
  std::lock_guard<std::mutex> l(g->mu);
  if (!g->edge_set.insert({from, to}).second) {
    if (pdl) {
      for (tl::Edge& e : g->edges) {
        if (e.from == from && e.to == to) e.programmatic = true;
      }
    }
    return;
  }
  g->edges.push_back({from, to, pdl});
  ++(queried ? g->queried_edges : g->callback_edges);
}

// The captured graph's edges, read while it is being instantiated (the backend destroys it right
// after). A CUDA runtime query from inside a CUPTI resource callback: --edges off avoids it.
void QueryEdges(CUgraph graph) {
  size_t n = 0;
  if (cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n) != cudaSuccess) {
    cudaGetLastError();
    std::lock_guard<std::mutex> l(g->mu);
    ++g->edge_query_errors;
    return;
  }
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0 && cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n) != cudaSuccess) {
    cudaGetLastError();
    std::lock_guard<std::mutex> l(g->mu);
    ++g->edge_query_errors;
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint64_t f = 0, t = 0;
    if (cuptiGetGraphNodeId(from[i], &f) != CUPTI_SUCCESS || cuptiGetGraphNodeId(to[i], &t) != CUPTI_SUCCESS) continue;
    AddEdge(f, t, data[i].type == cudaGraphDependencyTypeProgrammatic, true);
  }
}

void CUPTIAPI OnResource(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata) {
  if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
  const auto* rd = static_cast<const CUpti_ResourceData*>(cbdata);
  const auto* gd = static_cast<const CUpti_GraphData*>(rd->resourceDescriptor);
  if (gd == nullptr) return;
  switch (cbid) {
    case CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED: {
      uint64_t clone = 0, original = 0;
      if (cuptiGetGraphNodeId(gd->node, &clone) == CUPTI_SUCCESS &&
          cuptiGetGraphNodeId(gd->originalNode, &original) == CUPTI_SUCCESS) {
        std::lock_guard<std::mutex> l(g->mu);
        g->clone_to_original[clone] = original;
      }
      break;
    }
    case CUPTI_CBID_RESOURCE_GRAPHNODE_DEPENDENCY_CREATED: {
      uint64_t node = 0, dep = 0;
      if (cuptiGetGraphNodeId(gd->node, &node) == CUPTI_SUCCESS &&
          cuptiGetGraphNodeId(gd->dependency, &dep) == CUPTI_SUCCESS) {
        AddEdge(dep, node, false, false);
      }
      break;
    }
    case CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATE_STARTING: {
      {
        std::lock_guard<std::mutex> l(g->mu);
        ++g->graphs_instantiated;
      }
      if (g->query_edges && gd->graph != nullptr) QueryEdges(gd->graph);
      break;
    }
    default:
      break;
  }
}

constexpr size_t kBufferBytes = size_t{16} << 20;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::vector<tl::Record> got;
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    tl::Record r;
    if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      r.kind = tl::Kind::kKernel;
      r.name = Demangle(k->name);
      r.short_name = tl::ShortKernelName(r.name);
      r.start = k->start, r.end = k->end, r.stream = k->streamId, r.correlation = k->correlationId;
      r.graph_id = k->graphId, r.graph_node = k->graphNodeId;
      r.grid[0] = k->gridX, r.grid[1] = k->gridY, r.grid[2] = k->gridZ;
      r.block[0] = k->blockX, r.block[1] = k->blockY, r.block[2] = k->blockZ;
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      static const char* kinds[] = {"?",    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                    "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
      r.kind = tl::Kind::kMemcpy;
      r.name = r.short_name = absl::StrCat("memcpy ", m->copyKind < 11 ? kinds[m->copyKind] : "?");
      r.start = m->start, r.end = m->end, r.stream = m->streamId, r.correlation = m->correlationId;
      r.graph_id = m->graphId, r.graph_node = m->graphNodeId, r.bytes = m->bytes;
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
      r.kind = tl::Kind::kMemset;
      r.name = r.short_name = "memset";
      r.start = m->start, r.end = m->end, r.stream = m->streamId, r.correlation = m->correlationId;
      r.graph_id = m->graphId, r.graph_node = m->graphNodeId, r.bytes = m->bytes;
    } else {
      continue;
    }
    got.push_back(std::move(r));
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> l(g->mu);
  g->dropped += dropped;
  for (tl::Record& r : got) g->records.push_back(std::move(r));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

absl::Status EnableTracing(bool on) {
  for (CUpti_ActivityKind k : kKinds) {
    TIMELINE_RETURN_IF_ERROR(Cupti(on ? cuptiActivityEnable(k) : cuptiActivityDisable(k), "cuptiActivityEnable"));
  }
  return absl::OkStatus();
}

uint64_t Now() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

// The records of the windows, graph node ids mapped back to the captured graphs' ids.
std::vector<std::vector<tl::Record>> TakeSteps(const std::vector<tl::Window>& windows) {
  std::lock_guard<std::mutex> l(g->mu);
  size_t with_node = 0, mapped = 0;
  for (tl::Record& r : g->records) {
    with_node += r.graph_node != 0;
    if (auto it = g->clone_to_original.find(r.graph_node); it != g->clone_to_original.end()) {
      r.graph_node = it->second;
      ++mapped;
    }
  }
  printf("cupti: %zu records, %zu with a graph node id, %zu of those mapped to a captured node\n", g->records.size(),
         with_node, mapped);
  auto steps = tl::SplitSteps(g->records, windows);
  g->records.clear();
  return steps;
}

void WriteCsv(FILE* f, const std::string& label, const std::vector<tl::Record>& recs, const tl::StepAnalysis& a) {
  std::vector<const tl::PathStep*> on(recs.size(), nullptr);
  for (const tl::PathStep& p : a.path) on[p.record] = &p;
  for (size_t i = 0; i < recs.size(); ++i) {
    const tl::Record& r = recs[i];
    std::string name = r.name;
    for (char& c : name) c = c == '"' ? '\'' : c;
    fprintf(f, "%s,%zu,%s,%.3f,%.3f,%u,%u,%u,%llu,%dx%dx%d,%dx%dx%d,%llu,%d,%s,%.3f,\"%s\",\"%s\"\n", label.c_str(), i,
            r.kind == tl::Kind::kKernel   ? "kernel"
            : r.kind == tl::Kind::kMemcpy ? "memcpy"
                                          : "memset",
            1e-3 * static_cast<double>(r.start - a.first_start), 1e-3 * static_cast<double>(r.end - r.start), r.stream,
            r.correlation, r.graph_id, static_cast<unsigned long long>(r.graph_node), r.grid[0], r.grid[1], r.grid[2],
            r.block[0], r.block[1], r.block[2], static_cast<unsigned long long>(r.bytes), on[i] != nullptr ? 1 : 0,
            on[i] != nullptr ? tl::LinkCauseName(on[i]->cause) : "", on[i] != nullptr ? 1e-3 * on[i]->gap_ns : 0.0,
            r.short_name.c_str(), name.c_str());
  }
}

int Run(const Args& a) {
  // Never freed: CUPTI may hand back a buffer as late as the process's exit.
  g = new Collected;
  Collected& collected = *g;
  collected.query_edges = a.edges;
  // Callbacks before the backend opens: the graph callbacks fire when the decode graph is
  // instantiated (the first steps).
  CUpti_SubscriberHandle sub = nullptr;
  absl::Status st = Cupti(cuptiSubscribe(&sub, OnResource, nullptr), "cuptiSubscribe");
  for (CUpti_CallbackId id : {CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED, CUPTI_CBID_RESOURCE_GRAPHNODE_DEPENDENCY_CREATED,
                              CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATE_STARTING}) {
    if (st.ok()) st = Cupti(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, id), "cuptiEnableCallback");
  }
  if (st.ok())
    st = Cupti(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "cuptiActivityRegisterCallbacks");
  if (st.ok() && a.trace_from_open) st = EnableTracing(true);
  if (!st.ok()) {
    fprintf(stderr, "cupti: %s\n", st.ToString().c_str());
    return 1;
  }

  std::string model = a.model;
  if (!a.preset.empty()) {
    absl::StatusOr<std::string> p = gpu_backend_testing::PresetModel(a.preset);
    if (!p.ok()) {
      fprintf(stderr, "%s: %s\n", a.preset.c_str(), p.status().ToString().c_str());
      return 1;
    }
    model = *p;
  }
  CudaBackendOptions o;
  o.mode = a.mode == "exact" ? CudaMode::kExact : CudaMode::kFast;
  o.pdl = a.pdl;
  o.max_batch_tokens = std::max(1, a.prefill);
  o.max_sequences = 2;
  o.max_context = std::max(a.prefill, 3 * a.steps + 16) + 8;
  o.kv_pages = (o.max_context + 63) / 64 * 2 + 2;
  absl::StatusOr<std::unique_ptr<CudaBackend>> opened = CudaBackend::Open(model, o);
  if (!opened.ok()) {
    fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  CudaBackend& b = **opened;
  const ModelConfig& c = b.config();
  printf("model: %s, %lld layers; mode %s, PDL %s; graph edges %s; tracing from %s\n", c.name.c_str(),
         static_cast<long long>(c.n_layers), a.mode.c_str(), a.pdl ? "on" : "off", a.edges ? "queried" : "not queried",
         a.trace_from_open ? "open" : "after warm-up");
  std::mt19937 rng(7);
  // The logits in page-locked memory, as gpu_backend_bench passes them (the backend copies the head's
  // rows straight into it; a pageable buffer would add the staged copy and a host copy to each step).
  absl::StatusOr<cuda::PinnedBuffer> logits_buffer =
      cuda::PinnedBuffer::Allocate(static_cast<size_t>(c.vocab) * sizeof(float));
  if (!logits_buffer.ok()) {
    fprintf(stderr, "logits: %s\n", logits_buffer.status().ToString().c_str());
    return 1;
  }
  float* const logits = logits_buffer->as<float>();
  absl::StatusOr<SequenceSlot> slot = b.CreateSequence();
  if (!slot.ok()) {
    fprintf(stderr, "%s\n", slot.status().ToString().c_str());
    return 1;
  }
  auto step = [&]() -> absl::Status {
    const int32_t tok = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab));
    Backend::StepInput in{*slot, std::span<const int32_t>(&tok, 1), logits, false, false};
    return b.Step(std::span<const Backend::StepInput>(&in, 1));
  };
  // N steps timed as gpu_backend_bench times decode; with `windows`, each step's CUPTI-clock window.
  auto timed = [&](int n, std::vector<tl::Window>* windows) -> absl::StatusOr<double> {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      const uint64_t w0 = windows != nullptr ? Now() : 0;
      TIMELINE_RETURN_IF_ERROR(step());
      if (windows != nullptr) windows->push_back({w0, Now()});
    }
    return 1e3 * std::chrono::duration<double>(Clock::now() - t0).count() / n;
  };
  auto fail = [](const absl::Status& s) {
    fprintf(stderr, "decode: %s\n", s.ToString().c_str());
    return 1;
  };
  // The edge query runs inside CUPTI's callback during the graph's instantiation; should that ever
  // hang, say so and exit 3 rather than wait for the caller's timeout (timeline_80b.sh then runs
  // again with --edges off).
  std::atomic<bool> captured{false};
  std::thread watchdog([&captured, edges = a.edges] {
    for (int i = 0; i < 1800 && !captured.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!captured.load()) {
      fprintf(stderr, "the first decode steps took over 180 s%s\n",
              edges ? ": the graph edge query may hang; rerun with --edges off" : "");
      fflush(stderr);
      _exit(3);
    }
  });
  absl::StatusOr<double> warm = timed(3, nullptr);  // capture, first uses
  captured = true;
  watchdog.join();
  if (!warm.ok()) return fail(warm.status());
  absl::StatusOr<double> untraced = 0.0;
  if (!a.trace_from_open) {
    untraced = timed(a.steps, nullptr);
    if (!untraced.ok()) return fail(untraced.status());
    if (absl::Status s = EnableTracing(true); !s.ok()) return fail(s);
  }
  if (absl::StatusOr<double> w = timed(2, nullptr); !w.ok()) return fail(w.status());  // tracing's first costs
  std::vector<tl::Window> windows;
  absl::StatusOr<double> traced = timed(a.steps, &windows);
  if (!traced.ok()) return fail(traced.status());
  // Prefill: a warm-up, one untraced timed step (tracing off for it), then one traced step.
  std::vector<tl::Window> prefill_window;
  double prefill_untraced_ms = 0, prefill_traced_ms = 0;
  if (a.prefill > 0) {
    std::vector<int32_t> prompt(static_cast<size_t>(a.prefill));
    auto prefill = [&](std::vector<tl::Window>* w) -> absl::StatusOr<double> {
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab));
      absl::StatusOr<SequenceSlot> s = b.CreateSequence();
      if (!s.ok()) return s.status();
      Backend::StepInput in{*s, prompt, logits, false, false};
      const uint64_t w0 = Now();
      const auto t0 = Clock::now();
      absl::Status r = b.Step(std::span<const Backend::StepInput>(&in, 1));
      const double ms = 1e3 * std::chrono::duration<double>(Clock::now() - t0).count();
      if (w != nullptr) w->push_back({w0, Now()});
      b.ReleaseSequence(*s);
      if (!r.ok()) return r;
      return ms;
    };
    absl::StatusOr<double> p = prefill(nullptr);
    if (p.ok()) p = (EnableTracing(false).ok() ? prefill(nullptr) : absl::InternalError("tracing off"));
    if (p.ok()) prefill_untraced_ms = *p;
    if (p.ok()) p = EnableTracing(true).ok() ? prefill(&prefill_window) : absl::InternalError("tracing on");
    if (!p.ok()) {
      fprintf(stderr, "prefill: %s\n", p.status().ToString().c_str());
      return 1;
    }
    prefill_traced_ms = *p;
  }
  if (absl::Status s = Cupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = EnableTracing(false); !s.ok()) return fail(s);
  if (a.trace_from_open) {
    untraced = timed(a.steps, nullptr);
    if (!untraced.ok()) return fail(untraced.status());
  }
  std::vector<tl::Window> all = windows;
  all.insert(all.end(), prefill_window.begin(), prefill_window.end());
  std::vector<std::vector<tl::Record>> steps = TakeSteps(all);
  std::vector<tl::Edge> edges;
  {
    std::lock_guard<std::mutex> l(collected.mu);
    edges = collected.edges;
    printf(
        "cupti: %zu graphs instantiated, %zu edges queried, %zu from dependency callbacks, %zu query errors, "
        "%zu cloned nodes mapped, %zu records dropped\n",
        collected.graphs_instantiated, collected.queried_edges, collected.callback_edges, collected.edge_query_errors,
        collected.clone_to_original.size(), collected.dropped);
  }
  std::vector<std::vector<tl::Record>> prefill_steps;
  if (a.prefill > 0) {
    prefill_steps.push_back(std::move(steps.back()));
    steps.pop_back();
  }
  size_t graph_kernels = 0;
  for (const auto& s : steps) {
    for (const tl::Record& r : s) graph_kernels += r.kind == tl::Kind::kKernel && r.graph_id != 0;
  }
  printf("decode batch 1: %.4f ms/step untraced, %.4f ms/step traced (%+.1f%%), %d steps each\n", *untraced, *traced,
         100.0 * (*traced / *untraced - 1.0), a.steps);
  if (graph_kernels == 0) {
    printf("no kernel records from graph launches in the traced decode steps%s\n",
           a.trace_from_open ? "" : ": rerun with --trace-from open");
  }

  FILE* csv = nullptr;
  FILE* steps_csv = nullptr;
  if (!a.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);
    csv = fopen((a.out + "/timeline_records.csv").c_str(), "w");
    steps_csv = fopen((a.out + "/timeline_steps.csv").c_str(), "w");
    FILE* ef = fopen((a.out + "/timeline_edges.csv").c_str(), "w");
    if (csv == nullptr || steps_csv == nullptr || ef == nullptr) {
      fprintf(stderr, "cannot write under %s\n", a.out.c_str());
      return 1;
    }
    fprintf(csv,
            "step,index,kind,start_us,dur_us,stream,correlation,graph_id,graph_node,grid,block,bytes,on_path,link,"
            "gap_before_us,short_name,name\n");
    fprintf(steps_csv,
            "step,records,wall_us,busy_us,idle_us,no_kernel_us,main_stream,main_busy_us,path_busy_us,path_gap_us,"
            "path_overlap_us,path_len\n");
    fprintf(ef, "from,to,programmatic\n");
    for (const tl::Edge& e : edges) {
      fprintf(ef, "%llu,%llu,%d\n", static_cast<unsigned long long>(e.from), static_cast<unsigned long long>(e.to),
              e.programmatic ? 1 : 0);
    }
    fclose(ef);
  }
  auto report = [&](const std::string& title, const std::string& label,
                    const std::vector<std::vector<tl::Record>>& recs) {
    std::vector<tl::StepAnalysis> an;
    size_t median = 0;
    for (size_t i = 0; i < recs.size(); ++i) {
      an.push_back(tl::AnalyzeStep(recs[i], edges));
      const tl::StepAnalysis& x = an.back();
      if (csv != nullptr) {
        const std::string l = absl::StrCat(label, i);
        WriteCsv(csv, l, recs[i], x);
        fprintf(steps_csv, "%s,%zu,%.3f,%.3f,%.3f,%.3f,%u,%.3f,%.3f,%.3f,%.3f,%zu\n", l.c_str(), recs[i].size(),
                1e-3 * x.wall_ns, 1e-3 * x.union_busy_ns, 1e-3 * x.idle_ns, 1e-3 * x.no_kernel_ns, x.main_stream,
                1e-3 * x.main_busy_ns, 1e-3 * x.path_busy_ns, 1e-3 * x.path_gap_ns, 1e-3 * x.path_overlap_ns,
                x.path.size());
      }
    }
    std::vector<size_t> order(an.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return an[x].wall_ns < an[y].wall_ns; });
    if (!order.empty()) median = order[order.size() / 2];
    printf("\n## %s\n%s", title.c_str(), tl::Summary(an, recs, a.top).c_str());
    if (recs.empty() || recs[median].empty()) return;
    const tl::Layers layers = tl::FindLayers(recs[median], static_cast<int>(c.n_layers));
    if (layers.marker.empty()) {
      printf("layers: no kernel runs exactly %lld times in step %zu\n", static_cast<long long>(c.n_layers), median);
      return;
    }
    printf("layers of step %zu (the median wall time), cut at %s:\n", median, layers.marker.c_str());
    for (const tl::LayerKind& k : layers.kinds) printf("%s", tl::LayerTable(recs[median], layers, k).c_str());
  };
  report(absl::StrCat("decode batch 1 (graph replays): ", steps.size(), " steps"), "d", steps);
  if (a.prefill > 0) {
    printf("\nprefill %d: %.3f ms untraced, %.3f ms traced\n", a.prefill, prefill_untraced_ms, prefill_traced_ms);
    report(absl::StrCat("prefill ", a.prefill), "p", prefill_steps);
  }
  if (csv != nullptr) {
    fclose(csv);
    fclose(steps_csv);
  }
  b.ReleaseSequence(*slot);
  cuptiUnsubscribe(sub);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a redirected log even if a timeout kills the run
  tandem::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return tandem::NextArgValue(argc, argv, i, arg); };
    auto number = [&](int& out, int min) {
      const std::string v = value();
      if (!absl::SimpleAtoi(v, &out) || out < min) {
        fprintf(stderr, "%s: '%s' is not an integer >= %d\n", arg.c_str(), v.c_str(), min);
        exit(2);
      }
    };
    if (arg == "--model") {
      a.model = value();
    } else if (arg == "--preset") {
      a.preset = value();
    } else if (arg == "--steps") {
      number(a.steps, 1);
    } else if (arg == "--prefill") {
      number(a.prefill, 0);
    } else if (arg == "--top") {
      number(a.top, 1);
    } else if (arg == "--out") {
      a.out = value();
    } else if (arg == "--mode") {
      a.mode = value();
      if (a.mode != "fast" && a.mode != "exact") {
        fprintf(stderr, "--mode: '%s' is not fast or exact\n", a.mode.c_str());
        return 2;
      }
    } else if (arg == "--pdl") {
      if (!tandem::ParseChoice(arg, value(), "on", "off", a.pdl)) return 2;
    } else if (arg == "--edges") {
      if (!tandem::ParseChoice(arg, value(), "on", "off", a.edges)) return 2;
    } else if (arg == "--trace-from") {
      if (!tandem::ParseChoice(arg, value(), "open", "warm", a.trace_from_open)) return 2;
    } else {
      fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (a.model.empty() == a.preset.empty()) {
    fprintf(stderr,
            "usage: gpu_backend_timeline --model FILE.gguf | --preset NAME [--steps 32] [--prefill 512] [--out DIR] "
            "[--mode fast|exact] [--pdl on|off] [--edges on|off] [--trace-from warm|open] [--top 25]\n");
    return 2;
  }
  return tandem::Run(a);
}
