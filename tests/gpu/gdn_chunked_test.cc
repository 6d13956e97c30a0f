// Parity of the chunked GPU delta rule (LaunchGdnChunked) with the CPU reference's recurrent form
// (common/reference/gdn_rule.h) and with the GPU recurrent kernel, in both precisions: outputs and
// the final state, for inputs shaped as the model produces them (q, k L2-normalised, q scaled by
// 1/√dk, β in (0, 1), g ≤ 0), from a non-zero state, over n that are and are not multiples of the
// chunk, split over calls and over scratch-limited passes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/reference/gdn_rule.h"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem {
namespace {

using cuda::GdnChunkPrecision;
using gpu_testing::DeviceArray;
using gpu_testing::Download;
using gpu_testing::LogError;
using gpu_testing::Poisoned;
using gpu_testing::RelL2;
using gpu_testing::Upload;

// Prepared inputs of n tokens in the layouts LaunchGdnRecurrent reads: conv_out rows of c_dim
// (q heads, k heads, v heads), g and beta n × nv.
struct GdnInputs {
  cuda::GdnShape d;
  int64_t n = 0;
  std::vector<float> conv, g, beta, state;
};

void NormaliseHead(float* x, int dk, float scale) {
  double ss = 0.0;
  for (int i = 0; i < dk; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float s = scale / std::sqrt(static_cast<float>(ss) + 1e-6f);
  for (int i = 0; i < dk; ++i) x[i] *= s;
}

GdnInputs RandomInputs(std::mt19937& rng, int nk, int nv, int dk, int64_t n) {
  GdnInputs in;
  in.d = cuda::GdnShape{nk, nv, dk, dk, 4};
  in.n = n;
  const int c_dim = in.d.c_dim();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  in.conv.resize(static_cast<size_t>(n * c_dim));
  for (float& x : in.conv) x = normal(rng);
  for (int64_t t = 0; t < n; ++t) {
    float* row = in.conv.data() + t * c_dim;
    for (int h = 0; h < nk; ++h) {
      NormaliseHead(row + h * dk, dk, 1.0f / std::sqrt(static_cast<float>(dk)));
      NormaliseHead(row + (nk + h) * dk, dk, 1.0f);
    }
  }
  // g = ssm_a·softplus(a + dt_bias) with ssm_a in [−16, −1] (A_log in [0, log 16]); some strong
  // decays, many weak ones. β = σ(b).
  std::uniform_real_distribution<float> log_a(0.0f, std::log(16.0f));
  std::vector<float> ssm_a(static_cast<size_t>(nv));
  for (float& a : ssm_a) a = -std::exp(log_a(rng));
  in.g.resize(static_cast<size_t>(n * nv));
  in.beta.resize(in.g.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < nv; ++h) {
      const float x = normal(rng) * 1.5f - 3.0f;
      in.g[t * nv + h] = ssm_a[h] * std::log1p(std::exp(x));
      in.beta[t * nv + h] = 1.0f / (1.0f + std::exp(-1.5f * normal(rng)));
    }
  }
  in.state.resize(static_cast<size_t>(nv) * dk * dk);
  for (float& s : in.state) s = 0.3f * normal(rng);
  return in;
}

// The CPU recurrent form over tokens [t0, t1) of every value head; state is S[nv][dk][dv].
void ReferenceRecurrent(const GdnInputs& in, int64_t t0, int64_t t1, std::vector<float>& state,
                        std::vector<float>& o) {
  const int nk = in.d.nk, nv = in.d.nv, dk = in.d.dk, dv = in.d.dv, c_dim = in.d.c_dim();
  const int64_t n = t1 - t0;
  o.resize(static_cast<size_t>(in.n) * nv * dv);
  std::vector<float> q(n * dk), k(n * dk), v(n * dv), g(n), beta(n), oh(n * dv);
  for (int vh = 0; vh < nv; ++vh) {
    const int group = vh / (nv / nk);
    for (int64_t t = 0; t < n; ++t) {
      const float* row = in.conv.data() + (t0 + t) * c_dim;
      std::copy(row + group * dk, row + (group + 1) * dk, q.begin() + t * dk);
      std::copy(row + (nk + group) * dk, row + (nk + group + 1) * dk, k.begin() + t * dk);
      std::copy(row + 2 * nk * dk + vh * dv, row + 2 * nk * dk + (vh + 1) * dv, v.begin() + t * dv);
      g[t] = in.g[(t0 + t) * nv + vh];
      beta[t] = in.beta[(t0 + t) * nv + vh];
    }
    GatedDeltaRuleRecurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), n, dk, dv,
                            state.data() + static_cast<int64_t>(vh) * dk * dv, oh.data());
    for (int64_t t = 0; t < n; ++t) {
      std::copy(oh.begin() + t * dv, oh.begin() + (t + 1) * dv, o.begin() + ((t0 + t) * nv + vh) * dv);
    }
  }
}

double Tolerance(GdnChunkPrecision p) { return p == GdnChunkPrecision::kF32 ? 1e-5 : 1e-2; }
const char* Name(GdnChunkPrecision p) { return p == GdnChunkPrecision::kF32 ? "f32" : "tf32"; }

// Runs the chunked kernel over `splits` (token counts of consecutive calls) with scratch for
// scratch_tokens tokens; returns outputs and the final state.
void RunChunked(const GdnInputs& in, const std::vector<int64_t>& splits, int64_t scratch_tokens,
                GdnChunkPrecision p, std::vector<float>& o, std::vector<float>& state) {
  const int nv = in.d.nv, dv = in.d.dv, c_dim = in.d.c_dim();
  DeviceArray<float> d_conv = Upload(in.conv), d_g = Upload(in.g), d_beta = Upload(in.beta);
  DeviceArray<float> d_state = Upload(in.state);
  DeviceArray<float> d_o = Poisoned<float>(static_cast<size_t>(in.n) * nv * dv);
  const int64_t scratch_bytes = cuda::GdnChunkedScratchBytes(in.d, scratch_tokens);
  ASSERT_GT(scratch_bytes, 0);
  DeviceArray<uint8_t> scratch = Poisoned<uint8_t>(static_cast<size_t>(scratch_bytes));
  int64_t t0 = 0;
  for (int64_t len : splits) {
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnChunked(d_conv.get() + t0 * c_dim, d_g.get() + t0 * nv, d_beta.get() + t0 * nv,
                                              len, in.d, p, scratch.get(), scratch_bytes, d_state.get(),
                                              d_o.get() + t0 * nv * dv, nullptr));
    t0 += len;
  }
  ASSERT_EQ(t0, in.n);
  o = Download(d_o);
  state = Download(d_state);
}

struct ChunkedCase {
  int dk;
  GdnChunkPrecision precision;
};

class GpuGdnChunkedTest : public ::testing::TestWithParam<ChunkedCase> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// One call per n, scratch for all tokens: n = 1, a partial chunk, exactly one chunk, and several
// chunks with a partial last one.
TEST_P(GpuGdnChunkedTest, MatchesRecurrentReference) {
  const ChunkedCase tc = GetParam();
  std::mt19937 rng(1234 + tc.dk);
  for (int64_t n : {1, 37, 64, 200}) {
    const GdnInputs in = RandomInputs(rng, 2, 4, tc.dk, n);
    std::vector<float> ref_state = in.state, ref_o;
    ReferenceRecurrent(in, 0, n, ref_state, ref_o);
    std::vector<float> o, state;
    RunChunked(in, {n}, n, tc.precision, o, state);
    const std::string what = std::string(Name(tc.precision)) + "_dk" + std::to_string(tc.dk) + "_n" + std::to_string(n);
    EXPECT_LE(LogError(what + "_out", RelL2(o, ref_o)), Tolerance(tc.precision));
    EXPECT_LE(LogError(what + "_state", RelL2(state, ref_state)), Tolerance(tc.precision));
  }
}

// 300 tokens as calls of 100, 1, 130 and 69 tokens, with scratch for one chunk only (every call
// runs in passes of 64 tokens): the state carries across calls and passes.
TEST_P(GpuGdnChunkedTest, SplitOverCallsAndPassesMatchesReference) {
  const ChunkedCase tc = GetParam();
  std::mt19937 rng(99 + tc.dk);
  const GdnInputs in = RandomInputs(rng, 2, 4, tc.dk, 300);
  std::vector<float> ref_state = in.state, ref_o;
  ReferenceRecurrent(in, 0, in.n, ref_state, ref_o);
  std::vector<float> o, state;
  RunChunked(in, {100, 1, 130, 69}, cuda::kGdnChunk, tc.precision, o, state);
  const std::string what = std::string(Name(tc.precision)) + "_dk" + std::to_string(tc.dk) + "_split";
  EXPECT_LE(LogError(what + "_out", RelL2(o, ref_o)), Tolerance(tc.precision));
  EXPECT_LE(LogError(what + "_state", RelL2(state, ref_state)), Tolerance(tc.precision));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnChunkedTest,
                         ::testing::Values(ChunkedCase{64, GdnChunkPrecision::kF32},
                                           ChunkedCase{128, GdnChunkPrecision::kF32},
                                           ChunkedCase{64, GdnChunkPrecision::kTf32},
                                           ChunkedCase{128, GdnChunkPrecision::kTf32}),
                         [](const ::testing::TestParamInfo<ChunkedCase>& info) {
                           return std::string(Name(info.param.precision)) + "_dk" + std::to_string(info.param.dk);
                         });

// Qwen3-Next-80B shapes (nk 16, nv 32, dk = dv = 128) over 1000 tokens: both precisions against
// the GPU recurrent kernel (itself checked against the reference in gdn_attention_test.cc).
TEST(GpuGdnChunkedLongTest, MatchesGpuRecurrentAtModelShape) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const GdnInputs in = RandomInputs(rng, 16, 32, 128, 1000);
  DeviceArray<float> d_conv = Upload(in.conv), d_g = Upload(in.g), d_beta = Upload(in.beta);
  DeviceArray<float> d_state = Upload(in.state);
  DeviceArray<float> d_o = Poisoned<float>(static_cast<size_t>(in.n) * in.d.nv * in.d.dv);
  TANDEM_ASSERT_CUDA(cuda::LaunchGdnRecurrent(d_conv.get(), d_g.get(), d_beta.get(), in.n, in.d, d_state.get(),
                                              d_o.get(), nullptr));
  const std::vector<float> rec_o = Download(d_o), rec_state = Download(d_state);
  for (GdnChunkPrecision p : {GdnChunkPrecision::kF32, GdnChunkPrecision::kTf32}) {
    std::vector<float> o, state;
    RunChunked(in, {in.n}, in.n, p, o, state);
    const std::string what = std::string(Name(p)) + "_q3n80b_n1000";
    EXPECT_LE(LogError(what + "_out", RelL2(o, rec_o)), Tolerance(p));
    EXPECT_LE(LogError(what + "_state", RelL2(state, rec_state)), Tolerance(p));
  }
}

// Argument checks happen before any device work, so this runs without a GPU too.
TEST(GdnChunkedArgsTest, RejectsUnsupportedShapesAndScratch) {
  const cuda::GdnShape ok{2, 4, 128, 128, 4};
  EXPECT_EQ(cuda::GdnChunkedScratchBytes(ok, 1), cuda::GdnChunkedScratchBytes(ok, cuda::kGdnChunk));
  EXPECT_EQ(cuda::GdnChunkedScratchBytes(ok, 65), 2 * cuda::GdnChunkedScratchBytes(ok, 64));
  EXPECT_EQ(cuda::GdnChunkedScratchBytes(ok, 64), 4 * (64 * 128 * 2 + 64 * 64 + 128) * 4);
  EXPECT_EQ(cuda::GdnChunkedScratchBytes(cuda::GdnShape{2, 4, 96, 96, 4}, 64), 0);
  EXPECT_EQ(cuda::GdnChunkedScratchBytes(cuda::GdnShape{2, 4, 128, 64, 4}, 64), 0);
  EXPECT_EQ(cuda::GdnChunkedScratchBytes(ok, 0), 0);

  // Fake, never dereferenced, suitably aligned addresses: every call below must fail its checks.
  alignas(256) static float fake[64];
  float* p = fake;
  const int64_t one_chunk = cuda::GdnChunkedScratchBytes(ok, 64);
  EXPECT_EQ(cuda::LaunchGdnChunked(p, p, p, 10, cuda::GdnShape{2, 4, 96, 96, 4}, GdnChunkPrecision::kF32, p,
                                   one_chunk * 4, p, p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchGdnChunked(p, p, p, 10, cuda::GdnShape{2, 3, 128, 128, 4}, GdnChunkPrecision::kF32, p,
                                   one_chunk * 4, p, p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchGdnChunked(p, p, p, 10, ok, GdnChunkPrecision::kF32, p, one_chunk - 1, p, p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchGdnChunked(p, p, p, 10, ok, GdnChunkPrecision::kTf32, nullptr, one_chunk, p, p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchGdnChunked(p, p, p, 10, ok, GdnChunkPrecision::kF32, p + 1, one_chunk, p, p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchGdnChunked(p + 1, p, p, 10, ok, GdnChunkPrecision::kF32, p, one_chunk, p, p, nullptr),
            cudaErrorInvalidValue);
  // n = 0 is a no-op that touches nothing.
  EXPECT_EQ(cuda::LaunchGdnChunked(p, p, p, 0, ok, GdnChunkPrecision::kF32, nullptr, 0, p, p, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace tandem
