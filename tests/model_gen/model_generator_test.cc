#include "common/model_gen/model_generator.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model_gen/model_plan.h"
#include "common/model_gen/routing_skew.h"
#include "common/model_gen/tensor_fill.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/model_gen_" + std::to_string(getpid()) + "_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The presets each written once per test binary (writing tiny takes a moment on 2 cores); the
// files are deleted at exit.
struct Written {
  std::string path;
  std::unique_ptr<GgufFile> file;
};

class WrittenPresets {
 public:
  ~WrittenPresets() {
    for (auto& [preset, w] : written_) {
      w.file.reset();
      unlink(w.path.c_str());
    }
  }
  Written& Get(const std::string& preset) {
    auto it = written_.find(preset);
    if (it != written_.end()) return it->second;
    Written& w = written_[preset];
    w.path = TempPath(preset + ".gguf");
    absl::Status s = GenerateModel(*PresetSpec(preset), w.path);
    EXPECT_TRUE(s.ok()) << s;
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(w.path);
    EXPECT_TRUE(f.ok()) << f.status();
    if (f.ok()) w.file = *std::move(f);
    return w;
  }

 private:
  std::map<std::string, Written> written_;
};

Written& WrittenPreset(const std::string& preset) {
  static WrittenPresets presets;
  return presets.Get(preset);
}

std::vector<float> Dequantized(const GgufTensorInfo& t) {
  std::vector<float> v(t.n_elements);
  const int64_t row = t.ne[0];
  const int64_t row_bytes = *RowBytes(t.weight_type(), row);
  for (int64_t r = 0; r < t.n_elements / row; ++r) {
    DequantizeRow(t.weight_type(), t.data.data() + r * row_bytes, v.data() + r * row, row);
  }
  return v;
}

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / v.size());
}

class PresetFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetFileTest, WritesAFileThatReadsBackAsTheSpec) {
  const GenModelSpec spec = *PresetSpec(GetParam());
  Written& w = WrittenPreset(GetParam());
  ASSERT_NE(w.file, nullptr);
  const GgufFile& f = *w.file;
  EXPECT_LT(f.file_size(), 30u * 1000 * 1000);

  absl::StatusOr<ModelConfig> c = ReadModelConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, spec.arch);
  EXPECT_EQ(c->h, spec.h);
  EXPECT_EQ(c->n_layers, spec.layers);
  EXPECT_EQ(c->nextn, spec.nextn);
  EXPECT_EQ(c->vocab, spec.vocab);
  EXPECT_EQ(c->moe.E, spec.experts);
  EXPECT_EQ(c->moe.K, spec.experts_used);
  EXPECT_EQ(c->expert_ffn, spec.expert_ffn);
  EXPECT_EQ(c->shared_ffn, spec.shared_ffn);
  EXPECT_EQ(c->n_streams, spec.streams);
  EXPECT_EQ(c->attn.ih, spec.idx_heads);
  EXPECT_EQ(c->engram_layers, spec.engram_layers);
  ASSERT_EQ(c->layer_kinds.size(), static_cast<size_t>(spec.layers + spec.nextn));
  for (int64_t i = 0; i < spec.layers + spec.nextn; ++i) {
    EXPECT_EQ(c->layer_kinds[i] == LayerKind::kAttention, IsAttentionLayer(spec, i)) << i;
  }
  EXPECT_EQ(*f.GetU64("tandem.generator.seed"), spec.seed);
  // Every tensor the engine needs binds with the right shape and type.
  absl::StatusOr<ModelWeights> weights = BindModelWeights(f, *c);
  EXPECT_TRUE(weights.ok()) << weights.status();

  // The file holds exactly the plan, in order.
  const std::vector<PlannedTensor> plan = *PlanTensors(spec);
  ASSERT_EQ(f.tensors().size(), plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, plan[i].name);
    EXPECT_EQ(t.ggml_type, plan[i].ggml_type) << t.name;
    EXPECT_EQ(t.n_dims, static_cast<int>(plan[i].ne.size())) << t.name;
    for (size_t d = 0; d < plan[i].ne.size(); ++d) EXPECT_EQ(t.ne[d], plan[i].ne[d]) << t.name;
  }

  // The tokenizer in the metadata builds.
  TokenizerSpec tok;
  tok.model = *f.GetString("tokenizer.ggml.model");
  tok.pre = *f.GetString("tokenizer.ggml.pre");
  const absl::Span<const std::string> tokens = *f.GetStringArray("tokenizer.ggml.tokens");
  const absl::Span<const std::string> merges = *f.GetStringArray("tokenizer.ggml.merges");
  tok.tokens.assign(tokens.begin(), tokens.end());
  tok.merges.assign(merges.begin(), merges.end());
  tok.token_types = *f.GetArrayOf<int32_t>("tokenizer.ggml.token_type");
  tok.eos_id = static_cast<int32_t>(*f.GetU32("tokenizer.ggml.eos_token_id"));
  tok.chat_template = *f.GetString("tokenizer.chat_template");
  EXPECT_EQ(tok.model, "gpt2");
  EXPECT_EQ(tok.pre, "qwen2");
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(tok);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->vocab_size(), spec.vocab);
}

TEST_P(PresetFileTest, WeightsHaveTheDocumentedScales) {
  const GenModelSpec spec = *PresetSpec(GetParam());
  const GgufFile& f = *WrittenPreset(GetParam()).file;
  const double inv_sqrt_h = 1.0 / std::sqrt(static_cast<double>(spec.h));
  // Experts (drawn as quantized blocks) and dense projections (quantized from Gaussian rows).
  EXPECT_NEAR(Rms(Dequantized(**f.GetTensor("blk.0.ffn_gate_exps.weight"))), inv_sqrt_h,
              0.05 * inv_sqrt_h);
  EXPECT_NEAR(Rms(Dequantized(**f.GetTensor("blk.0.ffn_down_exps.weight"))),
              0.5 / std::sqrt(static_cast<double>(spec.expert_ffn)), 0.05 * inv_sqrt_h);
  EXPECT_NEAR(Rms(Dequantized(**f.GetTensor("blk.0.attn_qkv.weight"))), inv_sqrt_h,
              0.05 * inv_sqrt_h);
  EXPECT_NEAR(Rms(Dequantized(**f.GetTensor("token_embd.weight"))), 1.0, 0.05);
  const GgufTensorInfo* norm = f.FindTensor("blk.0.attn_norm.weight");
  if (norm == nullptr) norm = f.FindTensor("blk.0.attn_hc_norm.weight");
  ASSERT_NE(norm, nullptr);
  for (float v : Dequantized(*norm)) EXPECT_NEAR(v, 1.0f, 0.0501f);
  for (float v : Dequantized(**f.GetTensor("blk.0.ssm_a"))) {
    EXPECT_LE(v, -1.0f);
    EXPECT_GE(v, -16.0f);
  }
  for (float b : Dequantized(**f.GetTensor("blk.0.ssm_dt.bias"))) {
    const double dt = std::log1p(std::exp(static_cast<double>(b)));  // softplus
    EXPECT_GE(dt, 0.99e-3);
    EXPECT_LE(dt, 0.101);
  }
}

INSTANTIATE_TEST_SUITE_P(SmallPresets, PresetFileTest, ::testing::Values("tiny", "tiny-q3n"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param == "tiny" ? std::string("Tiny") : std::string("TinyQ3n");
                         });

// Every qwen4exp tensor family with the shapes of docs/MODEL.md §2, written out for tiny:
// h 256, S 4 (w 1024), lr 32, nh 4, kvh 2, hd 64, ih 2, di 32, nk 2, nv 4, dk 64 (c_dim 512),
// E 16, I 256, Ish 256, V 1024, Engram N 3, K 2, de 32 (pin 128), layers 0-5 + MTP layer 6,
// attention layers 2, 5 (and 6), Engram layers 1 and 4.
TEST(TinyPresetTest, HasEveryQwen4expTensorFamilyWithTheContractShapes) {
  const GgufFile& f = *WrittenPreset("tiny").file;
  using V = std::vector<int64_t>;
  const std::vector<std::pair<std::string, V>> expected = {
      {"token_embd.weight", {256, 1024}},
      {"output.weight", {256, 1024}},
      {"engram_token_map", {1024}},
      {"output_hc_norm.weight", {1024}},
      {"output_hc_down.weight", {1024, 32}},
      {"output_hc_up.weight", {32, 1024}},
      // streams, both sides
      {"blk.0.attn_hc_norm.weight", {1024}},
      {"blk.0.attn_hc_down.weight", {1024, 32}},
      {"blk.0.attn_hc_up.weight", {32, 1024}},
      {"blk.0.attn_hc_inject.weight", {1024, 4}},
      {"blk.0.ffn_hc_norm.weight", {1024}},
      {"blk.0.ffn_hc_down.weight", {1024, 32}},
      {"blk.0.ffn_hc_up.weight", {32, 1024}},
      {"blk.0.ffn_hc_inject.weight", {1024, 4}},
      // GDN
      {"blk.0.attn_qkv.weight", {256, 512}},
      {"blk.0.attn_gate.weight", {256, 256}},
      {"blk.0.ssm_ba.weight", {256, 8}},
      {"blk.0.ssm_conv1d.weight", {4, 512}},
      {"blk.0.ssm_a", {4}},
      {"blk.0.ssm_dt.bias", {4}},
      {"blk.0.ssm_norm.weight", {64}},
      {"blk.0.ssm_out.weight", {256, 256}},
      // attention with the indexer
      {"blk.2.attn_q.weight", {256, 512}},
      {"blk.2.attn_k.weight", {256, 128}},
      {"blk.2.attn_v.weight", {256, 128}},
      {"blk.2.attn_output.weight", {256, 256}},
      {"blk.2.attn_q_norm.weight", {64}},
      {"blk.2.attn_k_norm.weight", {64}},
      {"blk.2.attn_idx_qk.weight", {256, 96}},
      {"blk.2.attn_idx_q_norm.weight", {32}},
      {"blk.2.attn_idx_k_norm.weight", {32}},
      {"blk.5.attn_idx_qk.weight", {256, 96}},
      // MoE
      {"blk.3.ffn_gate_inp.weight", {256, 16}},
      {"blk.3.ffn_gate_exps.weight", {256, 256, 16}},
      {"blk.3.ffn_up_exps.weight", {256, 256, 16}},
      {"blk.3.ffn_down_exps.weight", {256, 256, 16}},
      {"blk.3.ffn_gate_inp_shexp.weight", {256}},
      {"blk.3.ffn_gate_shexp.weight", {256, 256}},
      {"blk.3.ffn_up_shexp.weight", {256, 256}},
      {"blk.3.ffn_down_shexp.weight", {256, 256}},
      // Engram
      {"blk.1.engram_key.weight", {128, 1024}},
      {"blk.1.engram_value.weight", {128, 256}},
      {"blk.1.engram_key_norm.weight", {1024}},
      {"blk.1.engram_query_norm.weight", {1024}},
      {"blk.1.engram_conv_norm.weight", {1024}},
      {"blk.1.engram_conv.weight", {4, 1024}},
      {"blk.4.engram_conv.weight", {4, 1024}},
      // MTP
      {"blk.6.nextn.eh_proj.weight", {512, 256}},
      {"blk.6.nextn.enorm.weight", {256}},
      {"blk.6.nextn.hnorm.weight", {1024}},
      {"blk.6.nextn.hc_norm.weight", {1024}},
      {"blk.6.nextn.hc_down.weight", {1024, 32}},
      {"blk.6.nextn.hc_up.weight", {32, 1024}},
      {"blk.6.attn_hc_norm.weight", {1024}},
      {"blk.6.attn_q.weight", {256, 512}},
      {"blk.6.attn_idx_qk.weight", {256, 96}},
      {"blk.6.ffn_gate_exps.weight", {256, 256, 16}},
  };
  for (const auto& [name, ne] : expected) {
    const GgufTensorInfo* t = f.FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->n_dims, static_cast<int>(ne.size())) << name;
    for (size_t d = 0; d < ne.size(); ++d) EXPECT_EQ(t->ne[d], ne[d]) << name << " dim " << d;
  }
  // Engram table: de × (sum of the layer's 4 primes).
  const GgufTensorInfo* embd = f.FindTensor("blk.1.engram_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->ne[0], 32);
  const std::vector<int64_t> sizes = *f.GetIntArray("qwen4exp.engram.table_sizes");
  ASSERT_EQ(sizes.size(), 8u);
  EXPECT_EQ(embd->ne[1], sizes[0] + sizes[1] + sizes[2] + sizes[3]);
  EXPECT_EQ(f.FindTensor("blk.4.engram_embd.weight")->ne[1], sizes[4] + sizes[5] + sizes[6] + sizes[7]);
  // Streams replace the plain norms; GDN layers have no attention tensors and vice versa.
  EXPECT_EQ(f.FindTensor("blk.0.attn_norm.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("output_norm.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.6.nextn.shared_head_norm.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.2.attn_qkv.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.0.engram_key.weight"), nullptr);
  // Experts are 4-bit K-quants; the token map compresses ids into 7/8 of the vocabulary.
  EXPECT_EQ(f.FindTensor("blk.3.ffn_gate_exps.weight")->ggml_type,
            static_cast<uint32_t>(WeightType::kQ4_K));
  const GgufTensorInfo* map = f.FindTensor("engram_token_map");
  EXPECT_EQ(map->ggml_type, kGgmlTypeI32);
  std::vector<int32_t> ids(1024);
  std::memcpy(ids.data(), map->data.data(), ids.size() * 4);
  for (int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 896);
  }
  // Sparse selection starts within 100 tokens: (keep + 1) · cr.
  EXPECT_LE((*f.GetInt("qwen4exp.attention.indexer.top_blocks") + 1) *
                *f.GetInt("qwen4exp.attention.indexer.block_size"),
            100);
}

TEST(TinyQ3nPresetTest, UsesTheLlamaCppQwen3NextNames) {
  const GgufFile& f = *WrittenPreset("tiny-q3n").file;
  for (const char* name : {"output_norm.weight", "blk.0.attn_norm.weight",
                           "blk.0.post_attention_norm.weight", "blk.6.nextn.shared_head_norm.weight",
                           "blk.6.nextn.eh_proj.weight", "blk.6.attn_q.weight"}) {
    EXPECT_NE(f.FindTensor(name), nullptr) << name;
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.name.find("hc_"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("engram"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("idx"), std::string::npos) << t.name;
  }
  EXPECT_FALSE(f.HasKey("qwen3next.hyper.stream_count"));
}

TEST(DeterminismTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::string first = WrittenPreset("tiny").path;
  const std::string again = TempPath("tiny_again.gguf");
  const std::string other = TempPath("tiny_seed2.gguf");
  GenModelSpec spec = *PresetSpec("tiny");
  ASSERT_TRUE(GenerateModel(spec, again).ok());
  spec.seed = 2;
  ASSERT_TRUE(GenerateModel(spec, other).ok());
  const std::string a = ReadAll(first), b = ReadAll(again), c = ReadAll(other);
  EXPECT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b) << "two writes of the same spec differ";
  EXPECT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c) << "seeds 1 and 2 gave the same file";
  // Every tensor differs, not just one.
  std::unique_ptr<GgufFile> fa = *GgufFile::FromBytes(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(a.data()), a.size()));
  std::unique_ptr<GgufFile> fc = *GgufFile::FromBytes(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(c.data()), c.size()));
  for (size_t i = 0; i < fa->tensors().size(); ++i) {
    EXPECT_FALSE(std::equal(fa->tensors()[i].data.begin(), fa->tensors()[i].data.end(),
                            fc->tensors()[i].data.begin()))
        << fa->tensors()[i].name;
  }
  unlink(again.c_str());
  unlink(other.c_str());
}

TEST(DeterminismTest, ThreadCountDoesNotChangeTheBytes) {
  const std::string one = WrittenPreset("tiny").path;
  const std::string many = TempPath("tiny_threads.gguf");
  ASSERT_TRUE(GenerateModel(*PresetSpec("tiny"), many, nullptr, /*threads=*/5).ok());
  EXPECT_TRUE(ReadAll(one) == ReadAll(many)) << "5 threads wrote other bytes than 1";
  unlink(many.c_str());
}

TEST(GenerateModelTest, ReportsProgressAndRefusesABadSpecOrPath) {
  GenModelSpec spec = *PresetSpec("tiny-q3n");
  spec.layers = 2;
  spec.full_attention_interval = 2;
  const std::string path = TempPath("progress.gguf");
  uint64_t last = 0, total = 0;
  int calls = 0;
  bool done = false;
  ASSERT_TRUE(GenerateModel(spec, path, [&](const GenProgress& p) {
                ++calls;
                EXPECT_GE(p.bytes_written, last);
                last = p.bytes_written;
                total = p.total_bytes;
                done = p.done;
              }, /*threads=*/3).ok());
  EXPECT_GT(calls, 1);
  EXPECT_TRUE(done);
  EXPECT_EQ(last, total);
  const std::vector<PlannedTensor> plan = *PlanTensors(spec);
  uint64_t planned = 0;
  for (const PlannedTensor& t : plan) planned += t.n_bytes;
  EXPECT_EQ(total, planned);
  unlink(path.c_str());

  spec.n_head_kv = 3;
  EXPECT_EQ(GenerateModel(spec, path).code(), absl::StatusCode::kInvalidArgument);
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0) << "a failed generation left a file";
  EXPECT_NE(stat((path + ".filling").c_str(), &st), 0) << "a failed generation left its layout file";
  EXPECT_FALSE(GenerateModel(*PresetSpec("tiny-q3n"), "/nonexistent-dir/x.gguf").ok());
}

TEST(RoutingSkewTest, ZipfAddsExactlyTheSkewTermsToRoutersAndEmbeddings) {
  GenModelSpec plain = *PresetSpec("tiny");
  plain.head_type = WeightType::kF32;  // compare embeddings without quantization
  GenModelSpec skewed = plain;
  skewed.zipf = 1.5;
  const std::vector<PlannedTensor> plan = *PlanTensors(plain);
  auto values = [](const GenModelSpec& spec, const PlannedTensor& t) {
    std::vector<uint8_t> bytes;
    EXPECT_TRUE(FillTensor(spec, t, [&bytes](absl::Span<const uint8_t> piece) {
                  bytes.insert(bytes.end(), piece.begin(), piece.end());
                  return absl::OkStatus();
                }).ok());
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  };
  const std::vector<float> dir = SkewDirection(plain);
  const float inv_sqrt_h = 1.0f / 16.0f;
  for (const PlannedTensor& t : plan) {
    if (t.name == "token_embd.weight") {
      const std::vector<float> a = values(plain, t), b = values(skewed, t);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(b[i] - a[i], kSkewEmbeddingOffset * dir[i % 256], 1e-5) << i;
      }
    }
    if (t.name == "blk.4.ffn_gate_inp.weight") {
      const std::vector<float> a = values(plain, t), b = values(skewed, t);
      const std::vector<float> coef = RouterSkewCoefficients(skewed, 4);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(b[i] - a[i], coef[i / 256] * inv_sqrt_h * dir[i % 256], 1e-6) << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
