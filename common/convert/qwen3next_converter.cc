#include "common/convert/qwen3next_converter.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/convert/hf_config.h"
#include "common/convert/hf_tokenizer.h"
#include "common/convert/safetensors.h"
#include "common/gguf/gguf_writer.h"
#include "common/weights/half.h"

namespace tandem {
namespace {

// f32 data of one piece of an output tensor, in ggml order (ne0 fastest).
using Producer = std::function<absl::StatusOr<std::vector<float>>(int64_t piece)>;

struct OutTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  WeightType type = WeightType::kF32;
  int64_t pieces = 1;       // equal slices along the outermost dimension (experts)
  Producer produce;
};

enum class Transform { kNone, kPlusOne, kNegExp };

// Builds the output tensor list, checking every source tensor first.
class Planner {
 public:
  Planner(const SafetensorsCheckpoint& ckpt, const Qwen3NextHfConfig& c, const ConvertOptions& o)
      : ckpt_(ckpt), c_(c), o_(o) {}

  // True when `name` exists with `shape` (noting a problem otherwise, unless optional and absent).
  bool Check(const std::string& name, const std::vector<int64_t>& shape, bool optional = false) {
    const StTensor* t = ckpt_.Find(name);
    if (t == nullptr) {
      if (!optional) problems_.push_back(absl::StrCat("tensor '", name, "' is missing"));
      return false;
    }
    used_.insert(name);
    if (t->shape != shape) {
      problems_.push_back(absl::StrCat("tensor '", name, "' has shape ", ShapeToString(t->shape),
                                       ", expected ", ShapeToString(shape)));
      return false;
    }
    if (t->dtype == StDtype::kOther) {
      problems_.push_back(absl::StrCat("tensor '", name, "' has dtype ", t->dtype_name,
                                       "; the converter reads F32, F16 and BF16"));
      return false;
    }
    return true;
  }

  WeightType MatrixType(int64_t ne0, bool expert) {
    const WeightType want = expert && o_.expert_type ? *o_.expert_type : o_.type;
    if (RowBytes(want, ne0).ok()) return want;
    return WeightType::kF16;
  }

  // A tensor copied (and maybe transformed) from one source. `shape` is the source's PyTorch
  // shape; `ne` the output's ggml shape (same element order).
  void Copy(std::string out, std::vector<int64_t> ne, const std::string& src,
            std::vector<int64_t> shape, Transform tf, std::optional<WeightType> type) {
    Check(src, shape);
    OutTensor t;
    t.name = std::move(out);
    t.ne = std::move(ne);
    t.type = type ? *type : MatrixType(t.ne[0], false);
    const SafetensorsCheckpoint* ckpt = &ckpt_;
    t.produce = [ckpt, src, shape, tf](int64_t) -> absl::StatusOr<std::vector<float>> {
      absl::StatusOr<std::vector<float>> v = ckpt->ReadF32(src, shape);
      if (!v.ok()) return v;
      for (float& x : *v) {
        if (tf == Transform::kPlusOne) x = x + 1.0f;
        if (tf == Transform::kNegExp) x = -std::exp(x);
      }
      return v;
    };
    out_.push_back(std::move(t));
  }
  void Norm(const std::string& out, const std::string& src, int64_t n, bool zero_centred) {
    Copy(out, {n}, src, {n}, zero_centred ? Transform::kPlusOne : Transform::kNone, WeightType::kF32);
  }
  // A Linear weight [rows, cols] -> ggml {cols, rows}.
  void Linear(const std::string& out, const std::string& src, int64_t cols, int64_t rows,
              std::optional<WeightType> type = std::nullopt) {
    Copy(out, {cols, rows}, src, {rows, cols}, Transform::kNone, type);
  }

  void Globals() {
    Linear("token_embd.weight", "model.embed_tokens.weight", c_.h, c_.vocab);
    Norm("output_norm.weight", "model.norm.weight", c_.h, true);
    if (ckpt_.Find("lm_head.weight") != nullptr || !c_.tied) {
      Linear("output.weight", "lm_head.weight", c_.h, c_.vocab);
    }
  }

  void Gdn(const std::string& p, const std::string& s) {
    const int64_t h = c_.h, nk = c_.nk, dk = c_.dk, dv = c_.dv, r = c_.nv / c_.nk;
    const int64_t group = 2 * dk + 2 * r * dv;
    const std::string qkvz = s + "linear_attn.in_proj_qkvz.weight";
    Check(qkvz, {nk * group, h});
    // Row ranges of the source (per key head g: q dk rows, k dk rows, v r·dv rows, z r·dv rows).
    auto regroup = [this, qkvz, h, nk, group](std::vector<std::pair<int64_t, int64_t>> parts) {
      // parts: (offset within a group, rows), emitted part-major then group order.
      const SafetensorsCheckpoint* ckpt = &ckpt_;
      return [ckpt, qkvz, h, nk, group, parts](int64_t) -> absl::StatusOr<std::vector<float>> {
        absl::StatusOr<std::vector<float>> src = ckpt->ReadF32(qkvz, {nk * group, h});
        if (!src.ok()) return src;
        std::vector<float> out;
        for (const auto& [offset, rows] : parts) {
          for (int64_t g = 0; g < nk; ++g) {
            const float* first = src->data() + (g * group + offset) * h;
            out.insert(out.end(), first, first + rows * h);
          }
        }
        return out;
      };
    };
    OutTensor qkv{p + "attn_qkv.weight", {h, c_.c_dim()}, MatrixType(h, false), 1,
                  regroup({{0, dk}, {dk, dk}, {2 * dk, r * dv}})};
    OutTensor gate{p + "attn_gate.weight", {h, c_.nv * dv}, MatrixType(h, false), 1,
                   regroup({{2 * dk + r * dv, r * dv}})};
    out_.push_back(std::move(qkv));
    out_.push_back(std::move(gate));
    // in_proj_ba is already grouped per key head ([b × r | a × r]), which is ssm_ba's layout.
    Linear(p + "ssm_ba.weight", s + "linear_attn.in_proj_ba.weight", h, 2 * c_.nv);
    Copy(p + "ssm_conv1d.weight", {c_.kk, c_.c_dim()}, s + "linear_attn.conv1d.weight",
         {c_.c_dim(), 1, c_.kk}, Transform::kNone, WeightType::kF32);
    Copy(p + "ssm_a", {c_.nv}, s + "linear_attn.A_log", {c_.nv}, Transform::kNegExp, WeightType::kF32);
    Copy(p + "ssm_dt.bias", {c_.nv}, s + "linear_attn.dt_bias", {c_.nv}, Transform::kNone,
         WeightType::kF32);
    Norm(p + "ssm_norm.weight", s + "linear_attn.norm.weight", dv, /*zero_centred=*/false);
    Linear(p + "ssm_out.weight", s + "linear_attn.out_proj.weight", c_.nv * dv, h);
  }

  void Attention(const std::string& p, const std::string& s) {
    const int64_t h = c_.h, hd = c_.hd;
    Linear(p + "attn_q.weight", s + "self_attn.q_proj.weight", h, c_.nh * 2 * hd);
    Linear(p + "attn_k.weight", s + "self_attn.k_proj.weight", h, c_.kvh * hd);
    Linear(p + "attn_v.weight", s + "self_attn.v_proj.weight", h, c_.kvh * hd);
    Linear(p + "attn_output.weight", s + "self_attn.o_proj.weight", c_.nh * hd, h);
    Norm(p + "attn_q_norm.weight", s + "self_attn.q_norm.weight", hd, true);
    Norm(p + "attn_k_norm.weight", s + "self_attn.k_norm.weight", hd, true);
  }

  void Moe(const std::string& p, const std::string& s) {
    const int64_t h = c_.h, E = c_.E, I = c_.I;
    Linear(p + "ffn_gate_inp.weight", s + "mlp.gate.weight", h, E, WeightType::kF32);
    const SafetensorsCheckpoint* ckpt = &ckpt_;
    // transformers 5 may store the experts fused: gate_up_proj [E, 2I, h], down_proj [E, h, I].
    auto fused_name = [&](const std::string& base) {
      return ckpt_.Find(base) != nullptr ? base : base + ".weight";
    };
    const std::string gate_up = fused_name(s + "mlp.experts.gate_up_proj");
    const std::string down = fused_name(s + "mlp.experts.down_proj");
    const bool fused = ckpt_.Find(gate_up) != nullptr;
    auto experts = [&](const char* out, const char* proj, int64_t cols, int64_t rows) {
      OutTensor t{p + out, {cols, rows, E}, MatrixType(cols, true), E, nullptr};
      if (fused) {
        const bool is_down = std::string(proj) == "down_proj";
        const int64_t skip = std::string(proj) == "up_proj" ? I : 0;
        const std::string src = is_down ? down : gate_up;
        const std::vector<int64_t> shape = is_down ? std::vector<int64_t>{E, h, I}
                                                   : std::vector<int64_t>{E, 2 * I, h};
        t.produce = [ckpt, src, shape, skip, cols, rows](int64_t e) -> absl::StatusOr<std::vector<float>> {
          // The fused tensor is read whole once per expert; the mapping makes that a copy of a
          // slice, not a file read, but the f32 conversion is per element: convert the slice only.
          const StTensor* t = ckpt->Find(src);
          const int64_t per_expert = shape[1] * shape[2];
          const int64_t bytes = t->dtype == StDtype::kF32 ? 4 : 2;
          const uint8_t* base = t->data.data() + (e * per_expert + skip * cols) * bytes;
          std::vector<float> out(cols * rows);
          for (int64_t i = 0; i < cols * rows; ++i) {
            if (bytes == 4) {
              std::memcpy(&out[i], base + 4 * i, 4);
            } else {
              uint16_t v;
              std::memcpy(&v, base + 2 * i, 2);
              out[i] = t->dtype == StDtype::kBF16 ? FloatFromBits(static_cast<uint32_t>(v) << 16)
                                                   : Fp16ToFp32(v);
            }
          }
          return out;
        };
      } else {
        const std::string prefix = s + "mlp.experts.";
        const std::string suffix = absl::StrCat(".", proj, ".weight");
        for (int64_t e = 0; e < E; ++e) Check(absl::StrCat(prefix, e, suffix), {rows, cols});
        t.produce = [ckpt, prefix, suffix, cols, rows](int64_t e) {
          return ckpt->ReadF32(absl::StrCat(prefix, e, suffix), {rows, cols});
        };
      }
      out_.push_back(std::move(t));
    };
    if (fused) {
      Check(gate_up, {E, 2 * I, h});
      Check(down, {E, h, I});
    }
    experts("ffn_gate_exps.weight", "gate_proj", h, I);
    experts("ffn_up_exps.weight", "up_proj", h, I);
    experts("ffn_down_exps.weight", "down_proj", I, h);
    if (c_.Ish > 0) {
      Linear(p + "ffn_gate_inp_shexp.weight", s + "mlp.shared_expert_gate.weight", h, 1,
             WeightType::kF32);
      Linear(p + "ffn_gate_shexp.weight", s + "mlp.shared_expert.gate_proj.weight", h, c_.Ish);
      Linear(p + "ffn_up_shexp.weight", s + "mlp.shared_expert.up_proj.weight", h, c_.Ish);
      Linear(p + "ffn_down_shexp.weight", s + "mlp.shared_expert.down_proj.weight", c_.Ish, h);
    }
  }

  void Layer(int64_t i, const std::string& s, bool recurrent) {
    const std::string p = absl::StrCat("blk.", i, ".");
    Norm(p + "attn_norm.weight", s + "input_layernorm.weight", c_.h, true);
    Norm(p + "post_attention_norm.weight", s + "post_attention_layernorm.weight", c_.h, true);
    if (recurrent) {
      Gdn(p, s);
    } else {
      Attention(p, s);
    }
    Moe(p, s);
  }

  // The MTP head under `m` ("mtp." or "model.mtp.") as layer L.
  void Mtp(const std::string& m) {
    const int64_t L = c_.layers, h = c_.h;
    const std::string p = absl::StrCat("blk.", L, ".");
    Layer(L, m + "layers.0.", /*recurrent=*/false);
    Linear(p + "nextn.eh_proj.weight", m + "fc.weight", 2 * h, h);
    Norm(p + "nextn.enorm.weight", m + "pre_fc_norm_embedding.weight", h, true);
    Norm(p + "nextn.hnorm.weight", m + "pre_fc_norm_hidden.weight", h, true);
    Norm(p + "nextn.shared_head_norm.weight", m + "norm.weight", h, true);
  }

  // Source tensors nothing consumed (a checkpoint the converter does not fully understand).
  void CheckAllUsed(const std::string& mtp_prefix, bool keep_mtp) {
    std::vector<std::string> unused;
    for (const auto& [name, t] : ckpt_.tensors()) {
      if (used_.count(name)) continue;
      if (!keep_mtp && !mtp_prefix.empty() && name.rfind(mtp_prefix, 0) == 0) continue;
      unused.push_back(name);
    }
    if (unused.empty()) return;
    const size_t shown = std::min<size_t>(unused.size(), 8);
    problems_.push_back(absl::StrCat(
        unused.size(), " tensor(s) the converter does not know how to map: ",
        absl::StrJoin(unused.begin(), unused.begin() + shown, ", "), unused.size() > shown ? ", ..." : ""));
  }

  std::vector<OutTensor>& out() { return out_; }
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  const SafetensorsCheckpoint& ckpt_;
  const Qwen3NextHfConfig& c_;
  const ConvertOptions& o_;
  std::vector<OutTensor> out_;
  std::vector<std::string> problems_;
  std::set<std::string> used_;
};

uint32_t LlamaFileType(WeightType t) {
  switch (t) {
    case WeightType::kF32: return 0;
    case WeightType::kF16: return 1;
    case WeightType::kQ4_0: return 2;
    case WeightType::kQ8_0: return 7;
    case WeightType::kQ2_K: return 10;
    case WeightType::kQ3_K: return 12;   // Q3_K_M
    case WeightType::kQ4_K: return 15;   // Q4_K_M
    case WeightType::kQ5_K: return 17;   // Q5_K_M
    case WeightType::kQ6_K: return 18;
    case WeightType::kBF16: return 32;
  }
  return 0;
}

std::vector<std::pair<std::string, GgufValue>> Metadata(const Qwen3NextHfConfig& c, int64_t nextn,
                                                        const TokenizerSpec& tok,
                                                        const ConvertOptions& o, bool add_bos) {
  std::vector<std::pair<std::string, GgufValue>> m;
  auto u32 = [](int64_t v) { return GgufValue::Scalar<uint32_t>(static_cast<uint32_t>(v)); };
  auto f32 = [](double v) { return GgufValue::Scalar<float>(static_cast<float>(v)); };
  auto arch = [&](const char* k, GgufValue v) { m.emplace_back(absl::StrCat("qwen3next.", k), std::move(v)); };
  m.emplace_back("general.architecture", GgufValue::String("qwen3next"));
  m.emplace_back("general.type", GgufValue::String("model"));
  m.emplace_back("general.name", GgufValue::String(c.name));
  arch("block_count", u32(c.layers + nextn));
  if (c.context_length > 0) arch("context_length", u32(c.context_length));
  arch("embedding_length", u32(c.h));
  if (c.ffn > 0) arch("feed_forward_length", u32(c.ffn));
  arch("attention.head_count", u32(c.nh));
  arch("attention.head_count_kv", u32(c.kvh));
  arch("rope.freq_base", f32(c.theta));
  arch("attention.layer_norm_rms_epsilon", f32(c.eps));
  arch("expert_count", u32(c.E));
  arch("expert_used_count", u32(c.K));
  arch("attention.key_length", u32(c.hd));
  arch("attention.value_length", u32(c.hd));
  m.emplace_back("general.file_type", u32(LlamaFileType(o.type)));
  arch("expert_feed_forward_length", u32(c.I));
  if (c.Ish > 0) arch("expert_shared_feed_forward_length", u32(c.Ish));
  arch("ssm.conv_kernel", u32(c.kk));
  arch("ssm.state_size", u32(c.dk));
  arch("ssm.group_count", u32(c.nk));
  arch("ssm.time_step_rank", u32(c.nv));
  arch("ssm.inner_size", u32(c.nv * c.dv));
  std::vector<bool> recurrent = c.recurrent;
  recurrent.resize(c.layers + nextn, false);  // MTP layers are full attention
  arch("attention.recurrent_layers", GgufValue::BoolArray(recurrent));
  arch("full_attention_interval", u32(c.full_attention_interval));
  arch("rope.dimension_count", u32(c.rot));
  if (nextn > 0) arch("nextn_predict_layers", u32(nextn));
  m.emplace_back("general.quantization_version", u32(2));
  m.emplace_back("tokenizer.ggml.model", GgufValue::String(tok.model));
  m.emplace_back("tokenizer.ggml.pre", GgufValue::String(tok.pre));
  m.emplace_back("tokenizer.ggml.tokens", GgufValue::StringArray(tok.tokens));
  m.emplace_back("tokenizer.ggml.token_type", GgufValue::Array(tok.token_types));
  m.emplace_back("tokenizer.ggml.merges", GgufValue::StringArray(tok.merges));
  if (tok.eos_id) m.emplace_back("tokenizer.ggml.eos_token_id", u32(*tok.eos_id));
  if (tok.pad_id) m.emplace_back("tokenizer.ggml.padding_token_id", u32(*tok.pad_id));
  if (tok.bos_id) m.emplace_back("tokenizer.ggml.bos_token_id", u32(*tok.bos_id));
  // Written only when the checkpoint says so, as llama.cpp's converter does (its SpecialVocab
  // copies tokenizer_config.json's add_bos_token); Qwen tokenizers add no BOS either way.
  if (add_bos) m.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::Scalar<bool>(true));
  if (!tok.chat_template.empty()) {
    m.emplace_back("tokenizer.chat_template", GgufValue::String(tok.chat_template));
  }
  return m;
}

absl::Status WriteTensor(GgufWriter& w, const OutTensor& t) {
  const int64_t ne0 = t.ne[0];
  int64_t total = 1;
  for (int64_t d : t.ne) total *= d;
  const int64_t per_piece = total / t.pieces;
  const int64_t row_bytes = *RowBytes(t.type, ne0);
  std::vector<uint8_t> bytes;
  for (int64_t piece = 0; piece < t.pieces; ++piece) {
    absl::StatusOr<std::vector<float>> data = t.produce(piece);
    if (!data.ok()) return data.status();
    if (static_cast<int64_t>(data->size()) != per_piece) {
      return absl::InternalError(absl::StrCat(t.name, ": produced ", data->size(), " values, expected ",
                                              per_piece));
    }
    const int64_t rows = per_piece / ne0;
    bytes.resize(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRow(t.type, data->data() + r * ne0, bytes.data() + r * row_bytes, ne0);
    }
    if (absl::Status s = w.WriteTensorData(t.name, bytes); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConvertQwen3NextCheckpoint(const std::string& hf_dir, const std::string& out_path,
                                        const ConvertOptions& options) {
  absl::StatusOr<Qwen3NextHfConfig> config = ReadQwen3NextHfConfig(hf_dir);
  if (!config.ok()) return config.status();
  const Qwen3NextHfConfig& c = *config;
  absl::StatusOr<TokenizerSpec> tok = ReadHfTokenizer(hf_dir, c);
  if (!tok.ok()) return tok.status();
  if (absl::StatusOr<Tokenizer> check = Tokenizer::Create(*tok); !check.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(hf_dir, ": the tokenizer is not one Tandem can use: ",
                                                   check.status().message()));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> ckpt = SafetensorsCheckpoint::Open(hf_dir);
  if (!ckpt.ok()) return ckpt.status();

  Planner plan(**ckpt, c, options);
  plan.Globals();
  for (int64_t i = 0; i < c.layers; ++i) {
    plan.Layer(i, absl::StrCat("model.layers.", i, "."), c.recurrent[i]);
  }
  std::string mtp_prefix;
  if ((*ckpt)->Find("mtp.fc.weight") != nullptr) mtp_prefix = "mtp.";
  if ((*ckpt)->Find("model.mtp.fc.weight") != nullptr) mtp_prefix = "model.mtp.";
  int64_t nextn = 0;
  if (!mtp_prefix.empty() && options.keep_mtp) {
    plan.Mtp(mtp_prefix);
    nextn = 1;
  }
  plan.CheckAllUsed(mtp_prefix, options.keep_mtp);
  if (!plan.problems().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        hf_dir, ": not a Qwen3-Next checkpoint the converter understands (", plan.problems().size(),
        " problem", plan.problems().size() == 1 ? "" : "s", "):\n  ",
        absl::StrJoin(plan.problems(), "\n  ")));
  }

  bool add_bos = false;  // Qwen tokenizers add no BOS
  absl::StatusOr<std::unique_ptr<GgufWriter>> writer = GgufWriter::Create(out_path);
  if (!writer.ok()) return writer.status();
  for (auto& [key, value] : Metadata(c, nextn, *tok, options, add_bos)) {
    if (absl::Status s = (*writer)->AddMetadata(key, std::move(value)); !s.ok()) return s;
  }
  for (const OutTensor& t : plan.out()) {
    if (absl::Status s = (*writer)->AddTensor(t.name, static_cast<uint32_t>(t.type), t.ne); !s.ok()) {
      return s;
    }
  }
  const size_t n = plan.out().size();
  for (size_t i = 0; i < n; ++i) {
    const OutTensor& t = plan.out()[i];
    if (options.progress) {
      std::fprintf(stderr, "\rtandem convert: [%zu/%zu] %-40s %s", i + 1, n, t.name.c_str(),
                   std::string(GetWeightTypeInfo(t.type).name).c_str());
      std::fflush(stderr);
    }
    if (absl::Status s = WriteTensor(**writer, t); !s.ok()) return s;
  }
  if (options.progress) std::fprintf(stderr, "\n");
  return (*writer)->Finish();
}

}  // namespace tandem
