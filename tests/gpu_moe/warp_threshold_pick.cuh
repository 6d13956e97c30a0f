// A candidate form of the fast mode's warp picks, kept for the pick bench (gpu_moe_bench --pick)
// and its test, not used by the kernels: WarpThresholdPick, the top-K of a warp's keys without
// WarpTakeKeys' dependent rounds. Measured on an H100 (docs/PERF.md, forty-seventh session): alone
// 0.72 us for ten picks of 512 against WarpTakeKeys' 1.09, ~0.5 us a layer earlier in the probed
// fused MoE kernel, yet batch-1 decode 0.8% slower end to end with it inside WarpPickLogits (the
// unprobed kernel's code ~17% longer). Device code only (include from .cu files).
#ifndef TANDEM_TESTS_GPU_MOE_WARP_THRESHOLD_PICK_CUH_
#define TANDEM_TESTS_GPU_MOE_WARP_THRESHOLD_PICK_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/moe/block_route.cuh"

namespace tandem::cuda {
namespace {

// The top `rounds` keys of a warp (lane l holds ids l, l + 32, ...; 0: taken or absent) in the
// order WarpTakeKeys takes them (largest key first, the lowest id among equal keys), without its
// rounds: T is the rounds-th largest of the lanes' largest keys, so at least `rounds` keys reach T
// and every pick does; the keys that reach T (usually rounds to rounds + a few) are gathered into
// ids / picked (scratch: both must hold 32 entries), and each is placed by counting the gathered
// keys ahead of it. Why not WarpTakeKeys: its rounds are dependent (a lane's best key, two warp
// reductions, the take), ~2200 SM cycles for ten picks of 512 (docs/PERF.md, forty-seventh
// session); here nothing waits on a previous pick. No branch but the two hand-backs: a first form
// with a branch around each gathered store and each read took ~3700 cycles (each a divergence
// point of its own), so the stores go to slot 31 when not gathered (hence at most 31 gathered) and
// every slot is read, its count masked. Lane r < rounds returns pick r's id and key (*id, *top).
// Returns false, having written nothing, when fewer than `rounds` lanes hold a key or more than 31
// keys reach T (many equal keys): the caller then takes WarpTakeKeys' rounds. Call from every
// lane of one warp; rounds <= 31.
template <int kPer>
__device__ __forceinline__ bool WarpThresholdPick(const unsigned (&key)[kPer], int rounds, int* ids, float* picked,
                                                  unsigned* id, unsigned* top) {
  constexpr int kSpare = 31;  // where the keys below T are stored (never read as gathered)
  const int lane = threadIdx.x & 31;
  // The lane's largest key: a pairwise tree (log2(kPer) dependent steps).
  unsigned m[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) m[j] = key[j];
#pragma unroll
  for (int w = 1; w < kPer; w <<= 1) {
#pragma unroll
    for (int i = 0; i + w < kPer; i += 2 * w) m[i] = max(m[i], m[i + w]);
  }
  const unsigned best = m[0];
  // ge: the lanes whose largest key is >= this lane's (itself included); the 32 shuffles do not
  // depend on each other. T is the largest lane maximum that `rounds` lane maxima reach.
  int ge = 0;
#pragma unroll
  for (int s = 0; s < 32; ++s) ge += __shfl_sync(0xFFFFFFFFu, best, s) >= best ? 1 : 0;
  const unsigned T = __reduce_max_sync(0xFFFFFFFFu, ge >= rounds ? best : 0u);
  int c = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) c += key[j] >= T ? 1 : 0;
  const unsigned gathered = __reduce_add_sync(0xFFFFFFFFu, static_cast<unsigned>(c));
  // T == 0: fewer than `rounds` lanes hold a key. Both tests are uniform over the warp.
  if (T == 0u || gathered > static_cast<unsigned>(kSpare)) return false;
  // This lane's first place among the gathered keys: the lower lanes' counts, summed bit by bit
  // (c <= 16: five ballots, none waiting on another, in place of a five-step shuffle scan).
  const unsigned below = (1u << lane) - 1u;
  int at = 0;
#pragma unroll
  for (int b = 0; b < 5; ++b) at += __popc(__ballot_sync(0xFFFFFFFFu, (c >> b) & 1) & below) << b;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const bool in = key[j] >= T;
    const int slot = in ? at : kSpare;
    ids[slot] = lane + 32 * j;
    picked[slot] = __uint_as_float(key[j]);
    at += in ? 1 : 0;
  }
  __syncwarp();
  // Lane l < gathered places gathered key l: the gathered keys ahead of it (larger, or equal with a
  // lower id). The ids differ, so the places are 0 .. gathered - 1, each once.
  const int n = static_cast<int>(gathered);
  const unsigned my_key = __float_as_uint(picked[lane]);
  const int my_id = ids[lane];
  int place = 0;
#pragma unroll
  for (int g = 0; g < 32; ++g) {
    const unsigned k2 = __float_as_uint(picked[g]);
    const int i2 = ids[g];
    place += (g < n) & (k2 > my_key || (k2 == my_key && i2 < my_id)) ? 1 : 0;
  }
  __syncwarp();  // every lane has read the gathered keys: the slots are free again
  const bool placed = lane < n && place < rounds;
  const int to = placed ? place : kSpare;
  ids[to] = my_id;
  picked[to] = __uint_as_float(my_key);
  __syncwarp();
  *id = static_cast<unsigned>(ids[lane]);
  *top = __float_as_uint(picked[lane]);
  return true;
}

// WarpPickLogits' outputs from WarpThresholdPick, WarpTakeKeys' rounds where it hands back: lane r
// writes pick r's id to ids[r] (E when none is left) and its logit to picked[r] (-inf then), as
// WarpPickLogits does from the same keys (LogitKey of each logit + 0). ids and picked hold 32
// entries (the scratch). Returns whether WarpThresholdPick decided. Call from every lane of one warp.
template <int kPer>
__device__ bool ThresholdPickKeys(unsigned (&key)[kPer], int E, int rounds, int* ids, float* picked) {
  const int lane = threadIdx.x & 31;
  unsigned id = 0u, top = 0u;
  const bool decided = WarpThresholdPick<kPer>(key, rounds, ids, picked, &id, &top);
  if (!decided) {
    WarpTakeKeys<kPer>(key, rounds, [&](int r, unsigned t, unsigned i) {
      if (lane == r) {
        top = t;
        id = i;
      }
    });
  }
  if (lane < rounds) {
    ids[lane] = top != 0u ? static_cast<int>(id) : E;
    picked[lane] = KeyLogit(top);
  }
  __syncwarp();
  return decided;
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_TESTS_GPU_MOE_WARP_THRESHOLD_PICK_CUH_
