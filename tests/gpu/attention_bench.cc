// Micro-benchmark of full attention on Qwen3-Next-80B shapes (nh 16, kvh 2, hd 256, f32 paged
// cache with scattered pages): decode at ctx 4096 and 32768 (batch 1, and batch 8 / 32 at 4096)
// on the unsplit path (the earlier interface: one block per item and kv head) and the planned
// split-KV path, with the KV bytes read as a share of a measured device copy; prefill of 4096 and
// 8192 tokens (causal, one sequence) and of 16 × 512 tokens on the exact path, the f16
// tensor-core path (the mma.sync pipelined kernel, and at hd 256 the wgmma kernel and its f16-tile
// form, TANDEM_ATTN_KV16=1, and that form's overlapped kernel, TANDEM_ATTN_KV16=2, each with a
// count of output floats whose bits differ, beside it) in
// TFLOP/s (4·n²/2·nh·hd flops per sequence), and the relative L2 of each fast output against the
// exact one; short decode contexts in one block against the split path (decode_b{1,3}_ctxN_short);
// decode in one launch (LaunchDecodeAttention) against the four launches it replaces
// (decode_b1_ctxN_fused). --probe: only the split attention's phase stamps at batch 1
// (attention_probe.h; probe_ctxN_<kind>_<phase> with the default merge launch, probe_inblock_ctxN_...
// with the merge in the last slice block; us after the launch's first block entry).
// Timing: CUDA events around `reps` calls after warm-up, median of 5 rounds. Prints "name value unit detail" lines.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_decode.cuh"
#include "gpu_service/backends/cuda/kernels/attention_probe.h"
#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "tests/gpu/bench_util.h"

namespace tandem::cuda {
namespace {

using bench::TimeMs;


void Report(const std::string& name, double value, const char* unit, const std::string& detail) {
  std::printf("%-36s %10.4g %-7s %s\n", name.c_str(), value, unit, detail.c_str());
  std::fflush(stdout);
}

// A device array of `count` floats uniform in [-1, 1) (a 1M-float random block, repeated).
float* RandomFloats(size_t count, uint64_t seed) {
  std::vector<float> block(std::min<size_t>(count, 1 << 20));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : block) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  float* d = nullptr;
  BENCH_CHECK(cudaMalloc(&d, count * sizeof(float)));
  for (size_t off = 0; off < count; off += block.size()) {
    BENCH_CHECK(cudaMemcpy(d + off, block.data(), std::min(block.size(), count - off) * sizeof(float),
                           cudaMemcpyHostToDevice));
  }
  return d;
}

template <typename T>
T* UploadVector(const std::vector<T>& v) {
  T* d = nullptr;
  BENCH_CHECK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)));
  BENCH_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Device copy rate (bytes read + written per second), the ceiling for streaming kernels.
double CopyGbs() {
  const size_t bytes = size_t{1} << 30;
  void *a, *b;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemset(a, 1, bytes));
  const double ms = TimeMs([&] { BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 5);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms * 1e6);
}

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// The split attention's phases (attention_probe.h) at batch 1 and `ctx` keys: nine stamped
// launches after a warm-up one, each phase's median (and the exit's worst) over the launches' blocks
// of three kinds (slices with keys, slices past the context, the merging block), in us after the
// launch's first block entry. `launch` runs the planned attention once.
void ProbeSplitAttention(const std::string& prefix, int ctx, int blocks, const std::function<void()>& launch) {
  unsigned long long* rows = nullptr;
  const size_t bytes = static_cast<size_t>(blocks) * kAttnProbeWords * sizeof(unsigned long long);
  BENCH_CHECK(cudaMalloc(&rows, bytes));
  launch();
  BENCH_CHECK(cudaDeviceSynchronize());
  SetSplitAttentionProbe(rows, blocks);
  const char* kinds[3] = {"keys", "empty", "merge"};
  const char* phases[kAttnProbePhases] = {"entry", "after_wait", "q_loaded", "loop_done", "partials", "exit"};
  std::vector<double> v[3][kAttnProbePhases];
  std::vector<unsigned long long> h(static_cast<size_t>(blocks) * kAttnProbeWords);
  for (int rep = 0; rep < 9; ++rep) {
    BENCH_CHECK(cudaMemset(rows, 0, bytes));
    launch();
    BENCH_CHECK(cudaDeviceSynchronize());
    BENCH_CHECK(cudaMemcpy(h.data(), rows, bytes, cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < blocks; ++b) t0 = std::min(t0, h[static_cast<size_t>(b) * kAttnProbeWords + kAttnProbeEntry]);
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* r = &h[static_cast<size_t>(b) * kAttnProbeWords];
      const int kind = r[kAttnProbeMerged] != 0 ? 2 : r[kAttnProbeKeys] > 0 ? 0 : 1;
      for (int p = 0; p < kAttnProbePhases; ++p) {
        if (r[p] != 0) v[kind][p].push_back(static_cast<double>(r[p] - t0) / 1000.0);
      }
    }
  }
  SetSplitAttentionProbe(nullptr, 0);
  BENCH_CHECK(cudaFree(rows));
  for (int k = 0; k < 3; ++k) {
    for (int p = 0; p < kAttnProbePhases; ++p) {
      std::vector<double>& x = v[k][p];
      if (x.empty()) continue;
      std::sort(x.begin(), x.end());
      char detail[96];
      std::snprintf(detail, sizeof(detail), "median of %zu stamps; max %.2f us", x.size(), x.back());
      Report(prefix + "ctx" + std::to_string(ctx) + "_" + kinds[k] + "_" + phases[p], x[x.size() / 2], "us", detail);
    }
  }
}

void Run(bool probe_only) {
  const AttnShape d{16, 2, 256, 64, 1e-6f};
  const int kvw = d.kv_width();
  const double copy_gbs = CopyGbs();
  Report("device_copy", copy_gbs, "GB/s", "cudaMemcpy D2D 1 GiB, read + write");

  // 32 page-table rows of 512 pages over 2048 physical pages in a fixed random order: rows 0..31
  // hold disjoint pages for contexts up to 4096, row 0 alone covers 32768.
  const int seq_pages = 32768 / kKvPageSize, rows = 32, total_pages = rows * 4096 / kKvPageSize;
  float* kc = RandomFloats(static_cast<size_t>(total_pages) * kKvPageSize * kvw, 1);
  float* vc = RandomFloats(static_cast<size_t>(total_pages) * kKvPageSize * kvw, 2);
  std::vector<int32_t> perm(static_cast<size_t>(total_pages));
  for (int i = 0; i < total_pages; ++i) perm[i] = i;
  uint64_t x = 12345;
  for (int i = total_pages - 1; i > 0; --i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(perm[i], perm[(x >> 33) % static_cast<uint64_t>(i + 1)]);
  }
  std::vector<int32_t> table(static_cast<size_t>(rows) * seq_pages);
  for (int s = 0; s < rows; ++s) {
    for (int p = 0; p < seq_pages; ++p) table[s * seq_pages + p] = perm[(s * 64 + p) % total_pages];
  }
  int32_t* d_table = UploadVector(table);
  const PagedKv cache{kc, vc, d_table, seq_pages};
  const int n_max = 8192;
  float* q = RandomFloats(static_cast<size_t>(n_max) * d.nh * d.hd, 3);
  float* qg = RandomFloats(static_cast<size_t>(n_max) * d.nh * 2 * d.hd, 4);
  float *o, *o_ref;
  BENCH_CHECK(cudaMalloc(&o, static_cast<size_t>(n_max) * d.nh * d.hd * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&o_ref, static_cast<size_t>(n_max) * d.nh * d.hd * sizeof(float)));
  void* scratch = nullptr;
  BENCH_CHECK(cudaMalloc(&scratch, AttentionMaxScratchBytes(d)));
  BENCH_CHECK(cudaMemset(scratch, 0, AttentionMaxScratchBytes(d)));  // the split tickets start at zero

  struct Step {
    std::vector<int32_t> seq, pos;
    int32_t *d_seq = nullptr, *d_pos = nullptr, *d_items = nullptr, *d_legacy = nullptr;
    AttentionPlan plan;
    int legacy_items = 0;
  };
  auto make_step = [&](int batch, int tokens, int first_pos, AttentionPrecision precision, int first_row = 0) {
    Step s;
    for (int b = 0; b < batch; ++b) {
      for (int t = 0; t < tokens; ++t) {
        s.seq.push_back(first_row + b);
        s.pos.push_back(first_pos + t);
      }
    }
    s.plan = PlanAttention(s.seq, d, precision);
    const std::vector<int32_t> legacy = PlanAttentionItems(s.seq, d.nh / d.kvh);
    s.legacy_items = static_cast<int>(legacy.size() / 2);
    s.d_seq = UploadVector(s.seq);
    s.d_pos = UploadVector(s.pos);
    s.d_items = UploadVector(s.plan.items);
    s.d_legacy = UploadVector(legacy);
    return s;
  };
  auto planned = [&](const Step& s, float* out) {
    BENCH_CHECK(LaunchAttention(q, qg, static_cast<int64_t>(s.seq.size()), d, s.plan, s.d_items, s.d_seq, s.d_pos,
                                cache, out, scratch, nullptr));
  };
  if (probe_only) {
    // The default (the merge launch after the split kernel: its blocks stamp no merge), then the
    // merge in the last slice block (probe_inblock_...: the merging block's phases too).
    const bool was_in_block = AttnMergeInBlock();
    for (const bool in_block : {false, true}) {
      SetAttnMergeInBlock(in_block);
      for (int ctx : {1, 128, 544, 4096}) {
        Step s = make_step(1, 1, ctx - 1, AttentionPrecision::kF32);
        ProbeSplitAttention(in_block ? "probe_inblock_" : "probe_", ctx,
                            s.plan.num_row_items * d.kvh * s.plan.num_splits, [&] { planned(s, o); });
      }
    }
    SetAttnMergeInBlock(was_in_block);
    return;
  }
  // The same cache with the f16 tiles (AttnKv16: the tile conversion once per call, then the
  // wgmma kernel copying f16 tiles), for the prefill rows below.
  PagedKv cache16 = cache;
  BENCH_CHECK(cudaMalloc(&cache16.f16_tiles, AttnKv16ScratchBytes(d, total_pages)));
  auto planned16 = [&](const Step& s, float* out) {
    BENCH_CHECK(LaunchAttention(q, qg, static_cast<int64_t>(s.seq.size()), d, s.plan, s.d_items, s.d_seq, s.d_pos,
                                cache16, out, scratch, nullptr));
  };
  // The earlier interface: the same exact kernel, one block per item and kv head (no split).
  auto unsplit = [&](const Step& s, float* out) {
    BENCH_CHECK(LaunchAttention(q, qg, static_cast<int64_t>(s.seq.size()), d, s.d_legacy, s.legacy_items, s.d_seq,
                                s.d_pos, cache, out, nullptr));
  };

  // Decode. Batches at ctx 4096 rotate over all 32 page-table rows (537 MB of KV) so that the
  // timed reads come from HBM, not from the 50 MB L2.
  struct DecodeCase {
    int batch, ctx;
  };
  for (const DecodeCase& dc : {DecodeCase{1, 4096}, DecodeCase{1, 32768}, DecodeCase{8, 4096}, DecodeCase{32, 4096}}) {
    const int rotations = dc.ctx <= 4096 ? rows / dc.batch : 1;
    std::vector<Step> steps;
    for (int r = 0; r < rotations; ++r) {
      steps.push_back(make_step(dc.batch, 1, dc.ctx - 1, AttentionPrecision::kF32, r * dc.batch));
    }
    const double bytes = 2.0 * dc.batch * dc.ctx * kvw * sizeof(float);
    const std::string name = "decode_b" + std::to_string(dc.batch) + "_ctx" + std::to_string(dc.ctx);
    for (int variant = 0; variant < 2; ++variant) {
      int next = 0;
      const double ms = TimeMs(
          [&] {
            const Step& s = steps[next++ % rotations];
            variant == 0 ? unsplit(s, o_ref) : planned(s, o);
          },
          variant == 0 && dc.ctx > 8192 ? 3 : 32);
      char detail[200];
      std::snprintf(detail, sizeof(detail), "%.0f GB/s KV read = %.1f%% of copy (%d splits)", bytes / (ms * 1e6),
                    100.0 * bytes / (ms * 1e6) / copy_gbs, variant == 0 ? 1 : steps[0].plan.num_splits);
      Report(name + (variant == 0 ? "_unsplit" : "_split"), ms * 1e3, "us", detail);
    }
    // Both outputs now hold the last step of the rotation.
    const Step& last = steps[(rotations - 1)];
    planned(last, o);
    unsplit(last, o_ref);
    std::vector<float> a(static_cast<size_t>(last.seq.size()) * d.nh * d.hd), b(a.size());
    BENCH_CHECK(cudaMemcpy(a.data(), o, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), o_ref, b.size() * sizeof(float), cudaMemcpyDeviceToHost));
    Report(name + "_split_vs_unsplit", RelL2(a, b), "rel_l2", "both exact: ~1e-7 expected");
  }

  // The split count's effect at batch 1 (the plan's choice is printed above): plans edited by
  // hand, scratch within AttentionMaxScratchBytes (at most 264 blocks).
  // ctx 128: the end-to-end bench's decode context (gpu_backend_bench: 3 + 128 + 4 steps). This and
  // the next section time the split path at every context (TANDEM_OLD_ATTN_SPLIT=1).
  const bool saved_old_split = OldAttnSplit();
  SetOldAttnSplit(true);
  for (int ctx : {128, 4096, 32768}) {
    Step s = make_step(1, 1, ctx - 1, AttentionPrecision::kF32);
    const double bytes = 2.0 * ctx * kvw * sizeof(float);
    for (int splits : {8, 16, 33, 66, 128}) {
      s.plan.num_splits = splits;
      const double ms = TimeMs([&] { planned(s, o); }, 20);
      char detail[120];
      std::snprintf(detail, sizeof(detail), "%.1f%% of copy (L2-warm at ctx 4096)",
                    100.0 * bytes / (ms * 1e6) / copy_gbs);
      Report("decode_b1_ctx" + std::to_string(ctx) + "_splits" + std::to_string(splits), ms * 1e3, "us", detail);
    }
  }

  // The slices merged by their last block (TANDEM_ATTN_MERGE_IN_BLOCK=1) against SplitAttention +
  // the merge launch (the default), batch 1 at the plan's split count, GPU-side time of 20 launches
  // replayed from one graph (PDL edges as in a captured decode step); L2-warm cache.
  for (int ctx : {128, 520, 4096, 32768}) {
    Step s = make_step(1, 1, ctx - 1, AttentionPrecision::kF32);
    const bool saved = OldAttnDecode(), saved_in_block = AttnMergeInBlock();
    SetOldAttnDecode(false);
    double us[2];
    for (int old = 0; old < 2; ++old) {
      SetAttnMergeInBlock(old == 0);
      auto launch = [&] {
        BENCH_CHECK(LaunchAttention(q, qg, 1, d, s.plan, s.d_items, s.d_seq, s.d_pos, cache, o, scratch,
                                    bench::LaunchStream()));
      };
      launch();  // outside the capture: the kernels' one-time attributes
      us[old] = bench::GraphUs(launch);
    }
    SetOldAttnDecode(saved);
    SetAttnMergeInBlock(saved_in_block);
    char detail[120];
    std::snprintf(detail, sizeof(detail), "%d splits; merge launch (the default): %.2f us",
                  s.plan.num_splits, us[1]);
    Report("decode_b1_ctx" + std::to_string(ctx) + "_merged_in_block", us[0], "us", detail);
  }
  SetOldAttnSplit(saved_old_split);

  // Short contexts in one block (AttnShortKeys, the default) against the split + merge path at every
  // context (TANDEM_OLD_ATTN_SPLIT=1) and the whole-context walk forced at every context (bound
  // 2^30): GPU-side us per launch, 20 launches replayed from one graph (PDL edges as in a captured
  // decode step), merge launch (the default merge mode); L2-warm cache. Batch 1 and batch 3 (rows
  // 0..2, the same context). The crossover of "split" and "whole" is where the bound belongs.
  for (int batch : {1, 3}) {
    for (int ctx : {1, 32, 64, 128, 135, 192, 256, 384, 512, 1024, 2048, 4096, 8192}) {
      Step s = make_step(batch, 1, ctx - 1, AttentionPrecision::kF32);
      const bool saved_old = OldAttnSplit();
      const int saved_keys = AttnShortKeys();
      double us[3];  // default, split path, whole forced
      for (int variant = 0; variant < 3; ++variant) {
        SetOldAttnSplit(variant == 1);
        SetAttnShortKeys(variant == 2 ? (1 << 30) : saved_keys);
        auto launch = [&] {
          BENCH_CHECK(LaunchAttention(q, qg, batch, d, s.plan, s.d_items, s.d_seq, s.d_pos, cache, o, scratch,
                                      bench::LaunchStream()));
        };
        launch();  // outside the capture: the kernels' one-time attributes
        us[variant] = bench::GraphUs(launch);
      }
      SetOldAttnSplit(saved_old);
      SetAttnShortKeys(saved_keys);
      char detail[160];
      std::snprintf(detail, sizeof(detail),
                    "bound %d keys; split+merge (TANDEM_OLD_ATTN_SPLIT=1) %.2f us; whole %.2f us; %d splits", saved_keys,
                    us[1], us[2], s.plan.num_splits);
      Report("decode_b" + std::to_string(batch) + "_ctx" + std::to_string(ctx) + "_short", us[0], "us", detail);
    }
  }

  // Decode in one launch (LaunchDecodeAttention: norms, RoPE, append, split attention and merge)
  // against the launches it replaces on one stream (QueryNormRope, KvAppend, LaunchAttention: split
  // + merge launch), batch 1 from one stacked [qg | k | v] row: GPU-side us per step, 20 steps
  // replayed from one graph (PDL edges as in a captured decode step); L2-warm cache.
  {
    const int64_t qgw = static_cast<int64_t>(d.nh) * 2 * d.hd, stride = qgw + 2 * kvw;
    float* qkv = RandomFloats(static_cast<size_t>(stride), 5);
    float* q_norm = RandomFloats(static_cast<size_t>(d.hd), 6);
    float* k_norm = RandomFloats(static_cast<size_t>(d.hd), 7);
    double* inv_freq = UploadVector(RopeInvFrequencies(1e7, d.rot));
    float* q_out = nullptr;
    BENCH_CHECK(cudaMalloc(&q_out, static_cast<size_t>(d.nh) * d.hd * sizeof(float)));
    const QkvRows rows{qkv, stride, qkv + qgw, stride, qkv + qgw + kvw, stride};
    for (int ctx : {1, 128, 544, 1024, 4096}) {
      Step s = make_step(1, 1, ctx - 1, AttentionPrecision::kF32);
      auto unfused = [&] {
        const cudaStream_t st = bench::LaunchStream();
        BENCH_CHECK(LaunchQueryNormRope(qkv, 1, d, q_norm, inv_freq, s.d_pos, q_out, st, stride));
        BENCH_CHECK(LaunchKvAppend(qkv + qgw, qkv + qgw + kvw, 1, d, k_norm, inv_freq, s.d_seq, s.d_pos, cache, st,
                                   stride));
        BENCH_CHECK(LaunchAttention(q_out, qkv, 1, d, s.plan, s.d_items, s.d_seq, s.d_pos, cache, o, scratch, st,
                                    stride));
      };
      auto fused = [&] {
        BENCH_CHECK(LaunchDecodeAttention(rows, 1, d, q_norm, k_norm, inv_freq, s.plan, s.d_items, s.d_seq, s.d_pos,
                                          cache, o, scratch, bench::LaunchStream()));
      };
      unfused();  // outside the capture: the kernels' one-time attributes
      fused();
      const double us_unfused = bench::GraphUs(unfused), us_fused = bench::GraphUs(fused);
      char detail[160];
      std::snprintf(detail, sizeof(detail), "the four launches it replaces %.2f us; %d splits, short-walk bound %d",
                    us_unfused, s.plan.num_splits, AttnShortKeys());
      Report("decode_b1_ctx" + std::to_string(ctx) + "_fused", us_fused, "us", detail);
    }
  }

  // Prefill from position 0: one sequence of 4096 and of 8192 tokens, and 16 sequences of 512
  // batched (disjoint page-table rows). The tensor-core plan runs on the pipelined kernel
  // (LaunchAttention) and, for comparison, on the earlier 64-row kernel over the same items.
  struct PrefillCase {
    int batch, tokens;
  };
  for (const PrefillCase& pc : {PrefillCase{1, 4096}, PrefillCase{1, 8192}, PrefillCase{16, 512}}) {
    const int n = pc.tokens;
    const double flops = pc.batch * 4.0 * n * n / 2.0 * d.nh * d.hd;
    std::string name = "prefill_";
    if (pc.batch > 1) name += std::string("b") + std::to_string(pc.batch) + "x";
    name += std::to_string(n);
    const Step exact = make_step(pc.batch, n, 0, AttentionPrecision::kF32);
    const Step fast = make_step(pc.batch, n, 0, AttentionPrecision::kF16TensorCores);
    const double ms_exact = TimeMs([&] { planned(exact, o_ref); }, 1);
    Report(name + "_f32", flops / (ms_exact * 1e9), "TFLOP/s",
           std::to_string(ms_exact) + " ms, exact split kernel, 1 block per token and kv head");
    const bool wgmma_default = AttnTcWgmma();
    SetAttnTcWgmma(false);  // _f16tc: the mma.sync pipelined kernel, whatever TANDEM_ATTN_TC_WGMMA says
    const double ms_fast = TimeMs([&] { planned(fast, o); }, 5);
    Report(name + "_f16tc", flops / (ms_fast * 1e9), "TFLOP/s",
           std::to_string(ms_fast) + " ms, pipelined kernel, " + std::to_string(fast.plan.num_tile_items) +
               " tiles of " + std::to_string(kTcRows) + " rows per kv head");
    const size_t count = static_cast<size_t>(pc.batch) * n * d.nh * d.hd;
    std::vector<float> a(count), b(count);
    BENCH_CHECK(cudaMemcpy(a.data(), o, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), o_ref, b.size() * sizeof(float), cudaMemcpyDeviceToHost));
    Report(name + "_f16tc_vs_f32", RelL2(a, b), "rel_l2", "tolerance 1e-2");
    if (d.hd == 256) {
      // The wgmma kernel (attention_tc_wgmma.cu) on the same plan and items.
      SetAttnTcWgmma(true);
      const double ms_wg = TimeMs([&] { planned(fast, o); }, 5);
      Report(name + "_f16tc_wgmma", flops / (ms_wg * 1e9), "TFLOP/s",
             std::to_string(ms_wg) + " ms, wgmma kernel (TANDEM_ATTN_TC_WGMMA=1), " +
                 std::to_string(ms_fast / ms_wg) + "x the pipelined kernel");
      std::vector<float> w(count);
      BENCH_CHECK(cudaMemcpy(w.data(), o, w.size() * sizeof(float), cudaMemcpyDeviceToHost));
      Report(name + "_f16tc_wgmma_vs_f32", RelL2(w, b), "rel_l2", "tolerance 1e-2, ~ the pipelined kernel's");
      Report(name + "_f16tc_wgmma_vs_mma", RelL2(w, a), "rel_l2", "same f16 roundings: << 1e-3 expected");
      // The f16-tile path (TANDEM_ATTN_KV16=1, attention_kv16.cu; its conversion launch included)
      // on the same plan: bit-identical to the wgmma kernel (w), so its row counts the output
      // floats whose bits differ (0 expected).
      const int kv16_default = AttnKv16Mode();
      SetAttnKv16Mode(1);
      const double ms_kv16 = TimeMs([&] { planned16(fast, o); }, 5);
      Report(name + "_f16tc_wgmma_kv16", flops / (ms_kv16 * 1e9), "TFLOP/s",
             std::to_string(ms_kv16) + " ms, f16 tiles converted once (TANDEM_ATTN_KV16=1), " +
                 std::to_string(ms_wg / ms_kv16) + "x the wgmma kernel");
      std::vector<float> k16(count);
      BENCH_CHECK(cudaMemcpy(k16.data(), o, k16.size() * sizeof(float), cudaMemcpyDeviceToHost));
      size_t differ = 0;
      for (size_t i = 0; i < count; ++i) differ += std::memcmp(&k16[i], &w[i], sizeof(float)) != 0;
      Report(name + "_f16tc_wgmma_kv16_bits_differ", static_cast<double>(differ), "floats",
             "of " + std::to_string(count) + " output floats against the wgmma kernel's: 0 expected");
      // Its overlapped form (TANDEM_ATTN_KV16=2: S(t + 1) issued before the softmax of tile t),
      // bit-identical to both.
      SetAttnKv16Mode(2);
      const double ms_ovl = TimeMs([&] { planned16(fast, o); }, 5);
      Report(name + "_f16tc_wgmma_kv16ovl", flops / (ms_ovl * 1e9), "TFLOP/s",
             std::to_string(ms_ovl) + " ms, f16 tiles, S(t+1) during the softmax (TANDEM_ATTN_KV16=2), " +
                 std::to_string(ms_kv16 / ms_ovl) + "x the kv16 kernel, " + std::to_string(ms_wg / ms_ovl) +
                 "x the wgmma kernel");
      SetAttnKv16Mode(kv16_default);
      std::vector<float> ovl(count);
      BENCH_CHECK(cudaMemcpy(ovl.data(), o, ovl.size() * sizeof(float), cudaMemcpyDeviceToHost));
      size_t differ_wg = 0, differ_kv16 = 0;
      for (size_t i = 0; i < count; ++i) {
        differ_wg += std::memcmp(&ovl[i], &w[i], sizeof(float)) != 0;
        differ_kv16 += std::memcmp(&ovl[i], &k16[i], sizeof(float)) != 0;
      }
      Report(name + "_f16tc_wgmma_kv16ovl_bits_differ", static_cast<double>(differ_wg), "floats",
             "of " + std::to_string(count) + " output floats against the wgmma kernel's (" +
                 std::to_string(differ_kv16) + " against the kv16 kernel's): 0 expected");
    }
    SetAttnTcWgmma(wgmma_default);
  }

  // Short prompts (one sequence from position 0): the tile items whole against cut into key-tile
  // slices (AttentionPlan::tc_splits, the plan's default below one block per SM), in one process.
  for (int n : {256, 512, 1024}) {
    const double flops = 4.0 * n * n / 2.0 * d.nh * d.hd;
    Step sliced = make_step(1, n, 0, AttentionPrecision::kF16TensorCores);
    Step whole = sliced;
    whole.plan.tc_splits = 1;
    whole.plan.scratch_bytes = 0;
    const std::string name = "prefill_" + std::to_string(n);
    for (int round = 0; round < 2; ++round) {
      const double ms_whole = TimeMs([&] { planned(whole, o_ref); }, 20);
      const double ms_sliced = TimeMs([&] { planned(sliced, o); }, 20);
      Report(name + "_f16tc_whole", ms_whole * 1e3, "us",
             std::to_string(flops / (ms_whole * 1e9)) + " TFLOP/s, " + std::to_string(whole.plan.num_tile_items) +
                 " items x " + std::to_string(d.kvh) + " kv heads");
      Report(name + "_f16tc_sliced", ms_sliced * 1e3, "us",
             std::to_string(flops / (ms_sliced * 1e9)) + " TFLOP/s, " + std::to_string(sliced.plan.tc_splits) +
                 " slices per item and kv head, merge included");
    }
    const size_t count = static_cast<size_t>(n) * d.nh * d.hd;
    std::vector<float> a(count), b(count);
    BENCH_CHECK(cudaMemcpy(a.data(), o, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), o_ref, b.size() * sizeof(float), cudaMemcpyDeviceToHost));
    Report(name + "_f16tc_sliced_vs_whole", RelL2(a, b), "rel_l2", "both f16 tensor cores: ~1e-3 expected");
  }
}

// The attention layer's prefill glue (glue13), old kernel against new at 8192 tokens on q3n-80b
// shapes: the query norm + RoPE (nh 16, hd 256, rot 64; bytes: the q half of qg read, q written)
// and the f32 → f16 conversion of the attention output (8192 × 4096, with and without the lo
// residual), in us and as a share of the device copy rate; and whether both give the same bits.
void RunGlue() {
  const double copy_gbs = CopyGbs();
  const AttnShape d{16, 2, 256, 64, 1e-6f};
  const int64_t n = 8192, qw = static_cast<int64_t>(d.nh) * 2 * d.hd, qn = n * d.nh * d.hd;
  float* qg = RandomFloats(static_cast<size_t>(n * qw), 21);
  float* q_norm = RandomFloats(static_cast<size_t>(d.hd), 22);
  const double* inv = UploadVector(RopeInvFrequencies(1e7, d.rot));
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t);
  const int32_t* d_pos = UploadVector(pos);
  float* q[2];
  for (float*& p : q) BENCH_CHECK(cudaMalloc(&p, static_cast<size_t>(qn) * sizeof(float)));
  double us[2];
  for (int old = 1; old >= 0; --old) {
    SetOldQueryRope(old == 1);
    us[old] = TimeMs([&] { BENCH_CHECK(LaunchQueryNormRope(qg, n, d, q_norm, inv, d_pos, q[old], nullptr)); }, 20) *
              1e3;
  }
  std::vector<float> a(static_cast<size_t>(qn)), b(a.size());
  BENCH_CHECK(cudaMemcpy(a.data(), q[0], a.size() * sizeof(float), cudaMemcpyDeviceToHost));
  BENCH_CHECK(cudaMemcpy(b.data(), q[1], b.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const double q_floor = 2.0 * qn * sizeof(float) / (copy_gbs * 1e3);
  Report("glue_query_norm_rope_n8192", us[0], "us",
         "old " + std::to_string(us[1]) + " us; copy-rate floor " + std::to_string(q_floor) + " us; " +
             (a == b ? "bit-identical" : "DIFFERENT"));
  SetOldQueryRope(false);
  // The conversion: 8192 × 4096 attention outputs (q[0] as the source).
  const int64_t count = n * 4096;
  uint16_t *hi[2], *lo[2];
  for (int i = 0; i < 2; ++i) {
    BENCH_CHECK(cudaMalloc(&hi[i], static_cast<size_t>(count) * 2));
    BENCH_CHECK(cudaMalloc(&lo[i], static_cast<size_t>(count) * 2));
  }
  for (bool with_lo : {false, true}) {
    for (int old = 1; old >= 0; --old) {
      SetOldF32ToF16(old == 1);
      us[old] = TimeMs([&] { BENCH_CHECK(LaunchF32ToF16(q[0], count, hi[old], nullptr, with_lo ? lo[old] : nullptr)); },
                       20) * 1e3;
    }
    std::vector<uint16_t> h0(static_cast<size_t>(count)), h1(h0.size()), l0(h0.size()), l1(h0.size());
    BENCH_CHECK(cudaMemcpy(h0.data(), hi[0], h0.size() * 2, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(h1.data(), hi[1], h1.size() * 2, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(l0.data(), lo[0], l0.size() * 2, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(l1.data(), lo[1], l1.size() * 2, cudaMemcpyDeviceToHost));
    const bool same = h0 == h1 && (!with_lo || l0 == l1);
    const double bytes = static_cast<double>(count) * (4 + 2 + (with_lo ? 2 : 0));
    Report(std::string("glue_f32_to_f16_8192x4096") + (with_lo ? "_lo" : ""), us[0], "us",
           "old " + std::to_string(us[1]) + " us; copy-rate floor " + std::to_string(bytes / (copy_gbs * 1e3)) +
               " us; " + (same ? "bit-identical" : "DIFFERENT"));
  }
  SetOldF32ToF16(false);
  for (const void* p : {static_cast<const void*>(qg), static_cast<const void*>(q_norm), static_cast<const void*>(inv),
                        static_cast<const void*>(d_pos), static_cast<const void*>(q[0]), static_cast<const void*>(q[1]),
                        static_cast<const void*>(hi[0]), static_cast<const void*>(hi[1]),
                        static_cast<const void*>(lo[0]), static_cast<const void*>(lo[1])}) {
    BENCH_CHECK(cudaFree(const_cast<void*>(p)));
  }
}

}  // namespace
}  // namespace tandem::cuda

// --glue: only RunGlue (the prefill glue's A/B), a few seconds. --probe: only the split attention's
// phase stamps.
int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--probe") {
    tandem::cuda::Run(/*probe_only=*/true);
    return 0;
  }
  if (mode != "--glue") tandem::cuda::Run(/*probe_only=*/false);
  tandem::cuda::RunGlue();
  return 0;
}
