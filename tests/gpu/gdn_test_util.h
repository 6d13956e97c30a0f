// Shared by the GDN kernel tests (gdn_tokens_test.cc, gdn_decode_fused_test.cc,
// gdn_attention_test.cc): the layer's small random parameters, drawn in one fixed order so that a
// seed (tests/test_seed.h) repeats a run.
#ifndef TANDEM_TESTS_GPU_GDN_TEST_UTIL_H_
#define TANDEM_TESTS_GPU_GDN_TEST_UTIL_H_

#include <cmath>
#include <random>
#include <vector>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::gdn_testing {

// ssm_a (nv values): negative, as the model's A = −exp(A_log), so exp(g) is a decay below one.
inline std::vector<float> RandomSsmA(std::mt19937& rng, int nv) {
  std::vector<float> a = gpu_testing::Random(rng, static_cast<size_t>(nv), 0.5f, -1.0f);
  for (float& v : a) v = -std::fabs(v);
  return a;
}

// The conv taps (c_dim × kk), ssm_a, dt_bias (nv each) and the gated norm's weights (dv) on the
// device, drawn in that order.
struct GdnParams {
  gpu_testing::DeviceArray<float> taps, ssm_a, dt_bias, norm;
};

inline GdnParams RandomGdnParams(std::mt19937& rng, const cuda::GdnShape& d) {
  using gpu_testing::Random;
  using gpu_testing::Upload;
  GdnParams p;
  p.taps = Upload(Random(rng, static_cast<size_t>(d.c_dim() * d.kk), 0.5f));
  p.ssm_a = Upload(RandomSsmA(rng, d.nv));
  p.dt_bias = Upload(Random(rng, static_cast<size_t>(d.nv), 0.5f));
  p.norm = Upload(Random(rng, static_cast<size_t>(d.dv), 0.2f, 1.0f));
  return p;
}

}  // namespace tandem::gdn_testing

#endif  // TANDEM_TESTS_GPU_GDN_TEST_UTIL_H_
