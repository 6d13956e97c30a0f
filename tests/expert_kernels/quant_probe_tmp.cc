// TEMPORARY probe (to be deleted): simulated activation quantization schemes vs the f32 reference.
#include <cmath>
#include <cstdio>
#include <vector>
#include "common/reference/matmul.h"
#include "common/reference/moe.h"
#include "gtest/gtest.h"
#include "tests/expert_kernels/random_experts.h"
namespace tandem {
namespace {
constexpr int64_t kH = 512, kI = 256, kE = 4;
// block 0: exact. split: add a residual int8 pass.
std::vector<float> Q(const float* x, int64_t n, int block, bool split, bool ggml_signed) {
  std::vector<float> out(x, x + n);
  if (block == 0) return out;
  for (int64_t b = 0; b < n; b += block) {
    float amax = 0, mx = 0;
    for (int i = 0; i < block; ++i) if (std::fabs(x[b+i]) > amax) { amax = std::fabs(x[b+i]); mx = x[b+i]; }
    if (amax == 0) continue;
    float d = ggml_signed ? -mx / 128.0f : amax / 127.0f;
    for (int i = 0; i < block; ++i) {
      float q = std::nearbyint(x[b+i] / d); q = std::fmin(127, std::fmax(-128, q));
      out[b+i] = d * q;
    }
    if (split) {
      float ramax = 0;
      for (int i = 0; i < block; ++i) ramax = std::fmax(ramax, std::fabs(x[b+i] - out[b+i]));
      if (ramax == 0) continue;
      float d2 = ramax / 127.0f;
      for (int i = 0; i < block; ++i) out[b+i] += d2 * std::nearbyint((x[b+i] - out[b+i]) / d2);
    }
  }
  return out;
}
double Rel(const std::vector<float>& a, const std::vector<float>& b) {
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) { n += (double(a[i]) - b[i]) * (double(a[i]) - b[i]); d += double(b[i]) * b[i]; }
  return std::sqrt(n / d);
}
struct Scheme { int in_block; int mid_block; bool split; bool sgn; const char* name; };
TEST(Probe, Schemes) {
  const WeightType types[][2] = {{WeightType::kQ4_K, WeightType::kQ4_K}, {WeightType::kQ6_K, WeightType::kQ6_K},
                                 {WeightType::kQ8_0, WeightType::kQ8_0}, {WeightType::kQ2_K, WeightType::kQ2_K},
                                 {WeightType::kQ3_K, WeightType::kQ3_K}, {WeightType::kQ4_0, WeightType::kQ4_0}};
  const Scheme schemes[] = {
    {256, 0, false, false, "gu-only 256"}, {32, 0, false, false, "gu-only 32"}, {16, 0, false, false, "gu-only 16"},
    {256, 0, false, true, "gu-only 256 ggmlsign"},
    {0, 256, false, false, "down-only 256"}, {0, 32, false, false, "down-only 32"}, {0, 16, false, false, "down-only 16"},
    {0, 32, true, false, "down-only 32 split"},
    {256, 256, false, false, "both 256 (now)"}, {32, 32, false, false, "both 32"}, {16, 16, false, false, "both 16"},
    {32, 16, false, false, "in32 mid16"}, {32, 32, true, false, "in32 mid32split"}, {16, 32, true, false, "in16 mid32split"},
  };
  const int rows_n = 20;
  const std::vector<float> x = RandomActivations(rows_n * kH, 5);
  for (auto& t : types) {
    RandomExpertTensor g = MakeRandomExpertTensor(t[0], kH, kI, kE, 0.05f, 11);
    RandomExpertTensor u = MakeRandomExpertTensor(t[0], kH, kI, kE, 0.05f, 12);
    RandomExpertTensor dn = MakeRandomExpertTensor(t[1], kI, kH, kE, 0.08f, 13);
    std::printf("%s\n", std::string(GetWeightTypeInfo(t[0]).name).c_str());
    for (const Scheme& s : schemes) {
      std::vector<float> got, want;
      for (int e = 0; e < kE; ++e) for (int r = 0; r < rows_n; ++r) {
        const float* row = x.data() + r * kH;
        std::vector<float> gg(kI), uu(kI), o(kH), ow(kH);
        FfnForward(g.view.expert(e), u.view.expert(e), dn.view.expert(e), row, 1, ow.data(), nullptr);
        std::vector<float> xq = Q(row, kH, s.in_block, false, s.sgn);
        MatMul(g.view.expert(e), xq.data(), 1, gg.data(), nullptr);
        MatMul(u.view.expert(e), xq.data(), 1, uu.data(), nullptr);
        for (int j = 0; j < kI; ++j) gg[j] = gg[j] / (1.0f + std::exp(-gg[j])) * uu[j];
        std::vector<float> m = Q(gg.data(), kI, s.mid_block, s.split, s.sgn);
        MatMul(dn.view.expert(e), m.data(), 1, o.data(), nullptr);
        got.insert(got.end(), o.begin(), o.end()); want.insert(want.end(), ow.begin(), ow.end());
      }
      std::printf("  %-22s %.4f %%\n", s.name, 100 * Rel(got, want));
    }
  }
}
}  // namespace
}  // namespace tandem
