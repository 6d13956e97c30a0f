// The HF -> GGUF converter on a tiny synthetic Qwen3-Next checkpoint written by the test
// (hf_fixture.h): every GGUF tensor is compared with values the test computes from the source
// tensors, bad checkpoints must fail with an error naming the problem, and the converted file must
// load and run in the reference engine.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "common/convert/convert_command.h"
#include "common/convert/qwen3next_converter.h"
#include "common/gguf/gguf_file.h"
#include "common/model/reference_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/convert/hf_fixture.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("tandem-convert-test-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `fx` under dir_/name and converts it; returns the GGUF path.
  std::string Convert(const HfFixture& fx, const std::string& name, ConvertOptions o = {},
                      int shards = 2) {
    fx.Write(dir_ / name, shards);
    const std::string out = (dir_ / (name + ".gguf")).string();
    o.progress = false;
    absl::Status s = ConvertQwen3NextCheckpoint((dir_ / name).string(), out, o);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  absl::Status ConvertError(const HfFixture& fx, const std::string& name) {
    fx.Write(dir_ / name);
    ConvertOptions o;
    o.progress = false;
    return ConvertQwen3NextCheckpoint((dir_ / name).string(), (dir_ / (name + ".gguf")).string(), o);
  }

  fs::path dir_;
};

// The f32 contents of a GGUF tensor (F32 only) and its shape check.
std::vector<float> F32Tensor(const GgufFile& f, const std::string& name, std::vector<int64_t> ne) {
  const GgufTensorInfo* t = f.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->ggml_type, 0u) << name;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t->ne[i], i < ne.size() ? ne[i] : 1) << name << " dim " << i;
  }
  std::vector<float> v(t->n_elements);
  std::memcpy(v.data(), t->data.data(), v.size() * 4);
  return v;
}

void ExpectSame(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << " element " << i;
  }
}

std::vector<float> PlusOne(std::vector<float> v) {
  for (float& x : v) x += 1.0f;
  return v;
}

TEST_F(ConvertTest, TensorsMatchTheTransformations) {
  HfFixture fx;
  fx.Build();
  ConvertOptions o;
  o.type = WeightType::kF32;
  const std::string path = Convert(fx, "ckpt", o);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  auto src = [&](const std::string& n) { return fx.tensors.at(n).values; };
  const int64_t h = fx.h, V = fx.V, L = fx.layers;

  EXPECT_EQ(*f.GetString("general.architecture"), "qwen3next");
  EXPECT_EQ(*f.GetInt("qwen3next.block_count"), L + 1);
  EXPECT_EQ(*f.GetInt("qwen3next.nextn_predict_layers"), 1);
  EXPECT_EQ(*f.GetInt("qwen3next.rope.dimension_count"), 4);
  EXPECT_EQ(*f.GetInt("qwen3next.ssm.inner_size"), fx.nv * fx.dk);
  const GgufValue* rec = f.FindValue("qwen3next.attention.recurrent_layers");
  ASSERT_NE(rec, nullptr);
  ASSERT_EQ(rec->array_size(), static_cast<uint64_t>(L + 1));
  for (int64_t i = 0; i <= L; ++i) {
    EXPECT_EQ(rec->ElementAt(i).scalar_bits() != 0, i < L && fx.recurrent(i)) << i;
  }

  ExpectSame(F32Tensor(f, "token_embd.weight", {h, V}), src("model.embed_tokens.weight"), "token_embd");
  ExpectSame(F32Tensor(f, "output.weight", {h, V}), src("lm_head.weight"), "output");
  ExpectSame(F32Tensor(f, "output_norm.weight", {h}), PlusOne(src("model.norm.weight")), "output_norm");

  const int64_t nk = fx.nk, dk = fx.dk, r = fx.r(), nv = fx.nv, E = fx.E, I = fx.I;
  for (int64_t i = 0; i <= L; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    const std::string s = i < L ? absl::StrCat("model.layers.", i, ".") : "mtp.layers.0.";
    SCOPED_TRACE(p);
    ExpectSame(F32Tensor(f, p + "attn_norm.weight", {h}), PlusOne(src(s + "input_layernorm.weight")), "attn_norm");
    ExpectSame(F32Tensor(f, p + "post_attention_norm.weight", {h}),
               PlusOne(src(s + "post_attention_layernorm.weight")), "post_attention_norm");
    if (i < L && fx.recurrent(i)) {
      // qkvz rows per key head g: [q (dk) | k (dk) | v (r·dk) | z (r·dk)].
      const std::vector<float> qkvz = src(s + "linear_attn.in_proj_qkvz.weight");
      const int64_t group = 2 * dk + 2 * r * dk;
      auto row = [&](int64_t src_row) {
        return std::vector<float>(qkvz.begin() + src_row * h, qkvz.begin() + (src_row + 1) * h);
      };
      std::vector<float> want_qkv, want_z;
      for (int64_t part = 0; part < 3; ++part) {
        const int64_t off = part == 0 ? 0 : part == 1 ? dk : 2 * dk;
        const int64_t rows = part < 2 ? dk : r * dk;
        for (int64_t g = 0; g < nk; ++g) {
          for (int64_t j = 0; j < rows; ++j) {
            std::vector<float> x = row(g * group + off + j);
            want_qkv.insert(want_qkv.end(), x.begin(), x.end());
          }
        }
      }
      for (int64_t g = 0; g < nk; ++g) {
        for (int64_t j = 0; j < r * dk; ++j) {
          std::vector<float> x = row(g * group + 2 * dk + r * dk + j);
          want_z.insert(want_z.end(), x.begin(), x.end());
        }
      }
      ExpectSame(F32Tensor(f, p + "attn_qkv.weight", {h, fx.c_dim()}), want_qkv, "attn_qkv");
      ExpectSame(F32Tensor(f, p + "attn_gate.weight", {h, nv * dk}), want_z, "attn_gate");
      ExpectSame(F32Tensor(f, p + "ssm_ba.weight", {h, 2 * nv}), src(s + "linear_attn.in_proj_ba.weight"), "ssm_ba");
      ExpectSame(F32Tensor(f, p + "ssm_conv1d.weight", {fx.kk, fx.c_dim()}), src(s + "linear_attn.conv1d.weight"),
                 "ssm_conv1d");
      std::vector<float> a = src(s + "linear_attn.A_log");
      for (float& x : a) x = -std::exp(x);
      ExpectSame(F32Tensor(f, p + "ssm_a", {nv}), a, "ssm_a");
      ExpectSame(F32Tensor(f, p + "ssm_dt.bias", {nv}), src(s + "linear_attn.dt_bias"), "ssm_dt");
      ExpectSame(F32Tensor(f, p + "ssm_norm.weight", {dk}), src(s + "linear_attn.norm.weight"), "ssm_norm (as is)");
      ExpectSame(F32Tensor(f, p + "ssm_out.weight", {nv * dk, h}), src(s + "linear_attn.out_proj.weight"), "ssm_out");
    } else {
      ExpectSame(F32Tensor(f, p + "attn_q.weight", {h, fx.nh * 2 * fx.hd}), src(s + "self_attn.q_proj.weight"), "q");
      ExpectSame(F32Tensor(f, p + "attn_k.weight", {h, fx.kvh * fx.hd}), src(s + "self_attn.k_proj.weight"), "k");
      ExpectSame(F32Tensor(f, p + "attn_v.weight", {h, fx.kvh * fx.hd}), src(s + "self_attn.v_proj.weight"), "v");
      ExpectSame(F32Tensor(f, p + "attn_output.weight", {fx.nh * fx.hd, h}), src(s + "self_attn.o_proj.weight"), "o");
      ExpectSame(F32Tensor(f, p + "attn_q_norm.weight", {fx.hd}), PlusOne(src(s + "self_attn.q_norm.weight")), "qn");
      ExpectSame(F32Tensor(f, p + "attn_k_norm.weight", {fx.hd}), PlusOne(src(s + "self_attn.k_norm.weight")), "kn");
    }
    ExpectSame(F32Tensor(f, p + "ffn_gate_inp.weight", {h, E}), src(s + "mlp.gate.weight"), "router");
    std::vector<float> gate, up, down;
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = absl::StrCat(s, "mlp.experts.", e, ".");
      for (auto [v, n] : {std::pair{&gate, "gate_proj"}, {&up, "up_proj"}, {&down, "down_proj"}}) {
        const std::vector<float> m = src(x + n + ".weight");
        v->insert(v->end(), m.begin(), m.end());
      }
    }
    ExpectSame(F32Tensor(f, p + "ffn_gate_exps.weight", {h, I, E}), gate, "gate_exps");
    ExpectSame(F32Tensor(f, p + "ffn_up_exps.weight", {h, I, E}), up, "up_exps");
    ExpectSame(F32Tensor(f, p + "ffn_down_exps.weight", {I, h, E}), down, "down_exps");
    ExpectSame(F32Tensor(f, p + "ffn_gate_inp_shexp.weight", {h, 1}), src(s + "mlp.shared_expert_gate.weight"), "shg");
    ExpectSame(F32Tensor(f, p + "ffn_gate_shexp.weight", {h, fx.Ish}), src(s + "mlp.shared_expert.gate_proj.weight"), "sg");
    ExpectSame(F32Tensor(f, p + "ffn_up_shexp.weight", {h, fx.Ish}), src(s + "mlp.shared_expert.up_proj.weight"), "su");
    ExpectSame(F32Tensor(f, p + "ffn_down_shexp.weight", {fx.Ish, h}), src(s + "mlp.shared_expert.down_proj.weight"), "sd");
  }
  const std::string m = absl::StrCat("blk.", L, ".nextn.");
  ExpectSame(F32Tensor(f, m + "eh_proj.weight", {2 * h, h}), src("mtp.fc.weight"), "eh_proj");
  ExpectSame(F32Tensor(f, m + "enorm.weight", {h}), PlusOne(src("mtp.pre_fc_norm_embedding.weight")), "enorm");
  ExpectSame(F32Tensor(f, m + "hnorm.weight", {h}), PlusOne(src("mtp.pre_fc_norm_hidden.weight")), "hnorm");
  ExpectSame(F32Tensor(f, m + "shared_head_norm.weight", {h}), PlusOne(src("mtp.norm.weight")), "shared_head_norm");

  // The tokenizer: byte-level vocab, PAD rows, control tokens, merges, special ids.
  absl::StatusOr<absl::Span<const std::string>> tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), static_cast<size_t>(V));
  EXPECT_EQ((*tokens)[32], "Ġ");  // byte 0x20 in GPT-2's byte-level alphabet
  EXPECT_EQ((*tokens)[256], "th");
  EXPECT_EQ((*tokens)[280], "[PAD280]");
  EXPECT_EQ((*tokens)[291], "<|im_end|>");
  std::vector<int32_t> types = *f.GetArrayOf<int32_t>("tokenizer.ggml.token_type");
  EXPECT_EQ(types[65], 1);
  EXPECT_EQ(types[280], 5);
  EXPECT_EQ(types[290], 3);
  EXPECT_EQ((*f.GetStringArray("tokenizer.ggml.merges"))[0], "t h");
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.eos_token_id"), 291);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.padding_token_id"), 290);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.bos_token_id"), 290);  // config.json's bos_token_id
}

TEST_F(ConvertTest, FusedExpertsAndOneShardGiveTheSameExperts) {
  HfFixture fused;
  fused.fused_experts = true;
  fused.mtp = false;
  fused.Build();
  ConvertOptions o;
  o.type = WeightType::kF32;
  const std::string path = Convert(fused, "fused", o, /*shards=*/1);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE((*file)->HasKey("qwen3next.nextn_predict_layers"));
  const int64_t h = fused.h, I = fused.I, E = fused.E;
  const std::vector<float>& gu = fused.tensors.at("model.layers.0.mlp.experts.gate_up_proj").values;
  std::vector<float> gate, up;
  for (int64_t e = 0; e < E; ++e) {
    auto first = gu.begin() + e * 2 * I * h;
    gate.insert(gate.end(), first, first + I * h);
    up.insert(up.end(), first + I * h, first + 2 * I * h);
  }
  ExpectSame(F32Tensor(**file, "blk.0.ffn_gate_exps.weight", {h, I, E}), gate, "gate");
  ExpectSame(F32Tensor(**file, "blk.0.ffn_up_exps.weight", {h, I, E}), up, "up");
  ExpectSame(F32Tensor(**file, "blk.0.ffn_down_exps.weight", {I, h, E}),
             fused.tensors.at("model.layers.0.mlp.experts.down_proj").values, "down");
}

TEST_F(ConvertTest, ConvertedModelRunsInTheReferenceEngine) {
  HfFixture fx;
  fx.Build();
  ConvertOptions o;
  o.type = WeightType::kF32;
  const std::string path = Convert(fx, "ckpt", o);
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model = ReferenceModel::Open(path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().nextn, 1);
  EXPECT_EQ((*model)->config().n_layers, fx.layers);
  // The tokenizer loaded from the file encodes with the merges.
  EXPECT_EQ((*model)->tokenizer().Encode("the", false), (std::vector<int32_t>{256, 'e'}));
  auto seq = (*model)->NewSequence();
  ASSERT_TRUE(seq.ok());
  const std::vector<int32_t> ids = {1, 17, 256, 40, 99, 2};
  std::vector<float> logits(ids.size() * fx.V);
  ReferenceModel::Step step{seq->get(), ids, logits.data(), true};
  ASSERT_TRUE((*model)->Forward(std::span<ReferenceModel::Step>(&step, 1)).ok());
  double norm = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    norm += x * x;
  }
  EXPECT_GT(norm, 0.0);
  absl::StatusOr<std::vector<int32_t>> draft = (*model)->DraftGreedy(seq->get(), 5, 2);
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ(draft->size(), 2u);
}

TEST_F(ConvertTest, QuantizedTypesAndFallback) {
  HfFixture fx;
  fx.mtp = false;
  fx.Build();
  ConvertOptions o;
  o.type = WeightType::kQ8_0;
  o.expert_type = WeightType::kQ4_K;  // h = 32 is not a whole Q4_K block: falls back to F16
  const std::string path = Convert(fx, "q8", o);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_qkv.weight")->ggml_type, 8u);
  EXPECT_EQ((*file)->FindTensor("blk.0.ffn_up_exps.weight")->ggml_type, 1u);
  EXPECT_EQ((*file)->FindTensor("blk.0.ffn_gate_inp.weight")->ggml_type, 0u);
  EXPECT_EQ((*file)->FindTensor("blk.0.ssm_conv1d.weight")->ggml_type, 0u);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_norm.weight")->ggml_type, 0u);
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model = ReferenceModel::Open(path, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
}

TEST_F(ConvertTest, MissingTensorIsNamed) {
  HfFixture fx;
  fx.Build();
  fx.tensors.erase("model.layers.1.linear_attn.A_log");
  fx.tensors.erase("model.layers.2.mlp.experts.5.up_proj.weight");
  absl::Status s = ConvertError(fx, "missing");
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.1.linear_attn.A_log' is missing"));
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.2.mlp.experts.5.up_proj.weight' is missing"));
  EXPECT_FALSE(fs::exists(dir_ / "missing.gguf"));
}

TEST_F(ConvertTest, WrongShapeIsNamed) {
  HfFixture fx;
  fx.Build();
  fx.tensors["model.layers.3.self_attn.q_proj.weight"].shape = {fx.nh * fx.hd, 2 * fx.h};
  absl::Status s = ConvertError(fx, "shape");
  EXPECT_THAT(s.message(), HasSubstr("'model.layers.3.self_attn.q_proj.weight' has shape [64, 64], "
                                     "expected [128, 32]"));
}

TEST_F(ConvertTest, UnknownArchitectureAndUnknownTensor) {
  HfFixture fx;
  fx.Build();
  fx.architecture = "LlamaForCausalLM";
  fx.Write(dir_ / "llama");
  // model_type is still qwen3_next in the fixture; remove it too.
  nlohmann::json c = fx.Config();
  c.erase("model_type");
  HfFixture::WriteText(dir_ / "llama" / "config.json", c.dump());
  absl::Status s = ConvertQwen3NextCheckpoint((dir_ / "llama").string(), (dir_ / "l.gguf").string(), {});
  EXPECT_THAT(s.message(), HasSubstr("unknown architecture"));
  EXPECT_THAT(s.message(), HasSubstr("LlamaForCausalLM"));

  HfFixture extra;
  extra.Build();
  std::mt19937 rng(1);
  extra.Add("model.layers.0.mystery.weight", {4, 4}, rng, 1.0f, false);
  EXPECT_THAT(ConvertError(extra, "extra").message(), HasSubstr("model.layers.0.mystery.weight"));
}

TEST_F(ConvertTest, TruncatedSafetensorsIsReported) {
  HfFixture fx;
  fx.Build();
  fx.Write(dir_ / "trunc", 1);
  const fs::path st = dir_ / "trunc" / "model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 100);
  absl::Status s = ConvertQwen3NextCheckpoint((dir_ / "trunc").string(), (dir_ / "t.gguf").string(), {});
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
  fs::resize_file(st, 5);
  s = ConvertQwen3NextCheckpoint((dir_ / "trunc").string(), (dir_ / "t.gguf").string(), {});
  EXPECT_THAT(s.message(), HasSubstr("fewer than the 8-byte header length"));
}

TEST_F(ConvertTest, CommandFlags) {
  HfFixture fx;
  fx.mtp = false;
  fx.Build();
  fx.Write(dir_ / "cmd");
  const std::string hf = (dir_ / "cmd").string(), out = (dir_ / "cmd.gguf").string();
  std::vector<std::string> args = {"convert", "--hf", hf, "--out", out, "--type", "bf16", "--quiet"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  EXPECT_EQ(RunConvertCommand(static_cast<int>(argv.size()), argv.data()), 0);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(out);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_qkv.weight")->ggml_type, 30u);
  std::vector<std::string> bad = {"convert", "--hf", hf, "--out", out, "--type", "q3_k"};
  argv.clear();
  for (std::string& a : bad) argv.push_back(a.data());
  EXPECT_EQ(RunConvertCommand(static_cast<int>(argv.size()), argv.data()), 2);
}

}  // namespace
}  // namespace tandem
