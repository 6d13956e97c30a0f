// Shared by the GDN kernel tests (gdn_tokens_test.cc, gdn_decode_fused_test.cc,
// gdn_attention_test.cc, gdn_decode_layer_test.cc, gdn_rows_polled_test.cc): the layer's small random
// parameters, drawn in one fixed order so that a seed (tests/test_seed.h) repeats a run, and the
// one-token fused kernel's arguments over a stacked [z; qkv; ba] product.
#ifndef TANDEM_TESTS_GPU_GDN_TEST_UTIL_H_
#define TANDEM_TESTS_GPU_GDN_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
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

// A test case's name: the shape and the stacked product's width h.
inline std::string LayerTag(const cuda::GdnShape& d, int64_t h) {
  return "nk" + std::to_string(d.nk) + "_nv" + std::to_string(d.nv) + "_dk" + std::to_string(d.dk) + "_dv" +
         std::to_string(d.dv) + "_h" + std::to_string(h);
}

// A sequence's row of recurrent state in the tests' buffers: the conv history first, the state at
// ssm_off (16-byte aligned), a few floats of padding after, row_stride floats in all.
struct StateLayout {
  int64_t ssm_off = 0, row_stride = 0;
};
inline StateLayout StateLayoutOf(const cuda::GdnShape& d) {
  StateLayout l;
  l.ssm_off = ((d.kk - 1) * d.c_dim() + 3) / 4 * 4 + 4;
  l.row_stride = l.ssm_off + static_cast<int64_t>(d.nv) * d.dk * d.dv + 12;
  return l;
}

// The fused kernel's arguments for one token at state row seq_rows[0] (history and state: the caller's).
inline cuda::GdnDecodeFusedArgs OneTokenArgs(const GdnParams& p, int64_t row_stride, const int32_t* seq_rows) {
  cuda::GdnDecodeFusedArgs args;
  args.taps = p.taps.get();
  args.ssm_a = p.ssm_a.get();
  args.dt_bias = p.dt_bias.get();
  args.norm = p.norm.get();
  args.row_stride = row_stride;
  args.rows = seq_rows;
  args.eps = 1e-6f;
  return args;
}

// args reading z, qkv and ba from a stacked [z; qkv; ba] product's rows at `rows`.
inline cuda::GdnDecodeFusedArgs ReadingStackedRows(cuda::GdnDecodeFusedArgs args, float* rows,
                                                   const cuda::GdnShape& d) {
  const int64_t vw = static_cast<int64_t>(d.nv) * d.dv;
  args.z = rows;
  args.qkv = rows + vw;
  args.ba = rows + vw + d.c_dim();
  args.z_stride = args.qkv_stride = args.ba_stride = vw + d.c_dim() + 2 * d.nv;
  return args;
}

}  // namespace tandem::gdn_testing

#endif  // TANDEM_TESTS_GPU_GDN_TEST_UTIL_H_
