// The one-token MoE layer in one kernel (fast-mode decode at batch 1, Q4_K routed experts): the
// gate/up → down dependency is kept inside thread-block clusters instead of between two grids.
//
// Why: the two-kernel form (expert_decode_one.cuh) spends ~6 us a layer between the gate/up
// grid's last act row and the down grid's sums (its PDL wait, act re-read from L2, the dot
// products of a whole super-block per lane), against ~1.3 us of down bytes (PERF.md, the one-token
// probe). Here the down product is split along its input (inner) dimension instead of its rows,
// so that a block needs only the act values its own cluster computed:
//   - inner is cut into slices of kFusedSliceCols = 128 columns (half a Q4_K super-block of a down
//     row); a cluster of kFusedCluster = 8 blocks owns (pick k, slice s);
//   - block rank c of the cluster computes gate/up rows s·128 + 16c .. + 15 of pick k (act =
//     SiLU(gate·x) ⊙ up·x, int16 x and dp2a as the two-kernel form) and stores each act value
//     into all 8 blocks' shared memory (st.async, counted by each block's mbarrier), so every
//     block then holds the slice's 128 act values (distributed shared memory, no cluster barrier
//     with release semantics on the way);
//   - it then computes the slice's part of down rows c·h/8 .. + h/8 − 1, i.e. Σ over the slice's
//     128 columns (act quantized to int16 with one scale for the slice), and adds w_k times it
//     into y with atomics (red.global.add.f32).
// Every block routes the token itself (the fast mode's top-K logits, block_route.cuh), before any
// weight is known; the gate/up rows' copies are issued right after routing, the down rows' into the
// same shared memory once the gate/up products are done (expert_decode_fused_kernel.cuh says why).
//
// y is accumulated, not written: it must hold zeros (or the terms to add to) before the launch,
// and the order of the K · inner/128 atomic additions into each y[j] is not fixed, so y's last
// bits may differ between runs (the fast mode only; the exact mode keeps the two-kernel f32 form).
// The shared expert's term is added once: a given output row (OneTokenMoeArgs::shared) by the
// blocks of pick 0, slice 0; or the shared expert itself (FusedSharedExpert, Q8_0) computed by
// clusters of its own in the same grid, slices of 64 columns.
//
// Host-compiler safe (no device code).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"

namespace tandem::cuda {

inline constexpr int kFusedCluster = 8;            // blocks of one (pick, slice)
inline constexpr int kFusedSliceCols = 128;        // inner columns of a routed expert's slice
inline constexpr int kFusedSharedSliceCols = 64;   // inner columns of the shared expert's slice

// The shared expert computed inside the fused kernel instead of beside it (Q8_0 gate and up {h,
// inner}, down {inner, h}): its slices are clusters of the same grid, so no side stream, no fork
// and no join. Its term σ(gate logit)·FFN_sh(x) (ungated when OneTokenMoeArgs::shared_gate_logit is
// null) is added into y with the routed experts'. OneTokenMoeArgs::shared must then be null.
struct FusedSharedExpert {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
  int inner = 0;
};

// The router product inside the fused kernel's grid instead of a launch before it: the first
// `blocks` blocks compute logits[r] = w_r · x for the `rows` f32 rows of w (E router rows, then the
// shared gate's row when rows = E + 1) into OneTokenMoeArgs::logits and count themselves done in
// counters[0]; the expert blocks wait (after their PDL wait, which is now on x's writer) until that
// count is complete, and the last of them to route zeroes both counters (counters[1] counts the
// routed ones). counters: two ints, zero before the launch (MoeStage::PrepareStep zeroes them
// before every step, so a step cut short cannot leave them set).
// blocks: a multiple of kFusedCluster (they are placed as clusters too), 8 .. kFusedRouterMaxBlocks.
// The default 96 keeps the 80B layer's grid (40 routed and 8 shared clusters) at 60 clusters, inside
// the 62 an H200 holds at once (OneTokenFusedMaxActiveClusters), with 1-2 rows a warp.
// preload: each warp loads its first row into registers before the PDL wait and reads x from
// shared memory (staged once a block after the wait); otherwise a plain loop over x and the rows
// from L2 after the wait (the first form). Both give the same logits (the same sums in the same
// order) and measured the same end to end (docs/PERF.md, twenty-first session); the backend takes
// the default. The choice stays a runtime field: with the loop removed the compiler gave the
// kernel 110 registers instead of 96, a form not measured.
inline constexpr int kFusedRouterBlocks = 96;
inline constexpr int kFusedRouterMaxBlocks = 256;
struct FusedRouter {
  const float* w = nullptr;  // rows × h f32, row-major
  int rows = 0;
  float* logits = nullptr;   // rows floats: must be OneTokenMoeArgs::logits
  int* counters = nullptr;
  int blocks = kFusedRouterBlocks;
  bool preload = true;
};

// True when the fused kernel takes the shape: E in [1, kOneTokenMaxExperts], K in [1, min(E,
// kOneTokenMaxPicks)], h of 1, 2, 4 or 8 super-blocks (256 .. 2048: a warp's row step covers its
// 4 gate/up rows), inner a multiple of 256 with at most 32 super-blocks, and the shared memory
// fits.
bool OneTokenFusedFits(int E, int K, int h, int inner);
// True when it can also take a Q8_0 shared expert of `shared_inner` rows at this h: h a multiple of
// 512 (16 lanes a row, whole Q8_0 blocks in one x super-block each) and shared_inner of 64.
bool OneTokenFusedTakesShared(int h, int shared_inner);

// How many of the fused kernel's clusters (kFusedCluster blocks each, at h and E's shared memory)
// this device holds at once: cudaOccupancyMaxActiveClusters, for benches and diagnosis (placement
// depends on the chip's GPCs, not only on its SM count).
cudaError_t OneTokenFusedMaxActiveClusters(int h, int E, int* clusters);

// The whole one-token MoE layer: reads args.logits (top-K logits routing: args.logit_route must be
// set), args.table, args.x (int16 activations: args.int16_activations must be set), writes
// args.experts_out / weights_out / error as LaunchOneTokenMoeGateUp does, and adds the routed
// experts' weighted sum, and the shared expert's term (args.shared given: σ(gate)·shared; or
// `shared_expert` given: computed here), into args.y, which must hold zeros. args.act and
// args.pick_counts are not used. Launched as one PDL grid of clusters. cudaErrorInvalidValue for a
// shape OneTokenFusedFits (or, with a shared expert, OneTokenFusedTakesShared) refuses, a null
// required pointer, both args.shared and a shared expert, or without int16_activations and
// logit_route.
// `router` (may be nullptr): the router product inside the grid (FusedRouter); args.logits is then
// written here, and args.x_written_earlier must be false (x's writer is the launch just before).
cudaError_t LaunchOneTokenMoeFused(const OneTokenMoeArgs& args, const FusedSharedExpert* shared_expert,
                                   cudaStream_t stream, const FusedRouter* router = nullptr);

// TANDEM_MOE_LEAN (0, 1 or 2, 2 by default; read once; settable; read at launch): with the router
// in the grid and 257 .. 512 experts, 1 launches a kernel compiled with the fast decode defaults as
// constants (x written by the launch just before, warp 0 picks, no shared term given in y's form,
// the router rows preloaded: 75.9 KB of machine code against 85.5 KB, 110 registers against 114), 2
// one compiled also for the 80B's shapes (h kMoeLeanHidden, the routed and shared experts' inner
// kMoeLeanInner: 65.0 KB, 106 registers) where those are the arguments (level 1's kernel where only
// they differ); 0 the general kernel; the same arithmetic. Not measured: the benchmark's step
// routes through the mixers' output products, so its MoE launches have their logits ready and no
// router blocks, a form this does not cover (its A/B rows in docs/PERF.md "Sixty-fifth session"
// measured the general kernel; branch exp/s65-attn-tma-tail adds that form).
// MoeLeanLaunches(level) counts the launches of that level's kernel (tests).
inline constexpr int kMoeLeanHidden = 2048;
inline constexpr int kMoeLeanInner = 512;
int MoeLean();
void SetMoeLean(int level);
uint64_t MoeLeanLaunches(int level);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_CUH_
