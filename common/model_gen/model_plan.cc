#include "common/model_gen/model_plan.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Output projections (attn_output, ssm_out, expert and shared down, engram_value) are drawn with
// this gain on top of 1/√fan_in, so each block adds about a quarter of a unit to the residual
// stream and its RMS grows slowly with depth (docs/GEN_MODEL.md).
constexpr float kOutputGain = 0.5f;
constexpr float kNormSpread = 0.05f;

bool IsQuantized(WeightType t) { return GetWeightTypeInfo(t).block_elems > 1; }

class Planner {
 public:
  explicit Planner(const GenModelSpec& spec) : s_(spec) {}

  std::vector<PlannedTensor> Build() {
    const int64_t h = s_.h;
    Add("token_embd.weight", FitWeightType(s_.head_type, h), {h, s_.vocab}, TensorInit::kEmbedding,
        1.0f);
    if (!s_.engram_layers.empty() && s_.engram_token_map) {
      // Compress ids into 7/8 of the vocabulary, so distinct tokens share Engram n-grams.
      PlannedTensor t = Make("engram_token_map", kGgmlTypeI32, {s_.vocab},
                             TensorInit::kTokenMap, 0.875f);
      out_.push_back(t);
    }
    for (int64_t i = 0; i < s_.layers + s_.nextn; ++i) Layer(i);
    if (s_.streams > 1) {
      HcSet("output_hc", /*with_inject=*/false);
    } else {
      Norm("output_norm.weight", h);
    }
    if (!s_.tied_output) {
      Add("output.weight", FitWeightType(s_.head_type, h), {h, s_.vocab}, TensorInit::kGaussian,
          Std(1.0f, h));
    }
    return std::move(out_);
  }

 private:
  static float Std(float gain, int64_t fan_in) {
    return gain / std::sqrt(static_cast<float>(fan_in));
  }

  PlannedTensor Make(std::string name, uint32_t type, std::vector<int64_t> ne, TensorInit init,
                     float scale) {
    PlannedTensor t;
    t.name = std::move(name);
    t.ggml_type = type;
    t.ne = std::move(ne);
    t.init = init;
    t.scale = scale;
    const WeightTypeInfo* info = FindWeightTypeInfo(type);
    t.n_bytes = static_cast<uint64_t>(t.ne[0] / info->block_elems * info->block_bytes) *
                static_cast<uint64_t>(t.rows());
    return t;
  }
  void Add(std::string name, WeightType type, std::vector<int64_t> ne, TensorInit init,
           float scale) {
    out_.push_back(Make(std::move(name), static_cast<uint32_t>(type), std::move(ne), init, scale));
  }
  // A dense projection {cols, rows} with N(0, gain²/cols).
  void Dense(std::string name, int64_t cols, int64_t rows, float gain = 1.0f) {
    Add(std::move(name), FitWeightType(s_.dense_type, cols), {cols, rows}, TensorInit::kGaussian,
        Std(gain, cols));
  }
  void Norm(std::string name, int64_t n) {
    Add(std::move(name), WeightType::kF32, {n}, TensorInit::kNearOne, kNormSpread);
  }
  void F32(std::string name, std::vector<int64_t> ne, TensorInit init, float scale) {
    Add(std::move(name), WeightType::kF32, std::move(ne), init, scale);
  }
  void Experts(std::string name, WeightType wanted, int64_t cols, int64_t rows, float gain) {
    const WeightType type = FitWeightType(wanted, cols);
    PlannedTensor t = Make(std::move(name), static_cast<uint32_t>(type), {cols, rows, s_.experts},
                           TensorInit::kGaussian, Std(gain, cols));
    t.direct_quant = IsQuantized(type);
    out_.push_back(std::move(t));
  }
  // {prefix}_hc_norm {w}, _hc_down {w, lr}, _hc_up {lr, w}, and _hc_inject {w, S}.
  void HcSet(const std::string& prefix, bool with_inject) {
    const int64_t w = StreamWidth(s_);
    const int64_t lr = s_.hc_rank;
    Norm(absl::StrCat(prefix, "_norm.weight"), w);
    Dense(absl::StrCat(prefix, "_down.weight"), w, lr);
    Dense(absl::StrCat(prefix, "_up.weight"), lr, w);
    if (with_inject && s_.hc_inject) {
      F32(absl::StrCat(prefix, "_inject.weight"), {w, s_.streams}, TensorInit::kGaussian,
          Std(0.5f, w));
    }
  }

  void Layer(int64_t i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    const int64_t h = s_.h;
    const bool mtp = i >= s_.layers;
    if (mtp) Mtp(p);
    if (s_.streams > 1) {
      HcSet(p + "attn_hc", true);
    } else {
      Norm(p + "attn_norm.weight", h);
    }
    if (!mtp && Contains(s_.engram_layers, i)) Engram(p);
    if (IsAttentionLayer(s_, i)) {
      Attention(p);
    } else {
      Gdn(p);
    }
    if (s_.streams > 1) {
      HcSet(p + "ffn_hc", true);
    } else {
      Norm(p + "post_attention_norm.weight", h);
    }
    Moe(p, i);
  }

  void Mtp(const std::string& p) {
    const int64_t h = s_.h;
    Dense(p + "nextn.eh_proj.weight", 2 * h, h);
    Norm(p + "nextn.enorm.weight", h);
    Norm(p + "nextn.hnorm.weight", StreamWidth(s_));
    if (s_.streams > 1) {
      HcSet(p + "nextn.hc", false);
    } else {
      Norm(p + "nextn.shared_head_norm.weight", h);
    }
  }

  void Attention(const std::string& p) {
    const int64_t h = s_.h, hd = s_.head_dim;
    Dense(p + "attn_q.weight", h, s_.n_head * 2 * hd);
    Dense(p + "attn_k.weight", h, s_.n_head_kv * hd);
    Dense(p + "attn_v.weight", h, s_.n_head_kv * hd);
    Dense(p + "attn_output.weight", s_.n_head * hd, h, kOutputGain);
    Norm(p + "attn_q_norm.weight", hd);
    Norm(p + "attn_k_norm.weight", hd);
    if (s_.idx_heads > 0) {
      Dense(p + "attn_idx_qk.weight", h, s_.idx_heads * s_.idx_dim + s_.idx_dim);
      Norm(p + "attn_idx_q_norm.weight", s_.idx_dim);
      Norm(p + "attn_idx_k_norm.weight", s_.idx_dim);
    }
  }

  void Gdn(const std::string& p) {
    const int64_t h = s_.h, nv = s_.ssm_nv, dv = s_.ssm_dk;
    Dense(p + "attn_qkv.weight", h, GdnConvChannels(s_));
    Dense(p + "attn_gate.weight", h, nv * dv);
    Dense(p + "ssm_ba.weight", h, 2 * nv);
    F32(p + "ssm_conv1d.weight", {s_.ssm_conv_kernel, GdnConvChannels(s_)}, TensorInit::kGaussian,
        Std(1.0f, s_.ssm_conv_kernel));
    F32(p + "ssm_a", {nv}, TensorInit::kSsmA, 0.0f);
    F32(p + "ssm_dt.bias", {nv}, TensorInit::kDtBias, 0.0f);
    Norm(p + "ssm_norm.weight", dv);
    Dense(p + "ssm_out.weight", nv * dv, h, kOutputGain);
  }

  void Moe(const std::string& p, int64_t layer) {
    const int64_t h = s_.h, I = s_.expert_ffn, Ish = s_.shared_ffn;
    PlannedTensor router = Make(p + "ffn_gate_inp.weight", static_cast<uint32_t>(WeightType::kF32),
                                {h, s_.experts}, TensorInit::kRouter, Std(1.0f, h));
    router.layer = layer;
    out_.push_back(std::move(router));
    Experts(p + "ffn_gate_exps.weight", s_.expert_gate_up_type, h, I, 1.0f);
    Experts(p + "ffn_up_exps.weight", s_.expert_gate_up_type, h, I, 1.0f);
    Experts(p + "ffn_down_exps.weight", s_.expert_down_type, I, h, kOutputGain);
    if (Ish > 0) {
      // A small gate vector: σ(⟨g, x⟩) stays near 1/2 with a spread of about ±0.1.
      F32(p + "ffn_gate_inp_shexp.weight", {h}, TensorInit::kGaussian, Std(0.5f, h));
      Dense(p + "ffn_gate_shexp.weight", h, Ish);
      Dense(p + "ffn_up_shexp.weight", h, Ish);
      Dense(p + "ffn_down_shexp.weight", Ish, h, kOutputGain);
    }
  }

  void Engram(const std::string& p) {
    const int64_t w = StreamWidth(s_), h = s_.h, de = s_.engram_head_dim;
    const int64_t pin = (s_.engram_max_ngram - 1) * s_.engram_heads * de;
    int64_t rows = 0;
    const std::vector<uint32_t> sizes = EngramTableSizes(s_);
    const int64_t per_layer = (s_.engram_max_ngram - 1) * s_.engram_heads;
    const int64_t j = IndexOf(s_.engram_layers, LayerOf(p));
    for (int64_t t = 0; t < per_layer; ++t) rows += sizes[j * per_layer + t];
    // Table rows of unit variance, so e has RMS 1 like an embedding.
    Add(p + "engram_embd.weight", FitWeightType(s_.dense_type, de), {de, rows},
        TensorInit::kGaussian, 1.0f);
    Dense(p + "engram_key.weight", pin, w);
    Dense(p + "engram_value.weight", pin, h, kOutputGain);
    Norm(p + "engram_key_norm.weight", w);
    Norm(p + "engram_query_norm.weight", w);
    Norm(p + "engram_conv_norm.weight", w);
    F32(p + "engram_conv.weight", {s_.engram_conv_kernel, w}, TensorInit::kGaussian,
        Std(0.5f, s_.engram_conv_kernel));
  }

  static bool Contains(const std::vector<int64_t>& v, int64_t x) { return IndexOf(v, x) >= 0; }
  static int64_t IndexOf(const std::vector<int64_t>& v, int64_t x) {
    for (size_t k = 0; k < v.size(); ++k) {
      if (v[k] == x) return static_cast<int64_t>(k);
    }
    return -1;
  }
  // The layer number of a "blk.<i>." prefix.
  static int64_t LayerOf(const std::string& p) { return std::stoll(p.substr(4)); }

  const GenModelSpec& s_;
  std::vector<PlannedTensor> out_;
};

}  // namespace

int64_t PlannedTensor::rows() const {
  int64_t r = 1;
  for (size_t d = 1; d < ne.size(); ++d) r *= ne[d];
  return r;
}

absl::StatusOr<std::vector<PlannedTensor>> PlanTensors(const GenModelSpec& spec) {
  if (absl::Status s = CheckGenModelSpec(spec); !s.ok()) return s;
  return Planner(spec).Build();
}

uint64_t PlannedDataBytes(const std::vector<PlannedTensor>& plan, uint32_t alignment) {
  uint64_t total = 0;
  for (const PlannedTensor& t : plan) total += (t.n_bytes + alignment - 1) / alignment * alignment;
  return total;
}

}  // namespace tandem
