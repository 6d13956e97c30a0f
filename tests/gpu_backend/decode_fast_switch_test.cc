// Fast-mode switches of a decode step that change its rounding (the one-token MoE kernels' int16
// products and top-K routing, the fused MoE kernel and its router, the routing logits through the
// mixers' output products, the GDN and attention output products' forms, the mixer norm inside the
// input products): exact mode never takes them (bit-identical), fast batch 1 does, and its picks
// and logits must stay close to the path without the switch. Part of the DecodeScheduleTest suite
// (decode_schedule_util.h; instantiated in decode_schedule_test.cc). Skips without a GPU (CI).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_decode.cuh"
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"
#include "tests/gpu_backend/decode_schedule_util.h"

namespace tandem {
namespace {

using decode_schedule_testing::DecodeLogits;
using gpu_backend_testing::MaxRowError;
using gpu_backend_testing::PresetModel;

// A fast-mode switch of the one-token MoE kernels (`set`) that changes their rounding, against it
// off: exact mode never takes them (bit-identical logits); in fast mode batch 1 takes them
// (different bits, so the path ran) and batch 3 does not (planned path: bit-identical). Eager steps
// with the routing sink: the picks agree at >= 99% of (step, layer, pick) entries and, up to the
// first step whose picks differ, every row of logits is within 1e-3 relative L2 of the path without
// it; graph-replayed steps then give the eager steps' logits (bit for bit, or within 1e-3 relative
// L2 a row when the path adds with atomics: `deterministic` false). Leaves `set(true)` (the caller
// restores the switch).
// same_values: the switch reorders the same values' additions only, so the fast batch-1 logits may
// come out bit-identical (no proof that the path ran: the caller shows that otherwise).
void ExpectOneTokenSwitchKeepsLogitsClose(const std::string& preset, const char* what,
                                          const std::function<void(bool)>& set, bool deterministic = true,
                                          bool same_values = false) {
  absl::StatusOr<std::string> path = PresetModel(preset);
  ASSERT_TRUE(path.ok()) << path.status();
  constexpr int kSteps = 8;
  for (CudaMode mode : {CudaMode::kExact, CudaMode::kFast}) {
    for (int batch : {1, 3}) {
      std::vector<int32_t> picks[2];
      std::vector<float> logits[2];
      for (int on = 0; on < 2; ++on) {
        set(on == 1);
        logits[on] = DecodeLogits(*path, mode, batch, kSteps, &picks[on]);
      }
      ASSERT_FALSE(picks[0].empty());
      ASSERT_EQ(picks[0].size(), picks[1].size());
      ASSERT_EQ(logits[0].size(), logits[1].size());
      const bool same = std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0;
      const bool taken = mode == CudaMode::kFast && batch == 1;
      const char* m = mode == CudaMode::kExact ? "exact" : "fast";
      if (!taken) {
        printf("[%s] %s decode, batch %d, %s on vs off: %s\n", preset.c_str(), m, batch, what,
               same ? "bit-identical" : "DIFFERENT");
        EXPECT_TRUE(same) << what << ", " << m << ", batch " << batch;
        EXPECT_EQ(picks[0], picks[1]) << what << ", " << m << ", batch " << batch;
        continue;
      }
      const size_t per_step = picks[0].size() / kSteps;
      int64_t agree = 0;
      int first_flip = kSteps;
      for (size_t i = 0; i < picks[0].size(); ++i) {
        agree += picks[0][i] == picks[1][i];
        if (picks[0][i] != picks[1][i]) first_flip = std::min(first_flip, static_cast<int>(i / per_step));
      }
      const int64_t V = static_cast<int64_t>(logits[0].size()) / kSteps;
      const std::vector<float> a(logits[0].begin(), logits[0].begin() + first_flip * V),
          b(logits[1].begin(), logits[1].begin() + first_flip * V);
      const double err = first_flip > 0 ? MaxRowError(b, a, V) : 0.0;
      const double agreement = static_cast<double>(agree) / static_cast<double>(picks[0].size());
      printf("[%s] fast decode, batch 1, %s on vs off: logits %s, picks agree %.4f, first step with a different "
             "pick %d of %d, max row relative L2 before it %.3g\n",
             preset.c_str(), what, same ? "bit-identical" : "different", agreement, first_flip, kSteps, err);
      if (!same_values) {
        EXPECT_FALSE(same) << what << ": the path did not run";
      }
      EXPECT_GE(agreement, 0.99) << what;
      EXPECT_GE(first_flip, 1) << what;
      EXPECT_LE(err, 1e-3) << what;
    }
  }
  // Graph-replayed fast batch-1 steps (no routing sink) give the eager steps' logits.
  set(true);
  std::vector<int32_t> eager_picks;
  const std::vector<float> eager = DecodeLogits(*path, CudaMode::kFast, 1, kSteps, &eager_picks);
  const std::vector<float> graphed = DecodeLogits(*path, CudaMode::kFast, 1, kSteps);
  ASSERT_EQ(eager.size(), graphed.size());
  if (deterministic) {
    EXPECT_EQ(std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)), 0)
        << what << ": graphs changed the logits";
  } else {
    const int64_t V = static_cast<int64_t>(eager.size()) / kSteps;
    EXPECT_LE(MaxRowError(graphed, eager, V), 1e-3) << what << ": graphs moved the logits";
  }
}

// The one-token MoE kernels with int16 activations (cuda::SetOneTokenInt16, the fast mode's
// default) against their f32 products (the quantization's error is ~1e-5 a product).
TEST_P(DecodeScheduleTest, Int16OneTokenMoeKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::OneTokenInt16();
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "int16 one-token MoE", [](bool on) { cuda::SetOneTokenInt16(on); });
  cuda::SetOneTokenInt16(was);
}

// The one-token kernels' routing by the top-K logits (cuda::SetOneTokenLogitRoute, the fast mode's
// default) against the f64 softmax that is bit-identical to the planned path's (the weights differ
// in the last bits).
TEST_P(DecodeScheduleTest, LogitRouteKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::OneTokenLogitRoute();
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "one-token logit routing",
                                       [](bool on) { cuda::SetOneTokenLogitRoute(on); });
  cuda::SetOneTokenLogitRoute(was);
}

// The one-token MoE as one kernel of clusters (cuda::SetOneTokenFused, the fast default: down split
// by its input columns, added into a per-layer buffer with atomics) against the two kernels, with
// the Q8_0 shared expert inside the kernel (small; tiny-q3n's h of 256 is too narrow for that, so
// there the fused kernel runs only when asked to leave the shared expert beside it) and beside it.
TEST_P(DecodeScheduleTest, FusedOneTokenMoeKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::OneTokenFused();
  const bool was_beside = cuda::FusedSharedBeside();
  for (const bool beside : {false, true}) {
    if (!beside && GetParam() == "tiny-q3n") continue;
    cuda::SetFusedSharedBeside(beside);
    ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), beside ? "fused one-token MoE, shared expert beside"
                                                            : "fused one-token MoE",
                                         [](bool on) { cuda::SetOneTokenFused(on); }, /*deterministic=*/false);
  }
  cuda::SetFusedSharedBeside(was_beside);
  cuda::SetOneTokenFused(was);
}

// The router product inside the fused kernel's grid (cuda::SetFusedRouterInGrid) against the fused
// kernel after the router's own launch (small: the shared expert and its gate row inside).
TEST_P(DecodeScheduleTest, FusedRouterInTheGridKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's shared expert stays beside: the fused kernel does not run";
  const bool was = cuda::OneTokenFused(), was_router = cuda::FusedRouterInGrid();
  cuda::SetOneTokenFused(true);
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "router in the fused grid",
                                       [](bool on) { cuda::SetFusedRouterInGrid(on); }, /*deterministic=*/false);
  cuda::SetFusedRouterInGrid(was_router);
  cuda::SetOneTokenFused(was);
}

// The routing logits formed from the parts the mixers' output products sum
// (cuda::SetRouteThroughOutMode, read at upload and when a step is enqueued:
// kernels/route_compose.cuh) against the router product in the fused MoE grid (small), in mode 1
// (GDN layers) and 2 (attention's o product too, the default). The logits' last bits move (the
// parts' rounding), so picks may flip at near ties.
TEST_P(DecodeScheduleTest, RouteThroughOutKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's GDN clusters cover 128 columns: the kernel does not run";
  const int was = cuda::RouteThroughOutMode();
  const bool was_fused = cuda::OneTokenFused();
  const int was_mode = cuda::GetGdnDecodeFused();
  cuda::SetGdnDecodeFused(3);
  cuda::SetOneTokenFused(true);
  for (const int mode : {1, 2}) {
    const char* what =
        mode == 1 ? "routing logits through GDN's output product" : "routing logits through every output product";
    ExpectOneTokenSwitchKeepsLogitsClose(
        GetParam(), what, [mode](bool on) { cuda::SetRouteThroughOutMode(on ? mode : 0); }, /*deterministic=*/false);
  }
  cuda::SetOneTokenFused(was_fused);
  cuda::SetGdnDecodeFused(was_mode);
  cuda::SetRouteThroughOutMode(was);
}

// The fused GDN kernel's output product (mode 3) reading ssm_out by columns (cuda::SetGdnOutByColumns,
// read at upload: a second copy of the super-blocks) against its rows (small). The same values
// summed in the atomics' order: the logits may match to the bit (OutByColumnsTest shows the copy
// is made; GpuGdnDecodeOutTest that the kernel reads it).
TEST_P(DecodeScheduleTest, GdnOutByColumnsKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's GDN clusters cover 128 columns: the kernel does not run";
  const bool was = cuda::GdnOutByColumns();
  const int was_mode = cuda::GetGdnDecodeFused();
  cuda::SetGdnDecodeFused(3);
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "ssm_out by columns", [](bool on) { cuda::SetGdnOutByColumns(on); },
                                       /*deterministic=*/false, /*same_values=*/true);
  cuda::SetGdnDecodeFused(was_mode);
  cuda::SetGdnOutByColumns(was);
}

// The gated norm and ssm_out inside the fused GDN kernel at one-token steps (cuda::SetGdnDecodeFused
// 3: z from the one stacked product; 4: z on the side stream, joined before the kernel; the output
// added into a per-layer buffer with atomics, its input as int16) against mode 1 (small: clusters
// of 256 columns; tiny-q3n's hold 128, which the kernel does not take).
TEST_P(DecodeScheduleTest, GdnOutProductInsideKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's GDN clusters cover 128 columns: the kernel does not run";
  const int was = cuda::GetGdnDecodeFused();
  for (const int mode : {3, 4}) {
    ExpectOneTokenSwitchKeepsLogitsClose(GetParam(),
                                         mode == 3 ? "ssm_out inside the GDN kernel" : "ssm_out inside, z beside",
                                         [mode](bool on) { cuda::SetGdnDecodeFused(on ? mode : 1); },
                                         /*deterministic=*/false);
  }
  cuda::SetGdnDecodeFused(was);
}

// The mixer read's norm formed inside the products that read x at one-token steps
// (MixerNormInProduct: LaunchDenseMatVecNormIn in GDN's product over mixer_in and attention's over
// [k; v] and q, the MoE output's inject moved to the layer's next norm) against the norm's own
// launch (cuda::SetMixerNormLaunch, TANDEM_MIXER_NORM_LAUNCH=1). The same values in the same order
// (norm_in_product_test.cc: bit-identical kernels); with GDN mode 3 and attention's column-split o
// (outputs in mixer_out_y: the pending y stays untouched by the mixer, the path's condition in fast
// mode), whose atomics may move the last bits between runs, so within their tolerance. Exact mode
// takes the path in layers without a pending inject only, and must give the same bits.
TEST_P(DecodeScheduleTest, MixerNormInProductKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const bool was = cuda::MixerNormLaunch();
  const int was_mode = cuda::GetGdnDecodeFused();
  cuda::SetGdnDecodeFused(3);
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "mixer norm inside the input product",
                                       [](bool on) { cuda::SetMixerNormLaunch(!on); }, /*deterministic=*/false,
                                       /*same_values=*/true);
  cuda::SetGdnDecodeFused(was_mode);
  cuda::SetMixerNormLaunch(was);
}

// A GDN layer of a one-token fast step in one launch (cuda::SetGdnDecodeLayerOne,
// TANDEM_GDN_LAYER_ONE: the stacked input product inside the fused kernel, x as int16 there) against
// the norm-in product's launch before the fused kernel (mode 3; small: clusters of 256 columns, the
// mixer read's norm inside the product; tiny-q3n's clusters hold 128, which the kernel does not take).
TEST_P(DecodeScheduleTest, GdnLayerInOneLaunchKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's GDN clusters cover 128 columns: the kernel does not run";
  const bool was = cuda::GdnDecodeLayerOne();
  const int was_mode = cuda::GetGdnDecodeFused();
  cuda::SetGdnDecodeFused(3);
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "the GDN layer in one launch",
                                       [](bool on) { cuda::SetGdnDecodeLayerOne(on); }, /*deterministic=*/false);
  cuda::SetGdnDecodeFused(was_mode);
  cuda::SetGdnDecodeLayerOne(was);
}

// Attention's o product split by columns at one-token steps (cuda::SetAttnOutColumnSplit: added into
// a per-layer buffer with atomics, its input as int16) against the row-split matvec (small: o is
// Q8_0x8; tiny-q3n's o is under the regrouping size, which the kernel does not take).
TEST_P(DecodeScheduleTest, AttnOutColumnSplitKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's o stays ggml Q8_0: the kernel does not run";
  const bool was = cuda::AttnOutColumnSplit();
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "attention o split by columns",
                                       [](bool on) { cuda::SetAttnOutColumnSplit(on); }, /*deterministic=*/false);
  cuda::SetAttnOutColumnSplit(was);
}

// The one-token attention's slices merged by the column-split o product (cuda::SetAttnMergeInOut,
// TANDEM_ATTN_MERGE_IN_OUT: no merge launch) against the merge kernel: the same x values (the merge
// kernel's operations, attention_merge_in_out_test.cc), the product's atomics the only difference
// (small: heads of 128, two a super-block of o's columns; tiny-q3n's o is not column-split). The
// decode contexts (prompts of 17 tokens and more, then 8 steps) are below the short-walk bound, so
// the bound is 0 for the test: every step takes the split path and its merge.
TEST_P(DecodeScheduleTest, AttnMergeInOutKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  if (GetParam() == "tiny-q3n") GTEST_SKIP() << "tiny-q3n's o stays ggml Q8_0: the column split does not run";
  const bool was = cuda::AttnMergeInOut();
  const int was_short = cuda::AttnShortKeys();
  cuda::SetAttnShortKeys(0);
  ExpectOneTokenSwitchKeepsLogitsClose(GetParam(), "attention slices merged by the o product",
                                       [](bool on) { cuda::SetAttnMergeInOut(on); }, /*deterministic=*/false,
                                       /*same_values=*/true);
  cuda::SetAttnShortKeys(was_short);
  cuda::SetAttnMergeInOut(was);
}

// The one-token switches the tests below set, each restored when the guard goes (also after a
// failed assertion, so that no later test inherits one).
class OneTokenSwitchesRestored {
 public:
  OneTokenSwitchesRestored() = default;
  OneTokenSwitchesRestored(const OneTokenSwitchesRestored&) = delete;
  OneTokenSwitchesRestored& operator=(const OneTokenSwitchesRestored&) = delete;
  ~OneTokenSwitchesRestored() {
    cuda::SetAttnOutFused(attn_out_fused_);
    cuda::SetAttnOutColumnSplit(attn_out_columns_);
    cuda::SetAttnOutFusedPrepInside(attn_prep_inside_);
    cuda::SetOneTokenFused(one_token_fused_);
    cuda::SetGdnDecodeFused(gdn_mode_);
    cuda::SetGdnLean(gdn_lean_);
    cuda::SetMoeLean(moe_lean_);
    cuda::SetNormInLean(norm_in_lean_);
  }

 private:
  const bool attn_out_fused_ = cuda::AttnOutFused();
  const bool attn_out_columns_ = cuda::AttnOutColumnSplit();
  const bool attn_prep_inside_ = cuda::AttnOutFusedPrepInside();
  const bool one_token_fused_ = cuda::OneTokenFused();
  const int gdn_mode_ = cuda::GetGdnDecodeFused();
  const int gdn_lean_ = cuda::GdnLean();
  const int moe_lean_ = cuda::MoeLean();
  const bool norm_in_lean_ = cuda::NormInLean();
};

// Attention and its o product in one launch at one-token steps (cuda::SetAttnOutFused,
// attention_out_fused.cuh: a cluster per query head splits the context, merges its slices through
// distributed shared memory and runs the column-split product) against the split attention and the
// column-split o product. Only heads of 256 take it, so the model is q3n-80b's shapes with four
// layers (one attention layer, ~5 GB); the decode contexts (prompts of 17 tokens and more, then 8
// steps) are under kAttnOutFusedMaxKeys.
TEST(DecodeAttnOutFusedTest, KeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const OneTokenSwitchesRestored restored;
  cuda::SetAttnOutColumnSplit(true);  // the test binary's default is off (deterministic_decode_env.cc)
  const uint64_t launches = cuda::AttentionOutFusedLaunches();
  ExpectOneTokenSwitchKeepsLogitsClose("q3n-80b@4", "attention and o in one launch",
                                       [](bool on) { cuda::SetAttnOutFused(on); }, /*deterministic=*/false);
  printf("fused attention + o launches: %llu\n",
         static_cast<unsigned long long>(cuda::AttentionOutFusedLaunches() - launches));
  EXPECT_GT(cuda::AttentionOutFusedLaunches(), launches);
}

// A switch `what` (`set`) that reorders the same values' additions only, against it off, on
// q3n-80b@4 in the one-token forms set before; `launches` (a counter of the path it selects) must
// move, since the logits may come out bit-identical.
void ExpectSameValuesSwitchRuns(const char* what, void (*set)(bool), uint64_t (*launches)()) {
  const uint64_t before = launches();
  ExpectOneTokenSwitchKeepsLogitsClose("q3n-80b@4", what, set, /*deterministic=*/false, /*same_values=*/true);
  printf("%s launches: %llu\n", what, static_cast<unsigned long long>(launches() - before));
  EXPECT_GT(launches(), before) << what;
}

// The q/k prep inside the fused launch (cuda::SetAttnOutFusedPrepInside) against the prep launch
// before it: the same q, keys and values (attention_out_fused_test.cc compares the bits), with the
// fused launch and o by columns on for both sides; the fused launch counter shows that the path ran.
TEST(DecodeAttnOutFusedTest, PrepInsideKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const OneTokenSwitchesRestored restored;
  cuda::SetAttnOutFused(true);
  cuda::SetAttnOutColumnSplit(true);
  ExpectSameValuesSwitchRuns("q/k prep inside the fused launch", cuda::SetAttnOutFusedPrepInside,
                             cuda::AttentionOutFusedLaunches);
}

// Each lean level of a kernel (`set_level`: 1 and 2, each against 0) keeps q3n-80b@4's decode logits
// close (the same values: only the atomics' order may differ), and `launches(level)` moves (that
// level's kernel ran). Leaves level 0 set (the caller's guard restores the switch).
void ExpectLeanLevelsKeepLogitsClose(const std::string& kernel, const std::function<void(int)>& set_level,
                                     const std::function<uint64_t(int)>& launches) {
  for (const int level : {1, 2}) {
    const std::string what = kernel + " " + std::to_string(level);
    const uint64_t before = launches(level);
    ExpectOneTokenSwitchKeepsLogitsClose("q3n-80b@4", what.c_str(), [&](bool on) { set_level(on ? level : 0); },
                                         /*deterministic=*/false, /*same_values=*/true);
    printf("%s launches: %llu\n", what.c_str(), static_cast<unsigned long long>(launches(level) - before));
    EXPECT_GT(launches(level), before) << what;
    set_level(0);
  }
}

// The fused GDN kernel with ssm_out inside compiled for the one-token defaults alone (cuda::SetGdnLean
// 1), and also for the 80B's GDN shapes (2), against its general instantiation (0), on the 80B's GDN
// shapes: the same arithmetic, the layer's output added by atomics in another order. GDN mode 3
// (ssm_out inside, the benchmark's default; this binary's is 1: deterministic_decode_env.cc) for both
// sides. Counts each level's launches; on the small preset's shapes level 2 takes level 1's kernel.
TEST(DecodeGdnLeanTest, LeanKernelKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const OneTokenSwitchesRestored restored;
  cuda::SetGdnDecodeFused(3);
  ExpectLeanLevelsKeepLogitsClose("the lean fused GDN kernel", cuda::SetGdnLean, cuda::GdnLeanLaunches);
  // Off the 80B's GDN shapes (the small preset: 8 key heads, 16 value heads) level 2 takes level 1's
  // kernel.
  const uint64_t before1 = cuda::GdnLeanLaunches(1), before2 = cuda::GdnLeanLaunches(2);
  ExpectOneTokenSwitchKeepsLogitsClose("small", "the lean fused GDN kernel 2 off the 80B's shapes",
                                       [](bool on) { cuda::SetGdnLean(on ? 2 : 0); }, /*deterministic=*/false,
                                       /*same_values=*/true);
  EXPECT_GT(cuda::GdnLeanLaunches(1), before1) << "small: level 2 did not fall back to level 1's kernel";
  EXPECT_EQ(cuda::GdnLeanLaunches(2), before2) << "small: level 2's kernel ran off its shapes";
}

// The norm-in input products with the 80B's width compiled in (cuda::SetNormInLean) against the
// general kernel, on q3n-80b's shapes (h 2048): the same bits from each product
// (norm_in_product_test.cc); GDN mode 3, the norm-in path's condition as in
// MixerNormInProductKeepsDecodeLogitsClose, whose atomics may move the last bits between runs.
// Counts the lean launches.
TEST(DecodeNormInLeanTest, LeanKernelKeepsDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const OneTokenSwitchesRestored restored;
  cuda::SetGdnDecodeFused(3);
  ExpectSameValuesSwitchRuns("the lean norm-in product", cuda::SetNormInLean, cuda::NormInLeanLaunches);
}

// The fused one-token MoE kernel's lean forms (cuda::SetMoeLean: 1, the fast decode defaults as
// constants; 2, also the 80B's h and inner) against the general kernel, on the 80B's MoE shapes
// (512 experts, 10 picks, the shared expert and the router inside the grid): the same arithmetic,
// the layer's output added by atomics in another order. The fused MoE kernel (this binary's default
// is the two one-token kernels: deterministic_decode_env.cc) for both sides.
TEST(DecodeMoeLeanTest, LeanKernelsKeepDecodeLogitsClose) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const OneTokenSwitchesRestored restored;
  cuda::SetOneTokenFused(true);
  ExpectLeanLevelsKeepLogitsClose("the lean fused MoE kernel", cuda::SetMoeLean, cuda::MoeLeanLaunches);
}

}  // namespace
}  // namespace tandem
