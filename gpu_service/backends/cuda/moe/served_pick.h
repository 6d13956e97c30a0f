// Which pick each pick group of the fused one-token MoE kernel serves when the kernel starts
// copying rows of predicted experts before it has routed (FusedPrediction, expert_decode_fused.cuh).
//
// The kernel's routed blocks form pick groups (group k: the blocks of "pick k", every slice; K of
// them, or more with FusedPrediction::groups). With a prediction, group k copies the gate/up rows
// of guess k before the picks are known; once they are, each pick must be served by exactly one
// group, and a group whose guess is a pick should serve that pick (its rows are already on their
// way). The rule, the same in every block:
//   - group k's guess matches pick j when guess k is a valid id equal to picks[j] and no group
//     before k has the same guess (a repeated guess matches once);
//   - the groups left without a match take the picks left without one, in order: the n-th
//     unmatched group (counting from group 0) serves the n-th unmatched pick, and unmatched groups
//     past the unmatched picks serve none.
// Matches are one to one (picks are distinct ids; repeated guesses are dropped), and there are at
// least as many groups as picks, so every pick is served once, whatever the guesses hold.
//
// Host-compiler safe: the kernel computes the same rule a lane a group with warp ballots
// (expert_decode_fused_kernel.cuh); this plain form is the rule's statement, tested on the host
// (tests/gpu_moe/served_pick_test.cc) and used by the GPU tests to check the kernel's choices.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_SERVED_PICK_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_SERVED_PICK_H_

#if defined(__CUDACC__)
#define TANDEM_SERVED_PICK_HD __host__ __device__
#else
#define TANDEM_SERVED_PICK_HD
#endif

namespace tandem::cuda {

// The bit index of the n-th (from 0) set bit of mask, or -1 when mask has n or fewer set bits.
TANDEM_SERVED_PICK_HD inline int NthSetBit(unsigned mask, int n) {
  for (int b = 0; b < 32; ++b) {
    if ((mask >> b) & 1u) {
      if (n == 0) return b;
      --n;
    }
  }
  return -1;
}

// The pick index (0 .. K - 1) pick group g of `groups` (K <= groups <= 32) serves, or -1: none
// (a group past the picks, whose guess matched nothing once every pick has its group).
// guesses[g]: group g's guess, an expert id; an id outside [0, E) is no guess (the kernel also
// takes an id whose expert has no rows in its table as none: pass -1 for those to match it). picks[j]: the
// routed expert ids (distinct; an id outside [0, E) marks a pick that could not be made, which no
// guess matches). With groups > K the kernel runs more pick groups than picks, so that more
// guesses are copied before routing.
TANDEM_SERVED_PICK_HD inline int ServedPickOfGroups(const int* guesses, int groups, const int* picks, int K, int E,
                                                    int g) {
  auto match = [&](int group) {  // the pick `group`'s guess matches, or -1
    const int id = guesses[group];
    if (id < 0 || id >= E) return -1;
    for (int before = 0; before < group; ++before) {
      if (guesses[before] == id) return -1;
    }
    for (int j = 0; j < K; ++j) {
      if (picks[j] == id) return j;
    }
    return -1;
  };
  const int own = match(g);
  if (own >= 0) return own;
  unsigned matched_picks = 0u;
  int unmatched_before = 0;  // groups before g without a match
  for (int other = 0; other < groups; ++other) {
    const int j = match(other);
    if (j >= 0) {
      matched_picks |= 1u << j;
    } else if (other < g) {
      ++unmatched_before;
    }
  }
  const unsigned all = K >= 32 ? 0xFFFFFFFFu : (1u << K) - 1u;
  return NthSetBit(all & ~matched_picks, unmatched_before);
}

// The same with one group a pick (groups = K): always a pick index.
TANDEM_SERVED_PICK_HD inline int ServedPick(const int* guesses, const int* picks, int K, int E, int k) {
  return ServedPickOfGroups(guesses, K, picks, K, E, k);
}

}  // namespace tandem::cuda

#undef TANDEM_SERVED_PICK_HD

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_SERVED_PICK_H_
