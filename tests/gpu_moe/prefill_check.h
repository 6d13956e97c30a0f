// The prefill expert path's check against the reference FFN, shared by the prefill tests
// (expert_prefill_test.cc, expert_prefill_wgmma_test.cc, expert_prefill_mmq_test.cc): one random
// layer through a runner made with each of a list of options, against FfnForward. GPU tests only.
#ifndef TANDEM_TESTS_GPU_MOE_PREFILL_CHECK_H_
#define TANDEM_TESTS_GPU_MOE_PREFILL_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"

namespace tandem::cuda::testing {

// A layer's shapes: the gate/up and down weight types, h, I, E experts, K picks, n tokens.
struct PrefillCase {
  WeightType gu_type, d_type;
  int64_t h, I, E, K, n;
};

// The options in words (a failure's context).
std::string Describe(const PrefillOptions& o);

// Runs one random layer through a runner made with each of `all` (both algorithms, every tile
// height); relative L2 against FfnForward.
// expected_tile_rows (0: unchecked): the height the chosen-height kGroupedTilesPipelined runner
// must pick. A chosen-height kGroupedTiles runner on a streamed shape must report 64.
// skewed: token t picks experts by a weighted draw (expert e with weight 2e + 1) instead of the
// round robin (t + 2k) % E.
// counts (K must be 1): expert e takes counts[e] tokens (0: none), tokens in shuffled order; n
// must be the sum. mmq_rel_l2: the bound for runs on the integer-MMA kernel (kMmq*, or
// kStreamedAuto where it takes kMmq), tighter than the f16 paths' 1e-2. same_bits: every option's
// output (host- and device-planned) must equal the first option's bit for bit. weight_sets (0: E):
// expert e uses weight set e % weight_sets (many experts, hence many tiles, without generating and
// uploading E sets). cross_rel_l2 (0: unchecked): every option's output within this relative L2 of
// the first option's (kernels on the same f16 weights and activations, differing in f32 order).
void ExpectMatchesReference(const PrefillCase& c, const std::vector<PrefillOptions>& all, int expected_tile_rows = 0,
                            bool skewed = false, const std::vector<int>& counts = {}, double mmq_rel_l2 = 2e-3,
                            bool same_bits = false, int64_t weight_sets = 0, double cross_rel_l2 = 0);

// Every algorithm; both grouped algorithms at the chosen and at every fixed tile height (on Q4_K
// shapes kGroupedTiles at 16, 32 and 64 is the streamed kernel with that bound on tile rows).
std::vector<PrefillOptions> AllOptions();

}  // namespace tandem::cuda::testing

#endif  // TANDEM_TESTS_GPU_MOE_PREFILL_CHECK_H_
