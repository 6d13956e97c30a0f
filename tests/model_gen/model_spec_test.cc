#include "common/model_gen/model_spec.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/model_gen/model_plan.h"
#include "common/model_gen/routing_skew.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::map<std::string, PlannedTensor> ByName(const std::vector<PlannedTensor>& plan) {
  std::map<std::string, PlannedTensor> out;
  for (const PlannedTensor& t : plan) out[t.name] = t;
  return out;
}

TEST(PresetSpecTest, EveryPresetIsValidAndPlans) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<GenModelSpec> spec = PresetSpec(name);
    ASSERT_TRUE(spec.ok()) << name;
    EXPECT_TRUE(CheckGenModelSpec(*spec).ok()) << name << ": " << CheckGenModelSpec(*spec);
    absl::StatusOr<std::vector<PlannedTensor>> plan = PlanTensors(*spec);
    ASSERT_TRUE(plan.ok()) << name;
    std::set<std::string> names;
    for (const PlannedTensor& t : *plan) EXPECT_TRUE(names.insert(t.name).second) << t.name;
  }
  absl::StatusOr<GenModelSpec> bad = PresetSpec("huge");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.status().message(), HasSubstr("tiny, tiny-q3n, small, q3n-80b, q4x-80b"));
}

TEST(PresetSpecTest, Q3n80bHasTheExactQwen3NextShapes) {
  const GenModelSpec s = *PresetSpec("q3n-80b");
  EXPECT_EQ(s.arch, "qwen3next");
  EXPECT_EQ(s.h, 2048);
  EXPECT_EQ(s.layers, 48);
  EXPECT_EQ(s.nextn, 1);
  EXPECT_EQ(s.n_head, 16);
  EXPECT_EQ(s.n_head_kv, 2);
  EXPECT_EQ(s.head_dim, 256);
  EXPECT_EQ(s.rope_dims, 64);
  EXPECT_EQ(s.rope_theta, 1e7);
  EXPECT_EQ(s.ssm_nk, 16);
  EXPECT_EQ(s.ssm_nv, 32);
  EXPECT_EQ(s.ssm_dk, 128);
  EXPECT_EQ(s.ssm_conv_kernel, 4);
  EXPECT_EQ(s.experts, 512);
  EXPECT_EQ(s.experts_used, 10);
  EXPECT_EQ(s.expert_ffn, 512);
  EXPECT_EQ(s.shared_ffn, 512);
  EXPECT_EQ(s.vocab, 151936);
  EXPECT_EQ(s.full_attention_interval, 4);
  EXPECT_EQ(s.expert_gate_up_type, WeightType::kQ4_K);
  EXPECT_EQ(s.expert_down_type, WeightType::kQ4_K);
  EXPECT_EQ(s.dense_type, WeightType::kQ8_0);
  EXPECT_EQ(s.head_type, WeightType::kQ6_K);

  const std::vector<PlannedTensor> plan = *PlanTensors(s);
  const auto t = ByName(plan);
  auto shape = [&t](const std::string& name) {
    auto it = t.find(name);
    return it == t.end() ? std::vector<int64_t>{-1} : it->second.ne;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape("token_embd.weight"), (V{2048, 151936}));
  EXPECT_EQ(shape("output.weight"), (V{2048, 151936}));
  EXPECT_EQ(shape("blk.0.attn_qkv.weight"), (V{2048, 8192}));  // 2·16·128 + 32·128
  EXPECT_EQ(shape("blk.0.attn_gate.weight"), (V{2048, 4096}));
  EXPECT_EQ(shape("blk.0.ssm_ba.weight"), (V{2048, 64}));
  EXPECT_EQ(shape("blk.0.ssm_conv1d.weight"), (V{4, 8192}));
  EXPECT_EQ(shape("blk.0.ssm_a"), (V{32}));
  EXPECT_EQ(shape("blk.0.ssm_dt.bias"), (V{32}));
  EXPECT_EQ(shape("blk.0.ssm_norm.weight"), (V{128}));
  EXPECT_EQ(shape("blk.0.ssm_out.weight"), (V{4096, 2048}));
  EXPECT_EQ(shape("blk.3.attn_q.weight"), (V{2048, 8192}));  // 16 heads · 2 · 256
  EXPECT_EQ(shape("blk.3.attn_k.weight"), (V{2048, 512}));
  EXPECT_EQ(shape("blk.3.attn_v.weight"), (V{2048, 512}));
  EXPECT_EQ(shape("blk.3.attn_output.weight"), (V{4096, 2048}));
  EXPECT_EQ(shape("blk.3.attn_q_norm.weight"), (V{256}));
  EXPECT_EQ(shape("blk.47.ffn_gate_inp.weight"), (V{2048, 512}));
  EXPECT_EQ(shape("blk.47.ffn_gate_exps.weight"), (V{2048, 512, 512}));
  EXPECT_EQ(shape("blk.47.ffn_down_exps.weight"), (V{512, 2048, 512}));
  EXPECT_EQ(shape("blk.47.ffn_gate_inp_shexp.weight"), (V{2048}));
  EXPECT_EQ(shape("blk.47.ffn_down_shexp.weight"), (V{512, 2048}));
  EXPECT_EQ(shape("blk.48.nextn.eh_proj.weight"), (V{4096, 2048}));
  EXPECT_EQ(shape("blk.48.nextn.shared_head_norm.weight"), (V{2048}));
  EXPECT_EQ(shape("blk.48.attn_q.weight"), (V{2048, 8192}));
  EXPECT_EQ(shape("blk.48.ffn_up_exps.weight"), (V{2048, 512, 512}));
  EXPECT_EQ(t.count("blk.4.attn_q.weight"), 0u);  // layer 4 is GDN
  EXPECT_EQ(t.count("blk.0.attn_hc_norm.weight"), 0u);

  int attention = 0;
  for (int64_t i = 0; i < 48; ++i) attention += IsAttentionLayer(s, i);
  EXPECT_EQ(attention, 12);
  EXPECT_EQ(t.at("blk.47.ffn_gate_exps.weight").ggml_type, static_cast<uint32_t>(WeightType::kQ4_K));
  EXPECT_TRUE(t.at("blk.47.ffn_gate_exps.weight").direct_quant);
  EXPECT_EQ(t.at("output.weight").ggml_type, static_cast<uint32_t>(WeightType::kQ6_K));
  EXPECT_EQ(t.at("blk.3.attn_q.weight").ggml_type, static_cast<uint32_t>(WeightType::kQ8_0));

  // Experts: 49 layers × 3 matrices × 512 × 512 × 2048 values at 4.5 bits = 44.4 GB; dense, head
  // and embedding add about 2.6 GB.
  const double gb = PlannedDataBytes(plan) / 1e9;
  EXPECT_GT(gb, 44.0);
  EXPECT_LT(gb, 49.0);
}

TEST(PresetSpecTest, Q4x80bAddsTheQwen4expFeaturesToTheSameShapes) {
  const GenModelSpec s = *PresetSpec("q4x-80b");
  EXPECT_EQ(s.arch, "qwen4exp");
  EXPECT_EQ(s.h, 2048);
  EXPECT_EQ(s.experts, 512);
  EXPECT_GT(s.streams, 1);
  EXPECT_GT(s.idx_heads, 0);
  EXPECT_FALSE(s.engram_layers.empty());
  EXPECT_EQ(s.expert_gate_up_type, WeightType::kQ2_K);
  const auto t = ByName(*PlanTensors(s));
  EXPECT_EQ(t.at("blk.0.attn_hc_down.weight").ne, (std::vector<int64_t>{8192, 64}));
  EXPECT_EQ(t.at("blk.48.nextn.hc_up.weight").ne, (std::vector<int64_t>{64, 8192}));
  EXPECT_EQ(t.at("blk.3.attn_idx_qk.weight").ne, (std::vector<int64_t>{2048, 8 * 128 + 128}));
}

TEST(CheckGenModelSpecTest, NamesEveryBadField) {
  GenModelSpec s = *PresetSpec("tiny");
  s.n_head_kv = 3;
  s.rope_dims = 33;
  s.engram_layers = {1, 99};
  s.experts_used = 20;
  const absl::Status st = CheckGenModelSpec(s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("n_head = 4 must be a multiple of n_head_kv = 3"));
  EXPECT_THAT(st.message(), HasSubstr("rope_dims = 33"));
  EXPECT_THAT(st.message(), HasSubstr("engram_layers[1] = 99 is not a main layer"));
  EXPECT_THAT(st.message(), HasSubstr("experts_used = 20 exceeds experts = 16"));

  GenModelSpec q3n = *PresetSpec("tiny-q3n");
  q3n.streams = 4;
  q3n.hc_rank = 8;
  EXPECT_THAT(CheckGenModelSpec(q3n).message(), HasSubstr("qwen4exp features"));
  GenModelSpec small_vocab = *PresetSpec("tiny");
  small_vocab.vocab = 100;
  EXPECT_THAT(CheckGenModelSpec(small_vocab).message(), HasSubstr("vocab = 100"));
  EXPECT_FALSE(PlanTensors(small_vocab).ok());
}

TEST(DerivedTest, EngramTablesAreDistinctPrimesAndMultipliersOdd) {
  const GenModelSpec s = *PresetSpec("tiny");
  const std::vector<uint32_t> sizes = EngramTableSizes(s);
  ASSERT_EQ(sizes.size(), s.engram_layers.size() * (s.engram_max_ngram - 1) * s.engram_heads);
  std::set<uint32_t> distinct(sizes.begin(), sizes.end());
  EXPECT_EQ(distinct.size(), sizes.size());
  for (uint32_t p : sizes) {
    EXPECT_LT(p, s.engram_table_rows);
    for (uint32_t d = 2; d * d <= p; ++d) ASSERT_NE(p % d, 0u) << p;
  }
  const std::vector<uint64_t> mult = EngramMultipliers(s);
  ASSERT_EQ(mult.size(), s.engram_layers.size() * s.engram_max_ngram);
  for (uint64_t m : mult) {
    EXPECT_EQ(m & 1, 1u);
    EXPECT_LT(m, uint64_t{1} << 63);
  }
  GenModelSpec other = s;
  other.seed = 2;
  EXPECT_NE(EngramMultipliers(other), mult);
  EXPECT_EQ(EngramTableSizes(other), sizes);
}

TEST(DerivedTest, FitWeightTypeFallsBackWhenTheBlockDoesNotDivide) {
  EXPECT_EQ(FitWeightType(WeightType::kQ4_K, 512), WeightType::kQ4_K);
  EXPECT_EQ(FitWeightType(WeightType::kQ4_K, 96), WeightType::kQ8_0);
  EXPECT_EQ(FitWeightType(WeightType::kQ8_0, 40), WeightType::kF16);
  EXPECT_EQ(FitWeightType(WeightType::kF32, 7), WeightType::kF32);
}

TEST(RoutingSkewTest, CoefficientsFollowTheZipfRanks) {
  GenModelSpec s = *PresetSpec("tiny");
  for (float c : RouterSkewCoefficients(s, 0)) EXPECT_EQ(c, 0.0f);  // zipf = 0: no skew
  s.zipf = 1.2;
  const std::vector<int64_t> ranks = ExpertPopularityRanks(s, 2);
  std::set<int64_t> distinct(ranks.begin(), ranks.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(s.experts));
  EXPECT_EQ(*distinct.begin(), 1);
  EXPECT_EQ(*distinct.rbegin(), s.experts);
  EXPECT_NE(ExpertPopularityRanks(s, 3), ranks);  // each layer has its own hot experts
  const std::vector<double> shift = TargetLogitShifts(s, 2);
  const std::vector<float> coef = RouterSkewCoefficients(s, 2);
  for (int64_t a = 0; a < s.experts; ++a) {
    for (int64_t b = 0; b < s.experts; ++b) {
      if (ranks[a] < ranks[b]) {
        EXPECT_GT(coef[a], coef[b]);
        // Zipf: the logit gap between two experts is zipf·ln(rank ratio).
        EXPECT_NEAR(shift[a] - shift[b], 1.2 * std::log(static_cast<double>(ranks[b]) / ranks[a]),
                    1e-9);
      }
    }
  }
  // Deeper layers get larger coefficients to make up for the residual stream's growth: the most
  // popular expert's logit shift is the same in every layer, its coefficient grows.
  auto hottest_coef = [&s](int64_t layer) {
    const std::vector<int64_t> r = ExpertPopularityRanks(s, layer);
    return RouterSkewCoefficients(s, layer)[std::find(r.begin(), r.end(), 1) - r.begin()];
  };
  EXPECT_GT(hottest_coef(0), 0.0f);
  EXPECT_GT(hottest_coef(5), hottest_coef(0));
}

}  // namespace
}  // namespace tandem
