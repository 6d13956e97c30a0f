// Engram on the GPU (host-gathered rows, projections, gates, dilated conv with state, inject)
// against EngramForward over a prefill followed by decode steps.
#include "gpu_service/backends/cuda/moe/engram_host.h"

#include "common/reference/engram.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

TEST(GpuEngramTest, PrefillThenDecodeMatchesEngramForward) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  EngramConfig c;
  c.max_ngram = 3;
  c.heads = 2;
  c.head_dim = 16;
  c.conv_kernel = 3;
  c.dilation = 2;
  c.multipliers = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull};
  c.table_sizes = {31, 37, 41, 43};
  ASSERT_TRUE(CheckEngramConfig(c).ok());
  const int64_t S = 2, h = 64, width = S * h, pin = c.pin(), V = 50;
  const float eps = 1e-6f;
  const std::vector<uint8_t> embd = RandomMatrix(rng, WeightType::kF32, c.head_dim, c.total_rows(), 1.0f);
  const std::vector<uint8_t> key = RandomMatrix(rng, WeightType::kQ8_0, pin, width, 0.2f);
  const std::vector<uint8_t> value = RandomMatrix(rng, WeightType::kQ8_0, pin, h, 0.2f);
  const std::vector<float> key_norm = testing::UniformVector(rng, width, 0.5f, 1.5f);
  const std::vector<float> query_norm = testing::UniformVector(rng, width, 0.5f, 1.5f);
  const std::vector<float> conv_norm = testing::UniformVector(rng, width, 0.5f, 1.5f);
  const std::vector<float> conv = testing::RandomVector(rng, c.conv_kernel * width, 0.5f);
  EngramWeights w;
  w.embd = testing::HostMatrix(WeightType::kF32, embd, c.head_dim, c.total_rows());
  w.key = testing::HostMatrix(WeightType::kQ8_0, key, pin, width);
  w.value = testing::HostMatrix(WeightType::kQ8_0, value, pin, h);
  w.key_norm = key_norm;
  w.query_norm = query_norm;
  w.conv_norm = conv_norm;
  w.conv = conv;
  ASSERT_TRUE(CheckEngramWeights(w, c, S, h).ok());

  DeviceBuffer dkey = Upload(key), dvalue = Upload(value), dkn = Upload(key_norm), dqn = Upload(query_norm);
  DeviceBuffer dcn = Upload(conv_norm), dconv = Upload(conv);
  const EngramDeviceWeights dw{{kTypeQ8_0, dkey.get(), pin, width}, {kTypeQ8_0, dvalue.get(), pin, h},
                               dkn.as<float>(), dqn.as<float>(), dcn.as<float>(), dconv.as<float>()};
  absl::StatusOr<GpuEngramLayer> layer = GpuEngramLayer::Create(c, S, h, 8);
  ASSERT_TRUE(layer.ok()) << layer.status();

  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> tokens;
  std::vector<float> ref_state(static_cast<size_t>(c.conv_history() * width), 0.0f);
  DeviceBuffer state = Upload(ref_state);
  int64_t pos = 0;
  for (int64_t n : {5, 1, 1, 1, 3}) {
    for (int64_t i = 0; i < n; ++i) tokens.push_back(tok(rng));
    std::vector<int64_t> rows(static_cast<size_t>(n * c.rows_per_token()));
    EngramRows(c, {}, tokens, pos, n, rows.data());
    const std::vector<float> H = testing::RandomVector(rng, n * width);
    std::vector<float> ref_H = H;
    EngramForward(w, c, rows.data(), ref_H.data(), n, S, h, eps, ref_state.data(), nullptr);

    DeviceBuffer dH = Upload(H);
    ASSERT_TRUE(layer->Stage(w.embd, rows, n, nullptr).ok());
    const absl::Status s = layer->Forward(dw, dH.as<float>(), n, eps, state.as<float>(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got_H = Download<float>(dH.get(), H.size());
    const std::vector<float> got_state = Download<float>(state.get(), ref_state.size());
    ASSERT_TRUE(testing::AllFinite(got_H));
    EXPECT_LE(testing::RelativeL2(got_H, ref_H), 1e-5) << "positions " << pos << "+" << n;
    EXPECT_LE(testing::RelativeL2(got_state, ref_state), 1e-5) << "positions " << pos << "+" << n;
    pos += n;
  }
}

}  // namespace
}  // namespace tandem::cuda
