// Helpers of the GPU micro-benchmarks (tests/gpu, tests/gpu_moe): failing fast on a CUDA, Abseil
// or cuBLAS error, and the median time of a launch repeated. Benchmarks are not tests: they exit
// on the first error instead of reporting it.
#ifndef TANDEM_TESTS_GPU_BENCH_UTIL_H_
#define TANDEM_TESTS_GPU_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define BENCH_CHECK(call)                                                                        \
  do {                                                                                           \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) {                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// For an absl::Status (the caller includes Abseil).
#define BENCH_OK(expr)                                                               \
  do {                                                                               \
    if (absl::Status s_ = (expr); !s_.ok()) {                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, s_.ToString().c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace tandem::bench {

// CUDA events around work on the default stream: Start(), then StopMs() waits for the work and
// returns the milliseconds between the two.
struct EventTimer {
  cudaEvent_t a, b;
  EventTimer() {
    BENCH_CHECK(cudaEventCreate(&a));
    BENCH_CHECK(cudaEventCreate(&b));
  }
  ~EventTimer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void Start() { BENCH_CHECK(cudaEventRecord(a)); }
  float StopMs() {
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

// The median of timings (the upper one of an even count).
template <typename T>
double Median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return static_cast<double>(v[v.size() / 2]);
}

// True, after printing "device: NAME, N SMs, L2 M MiB", when a CUDA device is present.
inline bool PrintDevice() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  return true;
}

// Median over 5 rounds of the milliseconds per call of fn, each round `reps` calls timed with
// CUDA events on the default stream, after `warmup` untimed calls.
inline double TimeMs(const std::function<void()>& fn, int reps = 20, int warmup = 2) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int round = 0; round < 5; ++round) {
    BENCH_CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) fn();
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / reps);
  }
  BENCH_CHECK(cudaGetLastError());
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A device array of `count` f32 values in [-1, 1) (finite, so softmax, norms and gates stay
// meaningful), from an xorshift stream seeded by `seed`. The caller frees it with cudaFree.
inline float* RandomFloats(size_t count, uint64_t seed) {
  std::vector<float> host(count);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (float& v : host) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<int64_t>(x >> 40) - (1ll << 23)) / static_cast<float>(1ll << 23);
  }
  float* d = nullptr;
  BENCH_CHECK(cudaMalloc(&d, count * 4));
  BENCH_CHECK(cudaMemcpy(d, host.data(), count * 4, cudaMemcpyHostToDevice));
  return d;
}

// Random bytes; `mask` is applied to every 8 bytes (0x3FFF... keeps f16 fields finite wherever
// they fall: the top two bits of every odd byte are cleared).
inline void* RandomDevice(size_t bytes, uint64_t seed, uint64_t mask = ~0ull) {
  std::vector<uint64_t> host((bytes + 7) / 8);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t& v : host) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = x & mask;
  }
  void* d = nullptr;
  BENCH_CHECK(cudaMalloc(&d, host.size() * 8));
  BENCH_CHECK(cudaMemcpy(d, host.data(), host.size() * 8, cudaMemcpyHostToDevice));
  return d;
}

// Device Q8_0 rows (rows × cols / 32 blocks of 34 bytes) of random quants whose f16 block scales
// are kept small and finite (bits of the scale's high byte masked), so products stay in range.
inline void* RandomQ8_0Device(int64_t rows, int64_t cols, uint64_t seed) {
  const size_t bytes = static_cast<size_t>(rows * (cols / 32 * 34));
  void* w = RandomDevice(bytes, seed);
  std::vector<uint8_t> host(bytes);
  BENCH_CHECK(cudaMemcpy(host.data(), w, bytes, cudaMemcpyDeviceToHost));
  for (size_t b = 0; b < bytes; b += 34) host[b + 1] &= 0x1B;  // small finite f16 scales
  BENCH_CHECK(cudaMemcpy(w, host.data(), bytes, cudaMemcpyHostToDevice));
  return w;
}

// The stream a benchmark's launches go to: GraphUs points it at its capturing stream while it
// records the launches, otherwise it is the default stream (nullptr).
inline cudaStream_t& LaunchStream() {
  static cudaStream_t stream = nullptr;
  return stream;
}

// Median microseconds per launch of fn when `per_graph` launches (made on LaunchStream()) are
// replayed from one CUDA graph (no host launch cost: the GPU-side time of back-to-back kernels, as
// a captured decode step sees it). fn must have run once outside capture (one-time attribute
// calls). -1 when the graph could not be built (the run goes on).
inline double GraphUs(const std::function<void()>& fn, int per_graph = 20) {
  cudaStream_t s;
  BENCH_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    LaunchStream() = s;
    for (int i = 0; i < per_graph; ++i) fn();
    LaunchStream() = nullptr;
    e = cudaStreamEndCapture(s, &graph);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  double us = -1.0;
  if (e == cudaSuccess) {
    us = TimeMs([&] { BENCH_CHECK(cudaGraphLaunch(exec, nullptr)); }, 10, 3) * 1e3 / per_graph;
  } else {
    std::fprintf(stderr, "graph: %s\n", cudaGetErrorString(e));
    (void)cudaGetLastError();
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return us;
}

// The probe benchmarks' statistic: over the rows (one per block, %globaltimer stamps in ns) with
// word p stamped, the first (which < 0), median (0) or last (> 0) of (stamp - t0) in us; 0 when
// no row has it.
inline double StampUs(const std::vector<const unsigned long long*>& rows, int p, unsigned long long t0, int which) {
  std::vector<double> v;
  for (const unsigned long long* r : rows) {
    if (r[p] != 0) v.push_back((static_cast<double>(r[p]) - static_cast<double>(t0)) * 1e-3);
  }
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return which < 0 ? v.front() : which > 0 ? v.back() : v[v.size() / 2];
}

// Milliseconds of one replay of a CUDA graph of `per_graph` calls of fn (launches made on
// LaunchStream()), the probe benchmarks' stamped replay: the graph is captured on its own stream,
// replayed three times, then arm(stream) (e.g. clear the stamp buffer and switch the probe on)
// runs, one replay is timed with events, and disarm(stream) runs before the graph is destroyed.
// fn must have run once outside capture.
inline float StampedReplayMs(const std::function<void()>& fn, int per_graph, const std::function<void(cudaStream_t)>& arm,
                             const std::function<void(cudaStream_t)>& disarm) {
  cudaStream_t s;
  BENCH_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  LaunchStream() = s;
  for (int i = 0; i < per_graph; ++i) fn();
  LaunchStream() = nullptr;
  BENCH_CHECK(cudaStreamEndCapture(s, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) BENCH_CHECK(cudaGraphLaunch(exec, s));
  arm(s);
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  BENCH_CHECK(cudaEventRecord(e0, s));
  BENCH_CHECK(cudaGraphLaunch(exec, s));
  BENCH_CHECK(cudaEventRecord(e1, s));
  BENCH_CHECK(cudaStreamSynchronize(s));
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  disarm(s);
  BENCH_CHECK(cudaStreamSynchronize(s));
  BENCH_CHECK(cudaEventDestroy(e0));
  BENCH_CHECK(cudaEventDestroy(e1));
  BENCH_CHECK(cudaGraphExecDestroy(exec));
  BENCH_CHECK(cudaGraphDestroy(graph));
  BENCH_CHECK(cudaStreamDestroy(s));
  return ms;
}

// The results reported so far, one JSON object each.
inline std::vector<std::string>& JsonResults() {
  static std::vector<std::string> results;
  return results;
}

// One result: a line on stdout, and a JSON object for WriteJson.
inline void Report(const std::string& name, double value, const char* unit, const std::string& detail) {
  std::printf("%-44s %12.2f %-8s %s\n", name.c_str(), value, unit, detail.c_str());
  std::fflush(stdout);
  char buf[512];
  std::snprintf(buf, sizeof(buf), "{\"name\":\"%s\",\"value\":%.4f,\"unit\":\"%s\",\"detail\":\"%s\"}",
                name.c_str(), value, unit, detail.c_str());
  JsonResults().push_back(buf);
}

// Writes every reported result to `path` as a JSON array (nothing when path is empty).
inline void WriteJson(const std::string& path) {
  if (path.empty()) return;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  const std::vector<std::string>& r = JsonResults();
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < r.size(); ++i) std::fprintf(f, "  %s%s\n", r[i].c_str(), i + 1 < r.size() ? "," : "");
  std::fprintf(f, "]\n");
  std::fclose(f);
}

}  // namespace tandem::bench

#endif  // TANDEM_TESTS_GPU_BENCH_UTIL_H_
