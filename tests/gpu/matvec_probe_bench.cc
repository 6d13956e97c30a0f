// gpu_kernels_bench --matvec-probe: where a batch-1 streaming product's time goes inside a PDL
// chain (kernels/dense_matvec_probe.h), as gpu_moe_bench --one-token-probe does for the one-token
// MoE kernels. A CUDA graph of 48 "layers", each a producer kernel (one block per SM holding its
// SM for ~2 us of %globaltimer, then writing x; launched with PDL like the step's norms) followed
// by the product of that layer's own matrix (48 distinct matrices, far more than the L2: weights
// come from HBM). Per shape: graph microseconds per layer (producer alone, with the production
// product, with the probed one stamps off, the stamped replay), then from one stamped replay the
// phases of the product's blocks in us after the producer's last x write (medians over layers
// 1..47 of the first / median / last block), the blocks that entered before that write, the most
// blocks on one SM, and the weight bytes' floor at 4.4 TB/s. Not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"
#include "tests/gpu/bench_util.h"
#include "tests/gpu/decode_matvec_bench.h"

namespace tandem::cuda {
namespace {

using Stamp = unsigned long long;
constexpr int kLayers = 48;
constexpr unsigned kSpinNs = 2000;
constexpr double kFloorBytesPerUs = 4.4e6;  // 4.4 TB/s

// Over the blocks with word p stamped: the first, median or last of (stamp - t0) in us.
double Of(const std::vector<const Stamp*>& rows, int p, Stamp t0, int which) { return bench::StampUs(rows, p, t0, which); }

// stamps: kLayers · blocks product rows (layer l's blocks in slots [l · blocks, (l + 1) · blocks):
// each layer's producer waits for the previous product, so one product's blocks all start before
// the next one's); span: kLayers · sms producer [start, end] pairs.
void Report(const std::vector<Stamp>& stamps, const std::vector<Stamp>& span, int blocks, int sms) {
  const struct {
    int word;
    const char* name;
  } phases[] = {{kStreamProbeEntry, "entry"},
                {kStreamProbeRingIssued, "first ring issued (before the wait)"},
                {kStreamProbeAfterWait, "after the PDL wait"},
                {kStreamProbeStaged, "x staged"},
                {kStreamProbeFirstGroup, "first group's loop done (thread 0)"},
                {kStreamProbeLastGroup, "last group's loop done (thread 0)"},
                {kStreamProbeLastWrite, "last group reduced, before its write"},
                {kStreamProbeExit, "exit"}};
  constexpr int kPhases = sizeof(phases) / sizeof(phases[0]);
  std::vector<std::vector<double>> first(kPhases), median(kPhases), last(kPhases);
  std::vector<double> producer_start, early, per_sm;
  int mixed = 0;
  for (int l = 1; l < kLayers; ++l) {
    Stamp t0 = 0, s0 = ~0ull;
    for (int b = 0; b < sms; ++b) {
      const Stamp* p = span.data() + 2 * (static_cast<size_t>(l) * sms + b);
      if (p[0] != 0) s0 = std::min(s0, p[0]);
      t0 = std::max(t0, p[1]);
    }
    std::vector<const Stamp*> rows;
    std::vector<bool> seen(static_cast<size_t>(blocks), false);
    bool ok = t0 != 0;
    for (int b = 0; b < blocks && ok; ++b) {
      const Stamp* r = stamps.data() + (static_cast<size_t>(l) * blocks + b) * kStreamProbeWords;
      const Stamp block = r[kStreamProbeBlock];
      ok = r[kStreamProbeEntry] != 0 && block < static_cast<Stamp>(blocks) && !seen[block];
      if (ok) seen[block] = true;
      rows.push_back(r);
    }
    if (!ok) {
      ++mixed;
      continue;
    }
    for (int p = 0; p < kPhases; ++p) {
      first[p].push_back(Of(rows, phases[p].word, t0, -1));
      median[p].push_back(Of(rows, phases[p].word, t0, 0));
      last[p].push_back(Of(rows, phases[p].word, t0, 1));
    }
    producer_start.push_back((static_cast<double>(s0) - static_cast<double>(t0)) * 1e-3);
    int n = 0;
    std::vector<int> on(1024, 0);
    int most = 0;
    for (const Stamp* r : rows) {
      n += r[kStreamProbeEntry] < t0;
      most = std::max(most, ++on[r[kStreamProbeSm] % 1024]);
    }
    early.push_back(n);
    per_sm.push_back(most);
  }
  if (first[0].empty()) {
    std::printf("  no complete layer recorded (%d layers with missing or repeated blocks)\n", mixed);
    return;
  }
  std::printf("  us after the producer's last x write (%%globaltimer, 256 ns steps), median over %zu layers of the "
              "first / median / last block:\n",
              first[0].size());
  std::printf("  %-40s %8.2f\n", "producer's first block started", bench::Median(producer_start));
  for (int p = 0; p < kPhases; ++p) {
    std::printf("  %-40s %8.2f %8.2f %8.2f\n", phases[p].name, bench::Median(first[p]), bench::Median(median[p]),
                bench::Median(last[p]));
  }
  std::printf("  blocks entered before the producer's last write: %.0f of %d; most blocks on one SM: %.0f", bench::Median(early),
              blocks, bench::Median(per_sm));
  if (mixed > 0) std::printf("; %d layers skipped (missing or repeated blocks)", mixed);
  std::printf("\n");
}

struct Case {
  const char* name;
  uint32_t type;
  int cols, rows;
};

void RunCase(const Case& c, int sms) {
  const int64_t row_bytes = c.type == kTypeF32 ? int64_t{c.cols} * 4 : Q8_0x8RowBytes(c.cols);
  const int64_t bytes = row_bytes * c.rows;
  // One random matrix copied to 48 places (the bytes' values do not change the timing; f16 fields
  // kept finite, f32 values in [-1, 1)).
  void* one = c.type == kTypeF32 ? static_cast<void*>(bench::RandomFloats(static_cast<size_t>(bytes / 4), 12))
                                 : bench::RandomDevice(static_cast<size_t>(bytes), 11, 0x3FFF3FFF3FFF3FFFull);
  uint8_t* w;
  BENCH_CHECK(cudaMalloc(&w, static_cast<size_t>(bytes) * kLayers));
  for (int l = 0; l < kLayers; ++l) BENCH_CHECK(cudaMemcpy(w + l * bytes, one, bytes, cudaMemcpyDeviceToDevice));
  BENCH_CHECK(cudaFree(one));
  float* src = bench::RandomFloats(static_cast<size_t>(c.cols), 3);
  float *x, *y;
  BENCH_CHECK(cudaMalloc(&x, c.cols * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&y, c.rows * sizeof(float)));
  auto matrix = [&](int l) { return DeviceMatrix{c.type, w + l * bytes, c.cols, c.rows, row_bytes}; };
  StreamProbeGrid grid;
  BENCH_CHECK(StreamMatVecProbeGrid(matrix(0), &grid));
  const unsigned capacity = static_cast<unsigned>(kLayers * grid.blocks);
  const size_t stamp_bytes = static_cast<size_t>(capacity) * kStreamProbeWords * sizeof(Stamp);
  const size_t span_bytes = static_cast<size_t>(kLayers) * sms * 2 * sizeof(Stamp);
  Stamp *stamps, *span;
  BENCH_CHECK(cudaMalloc(&stamps, stamp_bytes));
  BENCH_CHECK(cudaMalloc(&span, span_bytes));
  BENCH_CHECK(cudaMemset(span, 0, span_bytes));

  // kind 0: producer alone; 1: + the production product (LaunchDenseMatVec); 2: + the probed one.
  int layer = 0, kind = 0;
  auto step = [&] {
    cudaStream_t s = bench::LaunchStream();
    const int l = layer++ % kLayers;
    BENCH_CHECK(LaunchStreamProbeProducer(src, x, c.cols, sms, kSpinNs, span + 2 * static_cast<size_t>(l) * sms, s));
    if (kind == 1) BENCH_CHECK(LaunchDenseMatVec(matrix(l), x, c.cols, 1, y, c.rows, s));
    if (kind == 2) BENCH_CHECK(LaunchDenseMatVecProbed(matrix(l), x, y, s));
  };
  BENCH_CHECK(SetStreamMatVecProbe(nullptr, 0, nullptr));
  double us[3];
  for (kind = 0; kind < 3; ++kind) {
    step();  // once outside capture (attributes)
    BENCH_CHECK(cudaDeviceSynchronize());
    layer = 0;
    us[kind] = bench::GraphUs(step, kLayers);
  }

  // The stamped replay: the probed chain captured once, warmed up, replayed with the stamps on.
  kind = 2;
  layer = 0;
  const float ms = bench::StampedReplayMs(
      step, kLayers,
      [&](cudaStream_t st) {
        BENCH_CHECK(cudaMemsetAsync(stamps, 0, stamp_bytes, st));
        BENCH_CHECK(cudaMemsetAsync(span, 0, span_bytes, st));
        BENCH_CHECK(SetStreamMatVecProbe(stamps, capacity, st));
      },
      [&](cudaStream_t st) { BENCH_CHECK(SetStreamMatVecProbe(nullptr, 0, st)); });
  std::vector<Stamp> host(stamp_bytes / sizeof(Stamp)), host_span(span_bytes / sizeof(Stamp));
  BENCH_CHECK(cudaMemcpy(host.data(), stamps, stamp_bytes, cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(host_span.data(), span, span_bytes, cudaMemcpyDeviceToHost));

  std::printf("matvec probe %s %d -> %d: %.2f MB a matrix (x %d layers), floor %.2f us at 4.4 TB/s; grid %d blocks, "
              "wpr %d, %d row groups (up to %d a block)\n",
              c.name, c.cols, c.rows, bytes / 1e6, kLayers, bytes / kFloorBytesPerUs, grid.blocks, grid.wpr, grid.groups,
              (grid.groups + grid.blocks - 1) / grid.blocks);
  std::printf("  graph us/layer: producer alone %.2f; + product %.2f (product %.2f); + probed product, stamps off "
              "%.2f; stamped replay %.2f\n",
              us[0], us[1], us[1] - us[0], us[2], ms * 1e3 / kLayers);
  Report(host, host_span, grid.blocks, sms);
  std::fflush(stdout);
  for (void* p : {static_cast<void*>(w), static_cast<void*>(src), static_cast<void*>(x), static_cast<void*>(y),
                  static_cast<void*>(stamps), static_cast<void*>(span)}) {
    BENCH_CHECK(cudaFree(p));
  }
}

}  // namespace

void BenchMatVecProbe() {
  int dev = 0, sms = 0;
  BENCH_CHECK(cudaGetDevice(&dev));
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const Case cases[] = {{"q8_0x8 (stacked GDN inputs)", kTypeQ8_0x8, 2048, 8256},
                        {"q8_0x8 (ssm_out)", kTypeQ8_0x8, 4096, 2048},
                        {"f32 (router)", kTypeF32, 2048, 513}};
  for (const Case& c : cases) RunCase(c, sms);
}

}  // namespace tandem::cuda
