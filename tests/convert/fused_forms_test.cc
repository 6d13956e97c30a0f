// llama.cpp's other tensor forms of qwen3next (docs/MODEL.md §2): the older fused GDN input
// ssm_in, fused attention attn_qkv, and fused ffn_gate_up_exps. The test rewrites a generated
// tiny-q3n file (quantized dense and expert matrices) into those forms by moving whole rows, and
// the reference engine must give bitwise the same logits on both files.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/model/reference_model.h"
#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct Out {
  std::string name;
  uint32_t type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
};

std::vector<uint8_t> RowsOf(const GgufTensorInfo& t, int64_t first, int64_t count) {
  const int64_t rb = *RowBytes(t.weight_type(), t.ne[0]);
  return std::vector<uint8_t>(t.data.begin() + first * rb, t.data.begin() + (first + count) * rb);
}
void Append(std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { a.insert(a.end(), b.begin(), b.end()); }

// Rewrites `src` into the fused forms.
void WriteFused(const GgufFile& f, const ModelConfig& c, const std::string& path) {
  std::vector<Out> out;
  const int64_t r = c.gdn.nv / c.gdn.nk, dk = c.gdn.dk, dv = c.gdn.dv, nk = c.gdn.nk;
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string& n = t.name;
    auto layer_of = [&](const char* suffix) { return n.substr(0, n.size() - std::strlen(suffix)); };
    if (absl::EndsWith(n, "attn_qkv.weight")) {
      // GDN: attn_qkv + attn_gate -> ssm_in, per key head [q | k | v | z].
      const std::string p = layer_of("attn_qkv.weight");
      const GgufTensorInfo& z = *f.FindTensor(p + "attn_gate.weight");
      Out o{p + "ssm_in.weight", t.ggml_type, {t.ne[0], nk * (2 * dk + 2 * r * dv)}, {}};
      for (int64_t g = 0; g < nk; ++g) {
        Append(o.bytes, RowsOf(t, g * dk, dk));
        Append(o.bytes, RowsOf(t, nk * dk + g * dk, dk));
        Append(o.bytes, RowsOf(t, 2 * nk * dk + g * r * dv, r * dv));
        Append(o.bytes, RowsOf(z, g * r * dv, r * dv));
      }
      out.push_back(std::move(o));
    } else if (absl::EndsWith(n, "attn_q.weight")) {
      const std::string p = layer_of("attn_q.weight");
      const GgufTensorInfo& k = *f.FindTensor(p + "attn_k.weight");
      const GgufTensorInfo& v = *f.FindTensor(p + "attn_v.weight");
      Out o{p + "attn_qkv.weight", t.ggml_type, {t.ne[0], t.ne[1] + k.ne[1] + v.ne[1]}, {}};
      Append(o.bytes, RowsOf(t, 0, t.ne[1]));
      Append(o.bytes, RowsOf(k, 0, k.ne[1]));
      Append(o.bytes, RowsOf(v, 0, v.ne[1]));
      out.push_back(std::move(o));
    } else if (absl::EndsWith(n, "ffn_gate_exps.weight")) {
      const std::string p = layer_of("ffn_gate_exps.weight");
      const GgufTensorInfo& up = *f.FindTensor(p + "ffn_up_exps.weight");
      ASSERT_EQ(up.ggml_type, t.ggml_type);
      const int64_t I = t.ne[1], E = t.ne[2];
      Out o{p + "ffn_gate_up_exps.weight", t.ggml_type, {t.ne[0], 2 * I, E}, {}};
      for (int64_t e = 0; e < E; ++e) {
        Append(o.bytes, RowsOf(t, e * I, I));
        Append(o.bytes, RowsOf(up, e * I, I));
      }
      out.push_back(std::move(o));
    } else if (absl::EndsWith(n, "attn_gate.weight") || absl::EndsWith(n, "attn_k.weight") ||
               absl::EndsWith(n, "attn_v.weight") || absl::EndsWith(n, "ffn_up_exps.weight")) {
      continue;  // folded into a fused tensor above
    } else {
      out.push_back(Out{n, t.ggml_type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                        std::vector<uint8_t>(t.data.begin(), t.data.end())});
    }
  }
  auto w = GgufWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const GgufMetadataEntry& m : f.metadata()) {
    if (m.key == "general.alignment") continue;
    ASSERT_TRUE((*w)->AddMetadata(m.key, m.value).ok());
  }
  for (const Out& o : out) ASSERT_TRUE((*w)->AddTensor(o.name, o.type, o.ne).ok()) << o.name;
  for (const Out& o : out) ASSERT_TRUE((*w)->WriteTensorData(o.name, o.bytes).ok()) << o.name;
  ASSERT_TRUE((*w)->Finish().ok());
}

std::vector<float> Logits(ReferenceModel& m, const std::vector<int32_t>& ids) {
  auto seq = m.NewSequence();
  EXPECT_TRUE(seq.ok());
  std::vector<float> logits(ids.size() * m.config().vocab);
  ReferenceModel::Step step{seq->get(), ids, logits.data(), true};
  EXPECT_TRUE(m.Forward(std::span<ReferenceModel::Step>(&step, 1)).ok());
  std::vector<int32_t> draft = *m.DraftGreedy(seq->get(), 3, 2);
  logits.push_back(static_cast<float>(draft[0]));
  logits.push_back(static_cast<float>(draft[1]));
  return logits;
}

TEST(FusedFormsTest, SameLogitsAsTheSplitForms) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("tandem-fused-test-", getpid());
  fs::create_directories(dir);
  absl::StatusOr<GenModelSpec> spec = PresetSpec("tiny-q3n");
  ASSERT_TRUE(spec.ok());
  const std::string plain = (dir / "plain.gguf").string(), fused = (dir / "fused.gguf").string();
  ASSERT_TRUE(GenerateModel(*spec, plain).ok());
  auto a = ReferenceModel::Open(plain, {.threads = 2});
  ASSERT_TRUE(a.ok()) << a.status();
  WriteFused((*a)->file(), (*a)->config(), fused);
  auto b = ReferenceModel::Open(fused, {.threads = 2});
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_NE((*b)->file().FindTensor("blk.0.ssm_in.weight"), nullptr);
  ASSERT_NE((*b)->file().FindTensor("blk.0.ffn_gate_up_exps.weight"), nullptr);
  ASSERT_EQ((*b)->file().FindTensor("blk.2.attn_q.weight"), nullptr);
  const std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 323, 84};
  EXPECT_EQ(Logits(**a, ids), Logits(**b, ids));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem
