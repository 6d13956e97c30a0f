#include "tests/gpu_backend/step_probe_report.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"
#include "gpu_service/backends/cuda/kernels/attention_probe.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit_probe.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"
#include "gpu_service/backends/cuda/kernels/gdn_decode_out_probe.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "tests/gpu/bench_util.h"

namespace tandem {
namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// One armed stamp buffer of the step: `capacity` rows of `words` u64, zeroed and handed to `arm`
// (SetStreamMatVecProbe, SetGdnOutProbe, SetFusedMoeProbe, ...: the same signature) by Arm; copied
// back by Read; Disarm hands the probe nullptr.
struct ArmedStamps {
  using ArmFn = cudaError_t (*)(unsigned long long*, unsigned, cudaStream_t);
  ArmFn arm;
  unsigned capacity;
  int words;
  cuda::DeviceBuffer buffer;
  size_t bytes() const { return size_t{capacity} * static_cast<size_t>(words) * 8; }
  absl::Status Arm() {
    absl::StatusOr<cuda::DeviceBuffer> b = cuda::DeviceBuffer::Allocate(bytes());
    if (!b.ok()) return b.status();
    buffer = std::move(*b);
    if (absl::Status s = Cuda(cudaMemset(buffer.get(), 0, bytes()), "memset"); !s.ok()) return s;
    return Cuda(arm(buffer.as<unsigned long long>(), capacity, nullptr), "arm");
  }
  absl::Status Read(std::vector<unsigned long long>* host) const {
    host->resize(bytes() / 8);
    return Cuda(cudaMemcpy(host->data(), buffer.get(), bytes(), cudaMemcpyDeviceToHost), "copy");
  }
  absl::Status Disarm() const { return Cuda(arm(nullptr, 0, nullptr), "disarm"); }
};

// The stamped rows of an armed buffer in slot order (`words` u64 a row; a row counts once its
// exit word is written) and the launches' grid (the largest block index, masked, + 1).
struct StampedRows {
  int rows = 0;
  unsigned long long grid = 0;
};
StampedRows CountStampedRows(const std::vector<unsigned long long>& h, unsigned capacity, int words, int exit_word,
                             int block_word, unsigned long long block_mask = ~0ull) {
  StampedRows r;
  while (r.rows < static_cast<int>(capacity) && h[size_t(r.rows) * words + exit_word] != 0) {
    r.grid = std::max(r.grid, (h[size_t(r.rows) * words + block_word] & block_mask) + 1);
    ++r.rows;
  }
  return r;
}

// One phase's first, median and last block of each launch (bench::StampUs, us after the launch's
// t0), and their medians over the launches: a row of the reports' tables.
struct PhaseSpread {
  std::vector<double> at[3];  // first, median, last
  void Add(const std::vector<const unsigned long long*>& launch, int word, unsigned long long t0) {
    for (int w = 0; w < 3; ++w) at[w].push_back(bench::StampUs(launch, word, t0, w - 1));
  }
  bool empty() const { return at[0].empty(); }
  // "%12.2f %12.2f %12.2f" of the three medians.
  void Print() const {
    printf("%12.2f %12.2f %12.2f\n", bench::Median(at[0]), bench::Median(at[1]), bench::Median(at[2]));
  }
};

// The fused GDN kernels' stamps (gdn_decode_out_probe.h) of the step, launch k (the GDN layers in
// order, blocks in consecutive slots) against the product probe's launch k: per phase, the first,
// median and last block in us after that product's first wait return (the MoE kernel's end); then
// the clusters (8 blocks) by when their last block became resident: the 1st, 8th, next-to-last and
// last cluster's entry and exit. A cluster that becomes resident only when the product's last
// blocks leave shows as a late last cluster.
void ReportGdnKernels(const std::vector<unsigned long long>& h, unsigned capacity,
                      const std::vector<unsigned long long>& product_t0) {
  using namespace cuda;
  const auto [rows, grid] = CountStampedRows(h, capacity, kGdnOutProbeWords, kGdnOutProbeExit, kGdnOutProbeBlock, 0xFFFF);
  if (rows == 0 || rows % grid != 0) {
    printf("GDN kernel probe: %d stamped blocks (grid %llu): no whole launches\n", rows, grid);
    return;
  }
  const size_t n = static_cast<size_t>(rows / grid);
  const char* names[] = {"entry (resident)", "state read",  "conv input read", "recurrence summed",
                         "z read",           "sums barrier passed", "output rows landed", "output added",
                         "exit"};
  static_assert(sizeof(names) / sizeof(names[0]) == kGdnOutProbeStamps, "a name a stamp");
  std::vector<PhaseSpread> spread(kGdnOutProbeStamps);
  std::vector<double> c1, c8, cprev, clast, c1_exit, clast_exit, sms;
  for (size_t k = 0; k < n && k < product_t0.size(); ++k) {
    std::vector<const unsigned long long*> launch;
    for (unsigned long long b = 0; b < grid; ++b) launch.push_back(&h[(k * grid + b) * kGdnOutProbeWords]);
    const unsigned long long t0 = product_t0[k];
    for (int p = 0; p < kGdnOutProbeStamps; ++p) spread[p].Add(launch, p, t0);
    // Clusters: entry = their last block's, exit = their last block's.
    std::vector<std::pair<double, double>> clusters(1024, {-1e30, -1e30});
    std::vector<int> per_sm(1024, 0);
    size_t count = 0;
    for (const unsigned long long* row : launch) {
      const size_t c = std::min<size_t>(row[kGdnOutProbeBlock] >> 16, 1023);
      count = std::max(count, c + 1);
      const double entry = (static_cast<double>(row[kGdnOutProbeEntry]) - static_cast<double>(t0)) * 1e-3;
      const double exit = (static_cast<double>(row[kGdnOutProbeExit]) - static_cast<double>(t0)) * 1e-3;
      clusters[c].first = std::max(clusters[c].first, entry);
      clusters[c].second = std::max(clusters[c].second, exit);
      ++per_sm[std::min<unsigned long long>(row[kGdnOutProbeSm], 1023)];
    }
    clusters.resize(count);
    std::sort(clusters.begin(), clusters.end());
    c1.push_back(clusters.front().first);
    c1_exit.push_back(clusters.front().second);
    c8.push_back(clusters[std::min<size_t>(7, count - 1)].first);
    cprev.push_back(clusters[count >= 2 ? count - 2 : 0].first);
    clast.push_back(clusters.back().first);
    clast_exit.push_back(clusters.back().second);
    sms.push_back(static_cast<double>(std::count_if(per_sm.begin(), per_sm.end(), [](int c) { return c > 0; })));
  }
  printf("GDN kernel probe: %zu launches of %llu blocks\n", n, grid);
  printf("  %-26s %12s %12s %12s   (us after the layer's product's first wait return; median over launches)\n",
         "phase", "first block", "median", "last block");
  for (int p = 0; p < kGdnOutProbeStamps; ++p) {
    printf("  %-26s ", names[p]);
    spread[p].Print();
  }
  printf("  clusters by entry (their last block's): 1st %.2f (exit %.2f), 8th %.2f, next-to-last %.2f, last %.2f "
         "(exit %.2f); SMs used %.0f (medians over launches)\n",
         bench::Median(c1), bench::Median(c1_exit), bench::Median(c8), bench::Median(cprev), bench::Median(clast),
         bench::Median(clast_exit), bench::Median(sms));
}

// The fused one-token MoE kernels' stamps of the step (expert_decode_fused_probe.h, armed buffer):
// the rows sorted by their PDL wait's return (a launch's blocks return within a few us of each
// other, after the kernels between two MoE launches), cut into launches of `grid` rows (grid: the
// largest block index + 1); then, per phase, the first, median and last block in us after the
// launch's first wait return, medians over launches, for the routed and the shared-expert blocks.
void ReportMoeKernels(const std::vector<unsigned long long>& h, unsigned capacity) {
  using namespace cuda;
  std::vector<const unsigned long long*> rows;
  unsigned long long grid = 0;
  for (unsigned i = 0; i < capacity; ++i) {
    const unsigned long long* r = &h[size_t(i) * kFusedProbeWords];
    if (r[kFusedProbeExit] == 0 || r[kFusedProbeAfterWait] == 0) continue;
    rows.push_back(r);
    grid = std::max(grid, r[kFusedProbeBlock] + 1);
  }
  if (rows.empty() || rows.size() % grid != 0) {
    printf("MoE kernel probe: %zu stamped blocks (grid %llu): no whole launches\n", rows.size(), grid);
    return;
  }
  std::sort(rows.begin(), rows.end(), [](const unsigned long long* a, const unsigned long long* b) {
    return a[kFusedProbeAfterWait] < b[kFusedProbeAfterWait];
  });
  const size_t n = rows.size() / grid;
  struct Phase {
    int word;
    const char* name;
  };
  const Phase phases[] = {{kFusedProbeEntry, "entry (resident)"},
                          {kFusedProbeAfterWait, "PDL wait returned"},
                          {kFusedProbeLogitsLoaded, "logits loaded"},
                          {kFusedProbePicked, "picked"},
                          {kFusedProbeRouted, "routed (block barrier)"},
                          {kFusedProbeGateUpLanded, "gate/up rows landed (warp 0)"},
                          {kFusedProbeActWritten, "act written"},
                          {kFusedProbeActGathered, "act gathered (pushes landed)"},
                          {kFusedProbeDownLanded, "down rows landed"},
                          {kFusedProbeSummed, "sums issued"},
                          {kFusedProbeExit, "exit"}};
  constexpr int kPhases = sizeof(phases) / sizeof(phases[0]);
  PhaseSpread stat[2][kPhases];  // [routed, shared][phase]
  size_t overlapped = 0;
  for (size_t k = 0; k < n; ++k) {
    std::vector<const unsigned long long*> launch(rows.begin() + k * grid, rows.begin() + (k + 1) * grid);
    std::vector<char> seen(grid, 0);
    for (const unsigned long long* r : launch) seen[r[kFusedProbeBlock]] = 1;
    if (std::count(seen.begin(), seen.end(), 1) != static_cast<long>(grid)) ++overlapped;
    unsigned long long t0 = ~0ull;
    for (const unsigned long long* r : launch) t0 = std::min(t0, r[kFusedProbeAfterWait]);
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<const unsigned long long*> of_kind;
      for (const unsigned long long* r : launch) {
        if (r[kFusedProbeKind] == static_cast<unsigned long long>(kind == 0 ? kFusedProbeRoutedKind : kFusedProbeSharedKind)) {
          of_kind.push_back(r);
        }
      }
      if (of_kind.empty()) continue;
      for (int p = 0; p < kPhases; ++p) {
        stat[kind][p].Add(of_kind, phases[p].word, t0);
      }
    }
  }
  printf("MoE kernel probe: %zu launches of %llu blocks%s\n", n, grid,
         overlapped != 0 ? " (some launches' blocks interleaved: the cut is not exact)" : "");
  for (int kind = 0; kind < 2; ++kind) {
    if (stat[kind][0].empty()) continue;
    printf("  %-8s %-30s %12s %12s %12s   (us after the launch's first wait return; median over launches)\n",
           kind == 0 ? "routed" : "shared", "phase", "first block", "median", "last block");
    for (int p = 0; p < kPhases; ++p) {
      if (kind == 1 && (phases[p].word == kFusedProbeLogitsLoaded || phases[p].word == kFusedProbePicked)) continue;
      printf("  %-8s %-30s ", "", phases[p].name);
      stat[kind][p].Print();
    }
  }
}

// One armed buffer's table (ReportArmedPhases): the rows' layout (`words` u64 a row; the words of
// the block index, the exit and the wait return), the phases to print, and a fact word whose
// nonzero blocks a launch counts.
struct ArmedPhaseTable {
  const char* title;
  int words, block_word, exit_word, wait_word, count_word;
  const char* counted;  // what the count says, after the launch's block count
  struct Phase {
    int word;
    const char* name;
  };
  std::vector<Phase> phases;
};

// The stamps of one armed buffer of the step whose launches all have the same grid and whose
// blocks of one launch hold consecutive slots (launches several kernels apart): per phase, the
// first, median and last block in us after the launch's first wait return (blocks that left
// before their wait have only the phases they passed; a launch with no block past its wait is
// left out), and the median count of the launches' blocks with the fact word set.
void ReportArmedPhases(const ArmedPhaseTable& t, const std::vector<unsigned long long>& h, unsigned capacity) {
  const auto [rows, grid] = CountStampedRows(h, capacity, t.words, t.exit_word, t.block_word);
  if (rows == 0 || rows % grid != 0) {
    printf("%s: %d stamped blocks (grid %llu): no whole launches\n", t.title, rows, grid);
    return;
  }
  std::vector<PhaseSpread> stat(t.phases.size());
  std::vector<double> counted;
  const size_t n = static_cast<size_t>(rows) / grid;
  for (size_t k = 0; k < n; ++k) {
    std::vector<const unsigned long long*> launch;
    unsigned long long t0 = ~0ull;
    int count = 0;
    for (unsigned long long b = 0; b < grid; ++b) {
      const unsigned long long* r = &h[(k * grid + b) * t.words];
      launch.push_back(r);
      if (r[t.wait_word] != 0) t0 = std::min(t0, r[t.wait_word]);
      count += r[t.count_word] != 0;
    }
    if (t0 == ~0ull) continue;
    counted.push_back(count);
    for (size_t p = 0; p < t.phases.size(); ++p) stat[p].Add(launch, t.phases[p].word, t0);
  }
  if (counted.empty()) {
    printf("%s: %zu launches of %llu blocks, none past its wait\n", t.title, n, grid);
    return;
  }
  printf("%s: %zu launches of %llu blocks, %.0f %s (median)\n", t.title, n, grid, bench::Median(counted), t.counted);
  printf("  %-24s %12s %12s %12s   (us after the launch's first wait return; median over launches)\n", "phase",
         "first block", "median", "last block");
  for (size_t p = 0; p < t.phases.size(); ++p) {
    printf("  %-24s ", t.phases[p].name);
    stat[p].Print();
  }
}

// The split attention's stamps (attention_probe.h's armed buffer): every launch has the same grid
// (row item, kv head, slice: one step's context); slices a short context leaves empty have only
// entry and exit; counted: the blocks with keys to attend to.
void ReportSplitAttention(const std::vector<unsigned long long>& h, unsigned capacity) {
  using namespace cuda;
  const ArmedPhaseTable t{"split attention probe", kAttnProbeWords, kAttnProbeBlock, kAttnProbeExit,
                          kAttnProbeAfterWait, kAttnProbeKeys, "with keys",
                          {{kAttnProbeEntry, "entry (row taken)"}, {kAttnProbeAfterWait, "PDL wait returned"},
                           {kAttnProbeQLoaded, "queries loaded"}, {kAttnProbeLoopDone, "keys and values done"},
                           {kAttnProbePartials, "partials written"}, {kAttnProbeExit, "exit"}}};
  ReportArmedPhases(t, h, capacity);
}

// The fused attention + o kernel's stamps (attention_out_fused.cuh's armed buffer), one launch an
// attention layer; counted: the blocks with keys (all of them).
void ReportAttentionOutFused(const std::vector<unsigned long long>& h, unsigned capacity) {
  using namespace cuda;
  const ArmedPhaseTable t{"attention + o fused probe", kAttnOutFusedProbeWords, kAttnOutFusedProbeBlock,
                          kAttnOutFusedProbeExit, kAttnOutFusedProbeAfterWait, kAttnOutFusedProbeKeys, "with keys",
                          {{kAttnOutFusedProbeEntry, "entry (row taken)"}, {kAttnOutFusedProbeAfterWait, "PDL wait returned"},
                           {kAttnOutFusedProbeAttended, "head attended"}, {kAttnOutFusedProbeRowsLanded, "x quantized, rows landed"},
                           {kAttnOutFusedProbeExit, "sums issued, exit"}}};
  ReportArmedPhases(t, h, capacity);
}

// The column-split output products' stamps (dense_colsplit_probe.h's armed buffer): attention's o
// with the split attention's merge inside, one launch an attention layer; counted: the blocks that
// merged attention slices.
void ReportColumnSplit(const std::vector<unsigned long long>& h, unsigned capacity) {
  using namespace cuda;
  const ArmedPhaseTable t{"output product (by columns) probe", kColSplitProbeWords, kColSplitProbeBlock,
                          kColSplitProbeExit, kColSplitProbeAfterWait, kColSplitProbeMerged, "merging attention slices",
                          {{kColSplitProbeEntry, "entry (row taken)"}, {kColSplitProbeIssued, "weight copies issued"},
                           {kColSplitProbeAfterWait, "PDL wait returned"}, {kColSplitProbeXFormed, "x formed (merged)"},
                           {kColSplitProbeRowsLanded, "weights landed"}, {kColSplitProbeExit, "sums issued, exit"}}};
  ReportArmedPhases(t, h, capacity);
}

}  // namespace

absl::Status ReportDecodeStepProbe(const std::function<absl::Status()>& step) {
  using namespace cuda;  // the probe's phase names
  constexpr unsigned kCapacity = 1 << 15;
  // The products' stamps, the fused GDN kernels' (gdn_decode_out_probe.h), the fused MoE kernels'
  // (expert_decode_fused_probe.h), the split attention's (attention_probe.h) and the output
  // products' by columns (dense_colsplit_probe.h), all of the same step.
  constexpr unsigned kGdnCapacity = 1 << 14, kMoeCapacity = 1 << 15, kAttnCapacity = 1 << 14, kOutCapacity = 1 << 14;
  ArmedStamps armed[] = {{SetStreamMatVecProbe, kCapacity, kStreamProbeWords, {}},
                         {SetGdnOutProbe, kGdnCapacity, kGdnOutProbeWords, {}},
                         {SetFusedMoeProbe, kMoeCapacity, kFusedProbeWords, {}},
                         {SetArmedSplitAttentionProbe, kAttnCapacity, kAttnProbeWords, {}},
                         {SetArmedColumnSplitProbe, kOutCapacity, kColSplitProbeWords, {}},
                         {SetArmedAttentionOutFusedProbe, kOutCapacity, kAttnOutFusedProbeWords, {}}};
  for (ArmedStamps& a : armed) {
    if (absl::Status s = a.Arm(); !s.ok()) return s;
  }
  if (absl::Status s = Cuda(cudaDeviceSynchronize(), "sync"); !s.ok()) return s;
  const absl::Status stepped = step();
  const absl::Status synced = Cuda(cudaDeviceSynchronize(), "sync");
  std::vector<unsigned long long> h, gh, mh, ah, oh, fh;
  std::vector<absl::Status> results = {stepped,           synced,            armed[0].Read(&h),
                                       armed[1].Read(&gh), armed[2].Read(&mh), armed[3].Read(&ah),
                                       armed[4].Read(&oh), armed[5].Read(&fh)};
  for (const ArmedStamps& a : armed) results.push_back(a.Disarm());
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  // Rows in slot order: blocks of one launch take consecutive slots (dense_matvec_probe.h), and
  // every GDN layer's product has the same grid, so launch k holds slots [k·grid, (k + 1)·grid).
  const auto [rows, grid] = CountStampedRows(h, kCapacity, kStreamProbeWords, kStreamProbeExit, kStreamProbeBlock);
  if (rows == 0) return absl::InternalError("no stamped block: the GDN input products did not take the probe");
  if (rows % grid != 0) return absl::InternalError(absl::StrCat(rows, " stamped blocks, not launches of ", grid));
  std::vector<std::vector<const unsigned long long*>> launches(static_cast<size_t>(rows / grid));
  for (int r = 0; r < rows; ++r) launches[static_cast<size_t>(r / grid)].push_back(&h[size_t(r) * kStreamProbeWords]);
  const char* names[] = {"entry (resident)", "first ring issued", "PDL wait returned", "x formed (staged)",
                         "first row group streamed", "last row group streamed", "last group reduced", "exit"};
  // Per launch, all relative to its earliest wait return: each phase's median and last block
  // (bench::StampUs) and the share of blocks resident before that return; then who arrives when:
  // the blocks that walk two row groups (their last group's stamp differs from their first's)
  // against those that walk one, and how the launch sat on the SMs. Whether the blocks with the
  // longer walk are resident long before the wait (and on SMs the MoE kernel left free) decides
  // whether their second group could be fetched under the MoE kernel.
  std::vector<std::vector<double>> median(kStreamProbeStamps), last(kStreamProbeStamps);
  std::vector<double> early_share, two_entry, two_exit, one_entry, one_exit, earliest, sms, most_per_sm, early5;
  std::vector<unsigned long long> launch_t0;  // each launch's first wait return (the MoE kernel's end)
  for (const auto& launch : launches) {
    unsigned long long t0 = ~0ull;
    for (const unsigned long long* row : launch) t0 = std::min(t0, row[kStreamProbeAfterWait]);
    launch_t0.push_back(t0);
    std::vector<const unsigned long long*> two, one;
    std::vector<int> per_sm(1024, 0);
    int early = 0, early_by_5us = 0;
    for (const unsigned long long* row : launch) {
      early += row[kStreamProbeEntry] < t0;
      early_by_5us += row[kStreamProbeEntry] + 5000 < t0;
      (row[kStreamProbeLastGroup] != row[kStreamProbeFirstGroup] ? two : one).push_back(row);
      ++per_sm[std::min<unsigned long long>(row[kStreamProbeSm], 1023)];
    }
    early_share.push_back(static_cast<double>(early) / static_cast<double>(launch.size()));
    for (int p = 0; p < kStreamProbeStamps; ++p) {
      median[p].push_back(bench::StampUs(launch, p, t0, 0));
      last[p].push_back(bench::StampUs(launch, p, t0, 1));
    }
    if (!two.empty()) {
      two_entry.push_back(bench::StampUs(two, kStreamProbeEntry, t0, 0));
      two_exit.push_back(bench::StampUs(two, kStreamProbeExit, t0, 0));
    }
    if (!one.empty()) {
      one_entry.push_back(bench::StampUs(one, kStreamProbeEntry, t0, 0));
      one_exit.push_back(bench::StampUs(one, kStreamProbeExit, t0, 0));
    }
    earliest.push_back(bench::StampUs(launch, kStreamProbeEntry, t0, -1));
    sms.push_back(static_cast<double>(std::count_if(per_sm.begin(), per_sm.end(), [](int c) { return c > 0; })));
    most_per_sm.push_back(*std::max_element(per_sm.begin(), per_sm.end()));
    early5.push_back(early_by_5us);
  }
  printf("GDN input product probe: %zu launches of %llu blocks; blocks resident before the first wait returned: "
         "median %.2f of a launch\n",
         launches.size(), grid, bench::Median(early_share));
  printf("  %-26s %18s %18s   (us after the launch's first wait return; median over launches)\n", "phase",
         "median block", "last block");
  for (int p = 0; p < kStreamProbeStamps; ++p) {
    printf("  %-26s %18.2f %18.2f\n", names[p], bench::Median(median[p]), bench::Median(last[p]));
  }
  auto median_or_0 = [](const std::vector<double>& v) { return v.empty() ? 0.0 : bench::Median(v); };
  printf("  two-group blocks (%s): entry %.2f, exit %.2f (medians); one-group: entry %.2f, exit %.2f\n",
         two_entry.empty() ? "none" : "median over launches", median_or_0(two_entry), median_or_0(two_exit),
         median_or_0(one_entry), median_or_0(one_exit));
  printf("  earliest entry %.2f us; blocks resident more than 5 us before the wait: %.0f; SMs used %.0f, "
         "at most %.0f blocks an SM (medians over launches)\n",
         bench::Median(earliest), bench::Median(early5), bench::Median(sms), bench::Median(most_per_sm));
  ReportGdnKernels(gh, kGdnCapacity, launch_t0);
  ReportMoeKernels(mh, kMoeCapacity);
  ReportSplitAttention(ah, kAttnCapacity);
  ReportColumnSplit(oh, kOutCapacity);
  ReportAttentionOutFused(fh, kOutCapacity);
  return absl::OkStatus();
}

}  // namespace tandem
