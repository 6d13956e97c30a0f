// The one-token MoE layer in two kernels (decode at batch 1), for Q4_K routed experts: no plan
// kernel, no unit list, no separate scatter-sum.
//
// With one token every pick k (0..K-1) is a distinct expert with one row, so nothing needs
// planning: pick k's gate/up row goes to act[k] and its down row is weighted straight into y.
//   1. Gate/up (grid: row tiles × K picks, 4 warps). Each block routes the token itself from the
//      E router logits (one warp, the same arithmetic and tie-breaking as device_plan.cu's
//      RouteToken: softmax with f64 exponentials and sum, K rounds of route_order.cuh's
//      WarpTakeFirst, weights renormalised in f64) as far as its own pick, then computes
//      act[k] = SiLU(gate_e·x) ⊙ up_e·x for its rows (the tile kernel's dot products, q4k_dot.cuh,
//      so the rows are bit-identical to the unit path's). Block (0, K-1) writes all K picks and
//      weights to experts_out / weights_out (the router's device outputs) and sets *error for a
//      pick outside [0, E) or without a location (such a pick computes nothing).
//   2. Down + combine (grid: tiles of output rows, one warp per pick). Every block routes again
//      (before its griddepcontrol.wait: the logits were complete before kernel 1 passed its own
//      wait and let this one start) and starts the copies of its down rows for every pick, then
//      waits for kernel 1, and writes
//        y[j] = Σ_k w_k·(down_k·act[k])[j] + σ(shared_gate_logit)·shared[j]
//      summed in f32 in pick order then the shared term, exactly as moe_scatter.cu does: no
//      atomics, deterministic.
// With OneTokenMoeArgs::int16_activations (the fast mode's default, MoeStage's OneTokenInt16) the
// gate/up kernel quantizes x, and each down warp its pick's act row, to int16 per 256 elements
// and the Q4_K products run on dp2a (q4k_dot.cuh's DotSuperBlockI16): the same routing, picks
// and weights, y within ~1e-5 relative of the f32 form, about 40% of its instructions.
// Both kernels are launched through LaunchPdl (pdl.cuh).
//
// Host-compiler safe (no device code).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_ONE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_ONE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// Most experts and picks the one-token kernels route (a warp keeps the E logits in registers).
inline constexpr int kOneTokenMaxExperts = 1024;
inline constexpr int kOneTokenMaxPicks = 32;

struct OneTokenMoeArgs {
  const float* logits = nullptr;         // E router logits of the token (device)
  int E = 0, K = 0;
  const ExpertLocation* table = nullptr;  // E entries (device); Q4_K gate/up {h, inner}, down {inner, h}
  int h = 0, inner = 0;
  const float* x = nullptr;              // h: the MoE input (device)
  float* act = nullptr;                  // K × inner scratch (device)
  int32_t* experts_out = nullptr;        // K picks (device), written by kernel 1
  float* weights_out = nullptr;          // K weights (device), written by kernel 1
  int* error = nullptr;                  // set to 1 (never cleared) on a bad pick
  const float* shared = nullptr;         // h: the shared expert's output, or nullptr (none)
  const float* shared_gate_logit = nullptr;  // 1 value, or nullptr (shared added ungated)
  float* y = nullptr;                    // h (device)
  // Fast mode: x and act quantized to int16 per 256 elements for the Q4_K dot products (dp2a,
  // q4k_dot.cuh's DotSuperBlockI16; ~1e-5 relative error). Else f32 products, bit-identical to
  // the tile kernels'.
  bool int16_activations = false;
  // Fast mode: both kernels route by the top-K logits (block_route.cuh's WarpPickLogits and
  // PickWeights: no softmax over E) instead of RouteToken's bit-identical f64 softmax; the picks
  // agree but where two logits round to one probability, the weights in the last bits.
  bool logit_route = false;
  // x was written two or more launches before the gate/up kernel (the decode stage: the stream norm,
  // then the router product): the kernel stages x before its PDL wait (pdl.cuh's rule).
  bool x_written_earlier = false;
  // K + 1 ints (device), zero before the first launch and left zero by every down kernel, or
  // nullptr. When given, each gate/up block counts itself done in pick_counts[k] (after its act rows
  // are written, release), and each down warp starts its pick once that pick's count is complete
  // (acquire) instead of waiting for the whole gate/up grid; the down block waits for the grid
  // (PDL) only before its weighted sum. pick_counts[K] counts finished down blocks; the last one
  // zeroes all K + 1. The same results as without.
  int* pick_counts = nullptr;
  // The fused kernel only (expert_decode_fused.cuh): each block routes and gathers its slice's act
  // with the warp moe/warp_slot.cuh's PickWarpOfSlot names from the block's place on the SM,
  // instead of warp 0 (the same picks and results; faster on the H200 with an older kernel, slower
  // on an H100 with today's: off by default).
  bool pick_warp_by_slot = false;
};

// True when both kernels take the shape: E in [1, kOneTokenMaxExperts], K in [1, min(E,
// kOneTokenMaxPicks)], h and inner multiples of 256 with at most 32 super-blocks, and both
// kernels' shared memory fits with either activation form (f32, int16).
bool OneTokenMoeFits(int E, int K, int h, int inner);

// Kernel 1 (gate/up with routing) and kernel 2 (down with the weighted sum). cudaErrorInvalidValue
// for a shape OneTokenMoeFits refuses or a null required pointer (shared and shared_gate_logit may
// be null). Kernel 2 reads shared and shared_gate_logit after its wait: the caller orders their
// producers before it (a join of the side stream between the two launches is fine). The decode
// stage passes none (MoeStage::Run's `deferred`, unless TANDEM_OLD_DOWN_JOIN=1): kernel 2 then
// reads nothing of the shared expert's side chain and follows kernel 1 directly, and the next
// stream norm adds σ(gate)·shared with the same fmaf (norm_streams.cuh, PendingShared).
cudaError_t LaunchOneTokenMoeGateUp(const OneTokenMoeArgs& args, cudaStream_t stream);
cudaError_t LaunchOneTokenMoeDown(const OneTokenMoeArgs& args, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_ONE_CUH_
