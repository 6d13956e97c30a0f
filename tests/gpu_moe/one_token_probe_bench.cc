// gpu_moe_bench --one-token-probe: where a layer's time goes inside the one-token MoE chain. The
// 48-layer graph of BenchOneToken (router product, gate/up, down; the same buffers and steps) with
// the probed instantiations of the two kernels (expert_decode_one_probe.h), replayed once with the
// stamps on; per layer, the phases of its gate/up and down blocks relative to the previous layer's
// last down block, medians over layers 1..47; for each of the kernels' forms (f32 / int16
// activations, f64 / logit routing, x before the wait, per-pick counts), alone and with the shared
// expert's two unit kernels on a side stream beside them (as the decode stage runs them). Then the
// fused kernel's forms (expert_decode_fused.cuh), timed as graphs, and the decode stage's two of
// them (the shared expert inside; and the router product inside) again with their phase stamps
// (expert_decode_fused_probe.h). Not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_one_probe.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "tests/gpu/bench_util.h"
#include "tests/gpu_moe/moe_bench_util.h"

namespace tandem::cuda::moe_bench {
namespace {

using Stamp = unsigned long long;
constexpr int kW = kOneTokenProbeWords;

struct Blocks {
  std::vector<const Stamp*> rows;  // one per block of the launch
  // Over the blocks with phase p stamped: min, median or max of (stamp - t0) in us.
  double Of(int p, Stamp t0, int which) const { return bench::StampUs(rows, p, t0, which); }
  int MaxPerSm() const {
    std::vector<int> n(1024, 0);
    int m = 0;
    for (const Stamp* r : rows) m = std::max(m, ++n[r[kW - 2] % 1024]);
    return m;
  }
};

void Report(const std::vector<Stamp>& stamps, unsigned capacity, int layers, int gate_blocks, int down_blocks,
            const char* what) {
  struct Phase {
    int kernel, word;
    const char* name;
  };
  // expert_decode_one_probe.h's phases in the order a block passes them.
  const Phase phases[] = {{0, 0, "gate/up entry"},
                          {0, 1, "gate/up after the PDL wait"},
                          {0, 5, "gate/up routing: max known"},
                          {0, 6, "gate/up routing: exponentials"},
                          {0, 7, "gate/up routing: sum, inverse"},
                          {0, 2, "gate/up routed"},
                          {0, 3, "gate/up copies landed (warp 0)"},
                          {0, 4, "gate/up act written"},
                          {1, 0, "down entry"},
                          {1, 8, "down routing: max known"},
                          {1, 9, "down routing: exponentials"},
                          {1, 10, "down routing: sum, inverse"},
                          {1, 1, "down routed, copies issued"},
                          {1, 2, "down after the PDL wait"},
                          {1, 3, "down copies landed"},
                          {1, 11, "down act staged (warp 0)"},
                          {1, 12, "down sub-block sums (warp 0)"},
                          {1, 13, "down dots done (warp 0)"},
                          {1, 4, "down summed (block barrier)"},
                          {1, 5, "down y written"}};
  constexpr int kPhases = sizeof(phases) / sizeof(phases[0]);
  std::vector<std::vector<double>> first(kPhases), median(kPhases), last(kPhases);
  std::vector<double> gate_per_sm, down_per_sm, down_early;
  for (int l = 1; l < layers; ++l) {
    Blocks launch[2], prev;
    for (int b = 0; b < gate_blocks; ++b) {
      launch[0].rows.push_back(stamps.data() + (static_cast<size_t>(l) * gate_blocks + b) * kW);
    }
    for (int b = 0; b < down_blocks; ++b) {
      launch[1].rows.push_back(stamps.data() + (static_cast<size_t>(capacity) + l * down_blocks + b) * kW);
      prev.rows.push_back(stamps.data() + (static_cast<size_t>(capacity) + (l - 1) * down_blocks + b) * kW);
    }
    Stamp t0 = 0;
    for (const Stamp* r : prev.rows) t0 = std::max(t0, r[5]);
    if (t0 == 0) continue;
    for (int p = 0; p < kPhases; ++p) {
      const Blocks& blocks = launch[phases[p].kernel];
      first[p].push_back(blocks.Of(phases[p].word, t0, -1));
      median[p].push_back(blocks.Of(phases[p].word, t0, 0));
      last[p].push_back(blocks.Of(phases[p].word, t0, 1));
    }
    gate_per_sm.push_back(launch[0].MaxPerSm());
    down_per_sm.push_back(launch[1].MaxPerSm());
    const double gate_end = launch[0].Of(4, t0, 1);
    int early = 0;
    for (const Stamp* r : launch[1].rows) early += r[0] != 0 && (static_cast<double>(r[0]) - t0) * 1e-3 < gate_end;
    down_early.push_back(early);
  }
  if (gate_per_sm.empty()) {
    std::printf("one-token probe (%s): no complete layer recorded\n", what);
    return;
  }
  std::printf("one-token probe (%s): us after the previous layer's last down block (%%globaltimer), median over %zu "
              "layers of the first / median / last block:\n",
              what, gate_per_sm.size());
  for (int p = 0; p < kPhases; ++p) {
    std::printf("  %-34s %8.2f %8.2f %8.2f\n", phases[p].name, Median(first[p]), Median(median[p]), Median(last[p]));
  }
  std::printf("  most blocks on one SM: gate/up %.0f, down %.0f; down blocks entered before gate/up's last act row: "
              "%.0f of %d\n",
              Median(gate_per_sm), Median(down_per_sm), Median(down_early), down_blocks);
}

// The fused kernel's stamps (expert_decode_fused_probe.h): `grid` rows a layer; per layer l >= 1,
// each kind of block's phases after layer l - 1's last block exit, medians over layers of the first
// / median / last block of that kind.
void ReportFused(const std::vector<Stamp>& stamps, int layers, int grid, const char* what) {
  const char* phase_names[kFusedProbePhases] = {"entry",
                                                "after the PDL wait",
                                                "routed (block barrier)",
                                                "gate/up copies landed (warp 0)",
                                                "act written (block barrier)",
                                                "act gathered (pushes landed)",
                                                "down copies landed",
                                                "sums issued (block barrier)",
                                                "exit"};
  const char* kind_names[3] = {"routed", "shared", "router"};
  // The routed blocks' routing detail (expert_decode_fused_probe.h), printed after "after the PDL wait".
  constexpr int kDetail = 5;
  const int detail[kDetail] = {kFusedProbeCountSeen, kFusedProbeLogitsLoaded, kFusedProbeLogitsReloaded,
                               kFusedProbeOtherLoaded, kFusedProbePicked};
  const char* detail_names[kDetail] = {"routing: router count seen", "routing: logits loaded",
                                       "routing: logits loaded again", "routing: table lines loaded",
                                       "routing: picked"};
  std::vector<double> v[3][kFusedProbePhases][3], vd[kDetail][3];
  std::vector<double> span;
  auto row = [&](int l, int b) { return stamps.data() + (static_cast<size_t>(l) * grid + b) * kFusedProbeWords; };
  for (int l = 1; l < layers; ++l) {
    Stamp t0 = 0, end = 0;
    for (int b = 0; b < grid; ++b) t0 = std::max(t0, row(l - 1, b)[kFusedProbeExit]);
    if (t0 == 0) continue;
    std::vector<const Stamp*> of_kind[3];
    for (int b = 0; b < grid; ++b) {
      const Stamp* r = row(l, b);
      if (r[kFusedProbeEntry] == 0 || r[kFusedProbeKind] > 2) continue;
      of_kind[r[kFusedProbeKind]].push_back(r);
      end = std::max(end, r[kFusedProbeExit]);
    }
    for (int kind = 0; kind < 3; ++kind) {
      if (of_kind[kind].empty()) continue;
      for (int p = 0; p < kFusedProbePhases; ++p) {
        for (int which = -1; which <= 1; ++which) {
          v[kind][p][which + 1].push_back(bench::StampUs(of_kind[kind], p, t0, which));
        }
      }
      if (kind == kFusedProbeRoutedKind) {
        for (int d = 0; d < kDetail; ++d) {
          for (int which = -1; which <= 1; ++which) {
            vd[d][which + 1].push_back(bench::StampUs(of_kind[kind], detail[d], t0, which));
          }
        }
      }
    }
    span.push_back((static_cast<double>(end) - static_cast<double>(t0)) * 1e-3);
  }
  if (span.empty()) {
    std::printf("one-token probe (%s, stamped): no complete layer recorded\n", what);
    return;
  }
  std::printf("one-token probe (%s, stamped): us after the previous layer's last block exit (%%globaltimer), median "
              "over %zu layers of the first / median / last block of each kind:\n",
              what, span.size());
  for (int kind = 0; kind < 3; ++kind) {
    if (v[kind][0][0].empty()) continue;
    for (int p = 0; p < kFusedProbePhases; ++p) {
      if (kind == kFusedProbeRouterKind && p != kFusedProbeEntry && p != kFusedProbeExit) continue;
      std::printf("  %-7s %-32s %8.2f %8.2f %8.2f\n", kind_names[kind], phase_names[p], Median(v[kind][p][0]),
                  Median(v[kind][p][1]), Median(v[kind][p][2]));
      if (kind == kFusedProbeRoutedKind && p == kFusedProbeAfterWait && !vd[0][0].empty()) {
        for (int d = 0; d < kDetail; ++d) {
          std::printf("  %-7s %-32s %8.2f %8.2f %8.2f\n", kind_names[kind], detail_names[d], Median(vd[d][0]),
                      Median(vd[d][1]), Median(vd[d][2]));
        }
      }
    }
  }
  std::printf("  the layer's last exit: %.2f\n", Median(span));
}

}  // namespace

void BenchOneTokenProbe(const float* x, std::mt19937& rng) {
  const int routers = 24, steps = 48;
  const Layer layer = RandomLayer(kTypeQ4_K, kTypeQ4_K, rng);
  ExpertLocation* table = UploadTable(layer);
  std::vector<float*> mats(routers);
  for (int i = 0; i < routers; ++i) mats[i] = bench::RandomFloats(kE * kH, 100 + i);
  float *logits, *act, *shared, *gate_logit, *y;
  int32_t* picks;
  int* ints;
  BENCH_CHECK(cudaMalloc(&logits, kE * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&act, kK * kI * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&shared, kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&gate_logit, sizeof(float)));
  BENCH_CHECK(cudaMalloc(&y, kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&picks, 2 * kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&ints, 4 * sizeof(int)));
  BENCH_CHECK(cudaMemset(ints, 0, 4 * sizeof(int)));
  BENCH_CHECK(cudaMemcpy(shared, x + kH, kH * sizeof(float), cudaMemcpyDeviceToDevice));
  BENCH_CHECK(cudaMemcpy(gate_logit, x + 2 * kH, sizeof(float), cudaMemcpyDeviceToDevice));
  // The launch geometry of expert_decode_one.cu at these shapes (4 warps of 4 rows; 16 down rows).
  const int gate_blocks = static_cast<int>(kI / 16 * kK), down_blocks = static_cast<int>(kH / 16);
  const unsigned capacity = static_cast<unsigned>(steps * std::max(gate_blocks, down_blocks));
  Stamp* stamps;
  const size_t stamp_bytes = 2 * static_cast<size_t>(capacity) * kW * sizeof(Stamp);
  BENCH_CHECK(cudaMalloc(&stamps, stamp_bytes));
  int* counts;
  BENCH_CHECK(cudaMalloc(&counts, (kK + 1) * sizeof(int)));
  BENCH_CHECK(cudaMemset(counts, 0, (kK + 1) * sizeof(int)));
  // The shared expert as the decode stage runs it: one expert of the dense type (Q8_0, h × I) through
  // the unit kernels on a side stream, forked before the router product and joined after the down
  // kernel. Zero bytes (the timing does not depend on the values).
  void *shared_gate, *shared_up, *shared_down;
  const size_t sgu_bytes = static_cast<size_t>(kI * RowBytesOf(kTypeQ8_0, kH));
  const size_t sd_bytes = static_cast<size_t>(kH * RowBytesOf(kTypeQ8_0, kI));
  BENCH_CHECK(cudaMalloc(&shared_gate, sgu_bytes));
  BENCH_CHECK(cudaMalloc(&shared_up, sgu_bytes));
  BENCH_CHECK(cudaMalloc(&shared_down, sd_bytes));
  BENCH_CHECK(cudaMemset(shared_gate, 0, sgu_bytes));
  BENCH_CHECK(cudaMemset(shared_up, 0, sgu_bytes));
  BENCH_CHECK(cudaMemset(shared_down, 0, sd_bytes));
  float *shared_act, *shared_out;
  BENCH_CHECK(cudaMalloc(&shared_act, kI * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&shared_out, kH * sizeof(float)));
  ExpertUnit* shared_units;
  BENCH_CHECK(cudaMalloc(&shared_units, sizeof(ExpertUnit)));
  BENCH_CHECK(LaunchDenseUnitsOnDevice({shared_gate, shared_up, shared_down}, 1, shared_units, nullptr));
  BENCH_CHECK(cudaDeviceSynchronize());
  absl::StatusOr<ExpertDecodeRunner> shared_runner = ExpertDecodeRunner::Create(1);
  BENCH_OK(shared_runner.status());
  const ExpertDecodeRunner::Shape shared_shape{static_cast<WeightType>(kTypeQ8_0), static_cast<WeightType>(kTypeQ8_0),
                                               kH, kI};
  cudaStream_t side;
  BENCH_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork_event, join_event;
  BENCH_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
  BENCH_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
  int step = 0;
  bool int16 = false, logit_route = false, x_early = false, pick_counts = false, with_shared = false;
  auto chain = [&](bool with_product) {
    cudaStream_t s = bench::LaunchStream();
    if (with_shared) {
      BENCH_CHECK(cudaEventRecord(fork_event, s));
      BENCH_CHECK(cudaStreamWaitEvent(side, fork_event));
      BENCH_OK(shared_runner->RunPlanned(shared_units, 1, nullptr, 1, shared_shape, x + (step % 4096) * kH, shared_act,
                                         shared_out, side));
      BENCH_CHECK(cudaEventRecord(join_event, side));
    }
    if (with_product) {
      BENCH_CHECK(LaunchDenseMatVec(DeviceMatrix{kTypeF32, mats[step % routers], kH, kE, kH * 4},
                                    x + (step % 4096) * kH, kH, 1, logits, kE, s));
    }
    OneTokenMoeArgs o = OneTokenBenchArgs(logits, table, x + (step % 4096) * kH, act, picks, ints, shared, gate_logit, y);
    o.int16_activations = int16;
    o.logit_route = logit_route;
    o.x_written_earlier = x_early;  // x is never written here
    o.pick_counts = pick_counts ? counts : nullptr;
    BENCH_CHECK(LaunchOneTokenMoeGateUpProbed(o, s));
    BENCH_CHECK(LaunchOneTokenMoeDownProbed(o, s));
    if (with_shared) BENCH_CHECK(cudaStreamWaitEvent(s, join_event));
    ++step;
  };
  struct Variant {
    const char* what;
    bool with_product, down_late, int16, logit_route, x_early, pick_counts, with_shared;
  };
  const Variant variants[] = {
      {"router product + chain", true, false, false, false, false, false, false},
      {"router product + chain, down routes and copies after its wait", true, true, false, false, false, false, false},
      {"chain without router product", false, false, false, false, false, false, false},
      {"router product + chain, int16 activations", true, false, true, false, false, false, false},
      {"int16, logit routing", true, false, true, true, false, false, false},
      {"int16, logit routing, x early (the fast default)", true, false, true, true, true, false, false},
      {"int16, pick counts", true, false, true, false, false, true, false},
      {"int16, logit routing, x early, pick counts", true, false, true, true, true, true, false},
      // The shared expert on the side stream, as in the model: what its blocks cost the chain.
      {"int16, shared expert beside", true, false, true, false, false, false, true},
      {"int16, logit routing, x early (the fast default), shared expert beside", true, false, true, true, true, false, true},
      {"int16, logit routing, x early, pick counts, shared expert beside", true, false, true, true, true, true, true},
  };
  for (const Variant& v : variants) {
    const bool with_product = v.with_product, down_late = v.down_late;
    int16 = v.int16;
    logit_route = v.logit_route;
    x_early = v.x_early;
    pick_counts = v.pick_counts;
    with_shared = v.with_shared;
    BENCH_CHECK(SetOneTokenProbe(nullptr, 0, nullptr, down_late));
    step = 0;
    chain(with_product);  // once outside capture (attributes)
    BENCH_CHECK(cudaDeviceSynchronize());
    step = 0;
    const double us = bench::GraphUs([&] { chain(with_product); }, steps);  // stamps off
    step = 0;
    const float ms = bench::StampedReplayMs(
        [&] { chain(with_product); }, steps,
        [&](cudaStream_t st) {
          BENCH_CHECK(cudaMemsetAsync(stamps, 0, stamp_bytes, st));
          BENCH_CHECK(SetOneTokenProbe(stamps, capacity, st, down_late));
        },
        [&](cudaStream_t st) { BENCH_CHECK(SetOneTokenProbe(nullptr, 0, st)); });
    std::vector<Stamp> host(stamp_bytes / sizeof(Stamp));
    BENCH_CHECK(cudaMemcpy(host.data(), stamps, stamp_bytes, cudaMemcpyDeviceToHost));
    const char* what = v.what;
    std::printf("one-token probe (%s): graph %.2f us/layer with the stamps off, %.2f us/layer in the stamped replay\n", what, us,
                ms * 1e3 / steps);
    Report(host, capacity, steps, gate_blocks, down_blocks, what);
  }
  // The one-kernel form (expert_decode_fused.cuh): the router product and one launch a layer, each
  // layer adding into its own y, all zeroed once before the 48 layers (as the decode stage does at
  // a step's start). No stamps: the graph's time a layer only.
  // Clusters of 8 are placed within one GPC, so how many run at once depends on the chip's GPCs as
  // well as on its SM count: printed so that runs on different machines can be told apart.
  int sms = 0, clusters = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  BENCH_CHECK(OneTokenFusedMaxActiveClusters(static_cast<int>(kH), static_cast<int>(kE), &clusters));
  std::printf("one-token probe: %d SMs; the fused kernel's clusters of 8 that fit at once: %d (grid: %d without "
              "the shared expert, %d with it)\n",
              sms, clusters, static_cast<int>(kK * kI / 128), static_cast<int>(kK * kI / 128 + kI / 64));
  float* ys;
  BENCH_CHECK(cudaMalloc(&ys, static_cast<size_t>(steps) * kH * sizeof(float)));
  const FusedSharedExpert inside{shared_gate, shared_up, shared_down, static_cast<int>(kI)};
  int* router_counters;
  BENCH_CHECK(cudaMalloc(&router_counters, 2 * sizeof(int)));
  BENCH_CHECK(cudaMemset(router_counters, 0, 2 * sizeof(int)));
  // The stamped forms' rows: every layer's grid (at most the router's blocks and 48 clusters).
  const int max_grid = kFusedRouterMaxBlocks + kFusedCluster * static_cast<int>(kK * kI / 128 + kI / 64);
  const size_t fused_stamp_bytes = static_cast<size_t>(steps) * max_grid * kFusedProbeWords * sizeof(Stamp);
  Stamp* fused_stamps;
  BENCH_CHECK(cudaMalloc(&fused_stamps, fused_stamp_bytes));
  bool probed = false;
  int grid = 0;
  // No shared expert, beside on the side stream, inside the kernel, inside with the router product
  // in the grid too (FusedRouter: no launch before the kernel; the shared term ungated).
  for (const int form : {0, 1, 2, 3}) {
    const bool beside = form == 1;
    with_shared = beside;
    auto fused = [&] {
      cudaStream_t s = bench::LaunchStream();
      if (step % steps == 0) BENCH_CHECK(cudaMemsetAsync(ys, 0, static_cast<size_t>(steps) * kH * sizeof(float), s));
      if (with_shared) {
        BENCH_CHECK(cudaEventRecord(fork_event, s));
        BENCH_CHECK(cudaStreamWaitEvent(side, fork_event));
        BENCH_OK(shared_runner->RunPlanned(shared_units, 1, nullptr, 1, shared_shape, x + (step % 4096) * kH,
                                           shared_act, shared_out, side));
        BENCH_CHECK(cudaEventRecord(join_event, side));
      }
      if (form != 3) {
        BENCH_CHECK(LaunchDenseMatVec(DeviceMatrix{kTypeF32, mats[step % routers], kH, kE, kH * 4},
                                      x + (step % 4096) * kH, kH, 1, logits, kE, s));
      }
      OneTokenMoeArgs o = OneTokenBenchArgs(logits, table, x + (step % 4096) * kH, act, picks, ints, nullptr, nullptr,
                                            ys + (step % steps) * kH);
      o.int16_activations = true;
      o.logit_route = true;
      o.x_written_earlier = form != 3;
      if (form == 2) o.shared_gate_logit = gate_logit;
      const FusedRouter router{mats[step % routers], static_cast<int>(kE), logits, router_counters};
      const FusedSharedExpert* in = form >= 2 ? &inside : nullptr;
      const FusedRouter* rt = form == 3 ? &router : nullptr;
      grid = OneTokenFusedGridBlocks(o, in, rt);
      if (probed) {
        Stamp* rows = fused_stamps + static_cast<size_t>(step % steps) * grid * kFusedProbeWords;
        BENCH_CHECK(LaunchOneTokenMoeFusedProbed(o, in, s, rt, rows));
      } else {
        BENCH_CHECK(LaunchOneTokenMoeFused(o, in, s, rt));
      }
      if (with_shared) BENCH_CHECK(cudaStreamWaitEvent(s, join_event));
      ++step;
    };
    step = 0;
    fused();
    BENCH_CHECK(cudaDeviceSynchronize());
    step = 0;
    const double us = bench::GraphUs(fused, steps);
    const char* shared_form[] = {"", ", shared expert beside", ", shared expert inside",
                                 ", shared expert and router product inside"};
    std::printf("one-token probe (one fused kernel, int16, logit routing, x early%s): graph %.2f us/layer\n",
                shared_form[form], us);
    if (form >= 2) {  // the decode stage's forms: where the layer's time goes inside the grid
      probed = true;
      step = 0;
      fused();  // once outside capture (the probed kernel's attributes)
      BENCH_CHECK(cudaDeviceSynchronize());
      step = 0;
      const float ms = bench::StampedReplayMs(
          fused, steps, [&](cudaStream_t st) { BENCH_CHECK(cudaMemsetAsync(fused_stamps, 0, fused_stamp_bytes, st)); },
          [](cudaStream_t) {});
      std::vector<Stamp> host(fused_stamp_bytes / sizeof(Stamp));
      BENCH_CHECK(cudaMemcpy(host.data(), fused_stamps, fused_stamp_bytes, cudaMemcpyDeviceToHost));
      const std::string what = std::string("one fused kernel") + shared_form[form];
      std::printf("one-token probe (%s): %.2f us/layer in the stamped replay\n", what.c_str(), ms * 1e3 / steps);
      ReportFused(host, steps, grid, what.c_str());
      probed = false;
    }
  }
  BENCH_CHECK(cudaFree(fused_stamps));
  BENCH_CHECK(cudaFree(ys));
  BENCH_CHECK(cudaFree(router_counters));
  for (float* m : mats) BENCH_CHECK(cudaFree(m));
  for (void* p : std::initializer_list<void*>{layer.gate, layer.up, layer.down, table, logits, act, shared, gate_logit,
                                              y, picks, ints, stamps, counts, shared_gate, shared_up, shared_down,
                                              shared_act, shared_out, shared_units}) {
    BENCH_CHECK(cudaFree(p));
  }
  BENCH_CHECK(cudaEventDestroy(fork_event));
  BENCH_CHECK(cudaEventDestroy(join_event));
  BENCH_CHECK(cudaStreamDestroy(side));
}

}  // namespace tandem::cuda::moe_bench
