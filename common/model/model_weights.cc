#include "common/model/model_weights.h"

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

std::string ShapeString(const GgufTensorInfo& t) {
  std::vector<int64_t> dims(t.ne.begin(), t.ne.begin() + std::max(t.n_dims, 1));
  return absl::StrCat("{", absl::StrJoin(dims, ", "), "}");
}

// Looks tensors up by name, checks shape and type, and collects every problem.
class Binder {
 public:
  Binder(const GgufFile& file, ModelWeights& out) : file_(file), out_(out) {}

  bool Has(const std::string& name) const { return file_.FindTensor(name) != nullptr; }

  // A 2-D matrix {cols, rows}; a 1-D tensor {cols} counts as rows = 1.
  MatrixView Matrix(const std::string& name, int64_t cols, int64_t rows, bool optional = false) {
    const GgufTensorInfo* t = Find(name, optional);
    if (t == nullptr || !CheckType(*t)) return {};
    const bool shape_ok = t->ne[0] == cols && t->ne[1] == rows && t->ne[2] == 1 && t->ne[3] == 1;
    if (!shape_ok) {
      problems_.push_back(absl::StrCat("tensor '", name, "' has shape ", ShapeString(*t),
                                       ", expected {", cols, ", ", rows, "}"));
      return {};
    }
    MatrixView m;
    m.type = t->weight_type();
    m.data = t->data.data();
    m.cols = cols;
    m.rows = rows;
    m.row_bytes = *RowBytes(m.type, cols);
    return m;
  }

  ExpertMatrixView Experts(const std::string& name, int64_t cols, int64_t rows, int64_t experts) {
    const GgufTensorInfo* t = Find(name, false);
    if (t == nullptr || !CheckType(*t)) return {};
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != experts || t->ne[3] != 1) {
      problems_.push_back(absl::StrCat("tensor '", name, "' has shape ", ShapeString(*t),
                                       ", expected {", cols, ", ", rows, ", ", experts, "}"));
      return {};
    }
    ExpertMatrixView m;
    m.type = t->weight_type();
    m.data = t->data.data();
    m.cols = cols;
    m.rows = rows;
    m.experts = experts;
    m.row_bytes = *RowBytes(m.type, cols);
    return m;
  }

  // An f32 vector of `size` elements (any tensor shape with that many elements, e.g. {kk, c_dim}
  // for conv taps); other float types are converted once into owned storage.
  VectorView Vector(const std::string& name, int64_t size, bool optional = false) {
    const GgufTensorInfo* t = Find(name, optional);
    if (t == nullptr || !CheckType(*t)) return {};
    if (t->n_elements != size) {
      problems_.push_back(absl::StrCat("tensor '", name, "' has shape ", ShapeString(*t), " (",
                                       t->n_elements, " elements), expected ", size, " elements"));
      return {};
    }
    if (t->weight_type() == WeightType::kF32) {
      return VectorView(reinterpret_cast<const float*>(t->data.data()), size);
    }
    std::vector<float>& copy = out_.owned.emplace_back(size);
    const int64_t row = t->ne[0];
    const int64_t row_bytes = *RowBytes(t->weight_type(), row);
    for (int64_t r = 0; r < size / row; ++r) {
      DequantizeRow(t->weight_type(), t->data.data() + r * row_bytes, copy.data() + r * row, row);
    }
    return VectorView(copy.data(), size);
  }

  std::vector<int32_t> I32Vector(const std::string& name, int64_t size) {
    const GgufTensorInfo* t = Find(name, true);
    if (t == nullptr) return {};
    constexpr uint32_t kI32 = 26;
    if (t->ggml_type != kI32 || t->n_elements != size) {
      problems_.push_back(absl::StrCat("tensor '", name, "' must be i32 with ", size,
                                       " elements; found ", std::string(t->type_info->name), " ",
                                       ShapeString(*t)));
      return {};
    }
    std::vector<int32_t> v(size);
    std::memcpy(v.data(), t->data.data(), size * sizeof(int32_t));
    return v;
  }

  // Rows [first, first + rows) of a bound matrix: a view into the same bytes (no copy).
  static MatrixView Rows(const MatrixView& m, int64_t first, int64_t rows) {
    if (!m.present()) return {};
    MatrixView v = m;
    v.data = m.row(first);
    v.rows = rows;
    return v;
  }

  // A matrix made of row ranges (first, count) of `m`, in order, copied into owned storage: for
  // llama.cpp's fused forms whose parts are interleaved (ssm_in, ffn_gate_up_exps).
  MatrixView Gather(const MatrixView& m, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
    if (!m.present()) return {};
    int64_t rows = 0;
    for (const auto& r : ranges) rows += r.second;
    // Owned storage is a float deque; the bytes are rounded up to whole floats (the blocks of
    // every type only need 2-byte alignment, which the allocation exceeds).
    const size_t bytes = static_cast<size_t>(rows * m.row_bytes);
    std::vector<float>& store = out_.owned.emplace_back((bytes + sizeof(float) - 1) / sizeof(float));
    uint8_t* dst = reinterpret_cast<uint8_t*>(store.data());
    for (const auto& [first, count] : ranges) {
      std::memcpy(dst, m.row(first), count * m.row_bytes);
      dst += count * m.row_bytes;
    }
    MatrixView v = m;
    v.data = store.data();
    v.rows = rows;
    return v;
  }

  void Problem(std::string message) { problems_.push_back(std::move(message)); }

  absl::Status Status() const {
    if (problems_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        file_.source(), ": the tensors do not match the model (", problems_.size(), " problem",
        problems_.size() == 1 ? "" : "s", "):\n  ", absl::StrJoin(problems_, "\n  ")));
  }

 private:
  const GgufTensorInfo* Find(const std::string& name, bool optional) {
    const GgufTensorInfo* t = file_.FindTensor(name);
    if (t == nullptr && !optional) problems_.push_back(absl::StrCat("tensor '", name, "' is missing"));
    return t;
  }
  bool CheckType(const GgufTensorInfo& t) {
    if (t.type_info->supported) return true;
    problems_.push_back(absl::StrCat("tensor '", t.name, "' has type ", std::string(t.type_info->name),
                                     ", which Tandem cannot compute with"));
    return false;
  }

  const GgufFile& file_;
  ModelWeights& out_;
  std::vector<std::string> problems_;
};

// A stream read: the `{prefix}hc_*` set when its norm exists, else the plain norm `plain`.
HcWeights BindRead(Binder& b, const ModelConfig& c, const std::string& prefix,
                   const std::string& plain, bool with_inject) {
  HcWeights w;
  const int64_t width = c.width();
  if (b.Has(prefix + "hc_norm.weight")) {
    w.norm = b.Vector(prefix + "hc_norm.weight", width);
    if (c.n_streams > 1) {
      w.down = b.Matrix(prefix + "hc_down.weight", width, c.hc_rank);
      w.up = b.Matrix(prefix + "hc_up.weight", c.hc_rank, width);
      if (with_inject) w.inject = b.Matrix(prefix + "hc_inject.weight", width, c.n_streams, true);
    }
    return w;
  }
  if (c.n_streams > 1) {
    b.Problem(absl::StrCat("tensor '", prefix, "hc_norm.weight' is missing (the model has ",
                           c.n_streams, " streams)"));
    return w;
  }
  w.norm = b.Vector(plain, c.h);
  return w;
}

void BindAttention(Binder& b, const ModelConfig& c, const std::string& p, AttnWeights& w) {
  const AttnDims& d = c.attn;
  const int64_t nq = d.nh * 2 * d.hd, nkv = d.kvh * d.hd;
  if (!b.Has(p + "attn_q.weight") && b.Has(p + "attn_qkv.weight")) {
    // llama.cpp's fused form: rows [q with gates (nq) | k (nkv) | v (nkv)].
    const MatrixView qkv = b.Matrix(p + "attn_qkv.weight", c.h, nq + 2 * nkv);
    w.q = Binder::Rows(qkv, 0, nq);
    w.k = Binder::Rows(qkv, nq, nkv);
    w.v = Binder::Rows(qkv, nq + nkv, nkv);
  } else {
    w.q = b.Matrix(p + "attn_q.weight", c.h, nq);
    w.k = b.Matrix(p + "attn_k.weight", c.h, nkv);
    w.v = b.Matrix(p + "attn_v.weight", c.h, nkv);
  }
  w.output = b.Matrix(p + "attn_output.weight", d.nh * d.hd, c.h);
  w.q_norm = b.Vector(p + "attn_q_norm.weight", d.hd);
  w.k_norm = b.Vector(p + "attn_k_norm.weight", d.hd);
  if (d.has_indexer()) {
    w.idx_qk = b.Matrix(p + "attn_idx_qk.weight", c.h, d.ih * d.di + d.di);
    w.idx_q_norm = b.Vector(p + "attn_idx_q_norm.weight", d.di);
    w.idx_k_norm = b.Vector(p + "attn_idx_k_norm.weight", d.di);
  }
}

void BindGdn(Binder& b, const ModelConfig& c, const std::string& p, GdnWeights& w) {
  const GdnDims& d = c.gdn;
  if (!b.Has(p + "attn_qkv.weight") && b.Has(p + "ssm_in.weight")) {
    // The older fused form: rows grouped per key head g as [q (dk) | k (dk) | v (r·dv) | z (r·dv)];
    // attn_qkv is all q, all k, all v, and attn_gate all z, so both are gathered copies.
    const int64_t r = d.nv / d.nk, group = 2 * d.dk + 2 * r * d.dv;
    const MatrixView in = b.Matrix(p + "ssm_in.weight", c.h, d.nk * group);
    std::vector<std::pair<int64_t, int64_t>> qkv, z;
    for (int64_t g = 0; g < d.nk; ++g) qkv.emplace_back(g * group, d.dk);
    for (int64_t g = 0; g < d.nk; ++g) qkv.emplace_back(g * group + d.dk, d.dk);
    for (int64_t g = 0; g < d.nk; ++g) qkv.emplace_back(g * group + 2 * d.dk, r * d.dv);
    for (int64_t g = 0; g < d.nk; ++g) z.emplace_back(g * group + 2 * d.dk + r * d.dv, r * d.dv);
    w.qkv = b.Gather(in, qkv);
    w.gate = b.Gather(in, z);
  } else {
    w.qkv = b.Matrix(p + "attn_qkv.weight", c.h, d.c_dim());
    w.gate = b.Matrix(p + "attn_gate.weight", c.h, d.nv * d.dv);
  }
  w.ba = b.Matrix(p + "ssm_ba.weight", c.h, 2 * d.nv);
  w.conv1d = b.Vector(p + "ssm_conv1d.weight", d.kk * d.c_dim());
  w.a = b.Vector(p + "ssm_a", d.nv);
  w.dt_bias = b.Vector(p + "ssm_dt.bias", d.nv);
  w.norm = b.Vector(p + "ssm_norm.weight", d.dv);
  w.out = b.Matrix(p + "ssm_out.weight", d.nv * d.dv, c.h);
}

void BindMoe(Binder& b, const ModelConfig& c, const std::string& p, MoeWeights& w) {
  const int64_t E = c.moe.E, I = c.expert_ffn;
  w.router = b.Matrix(p + "ffn_gate_inp.weight", c.h, E);
  if (!b.Has(p + "ffn_gate_exps.weight") && b.Has(p + "ffn_gate_up_exps.weight")) {
    // llama.cpp's fused form {h, 2I, E}: per expert I gate rows then I up rows. Expert views have
    // no stride, so the gate and up halves are gathered into two stacked copies.
    const ExpertMatrixView gu = b.Experts(p + "ffn_gate_up_exps.weight", c.h, 2 * I, E);
    if (gu.present()) {
      MatrixView all{gu.type, gu.data, gu.cols, 2 * I * E, gu.row_bytes};
      std::vector<std::pair<int64_t, int64_t>> gate, up;
      for (int64_t e = 0; e < E; ++e) {
        gate.emplace_back(e * 2 * I, I);
        up.emplace_back(e * 2 * I + I, I);
      }
      const MatrixView g = b.Gather(all, gate), u = b.Gather(all, up);
      w.gate = ExpertMatrixView{g.type, g.data, c.h, I, E, g.row_bytes};
      w.up = ExpertMatrixView{u.type, u.data, c.h, I, E, u.row_bytes};
    }
  } else {
    w.gate = b.Experts(p + "ffn_gate_exps.weight", c.h, I, E);
    w.up = b.Experts(p + "ffn_up_exps.weight", c.h, I, E);
  }
  w.down = b.Experts(p + "ffn_down_exps.weight", I, c.h, E);
  if (c.shared_ffn > 0) {
    w.shared_gate_inp = b.Matrix(p + "ffn_gate_inp_shexp.weight", c.h, 1, true);
    w.shared_gate = b.Matrix(p + "ffn_gate_shexp.weight", c.h, c.shared_ffn);
    w.shared_up = b.Matrix(p + "ffn_up_shexp.weight", c.h, c.shared_ffn);
    w.shared_down = b.Matrix(p + "ffn_down_shexp.weight", c.shared_ffn, c.h);
  }
}

void BindEngram(Binder& b, const ModelConfig& c, const std::string& p, const EngramConfig& e,
                EngramWeights& w) {
  const int64_t width = c.width();
  w.embd = b.Matrix(p + "engram_embd.weight", e.head_dim, e.total_rows());
  w.key = b.Matrix(p + "engram_key.weight", e.pin(), width);
  w.value = b.Matrix(p + "engram_value.weight", e.pin(), c.h);
  w.key_norm = b.Vector(p + "engram_key_norm.weight", width);
  w.query_norm = b.Vector(p + "engram_query_norm.weight", width);
  w.conv_norm = b.Vector(p + "engram_conv_norm.weight", width);
  w.conv = b.Vector(p + "engram_conv.weight", e.conv_kernel * width);
}

void BindMtp(Binder& b, const ModelConfig& c, const std::string& p, LayerWeights& w) {
  w.mtp_in.eh_proj = b.Matrix(p + "nextn.eh_proj.weight", 2 * c.h, c.h);
  w.mtp_in.enorm = b.Vector(p + "nextn.enorm.weight", c.h);
  w.mtp_in.hnorm = b.Vector(p + "nextn.hnorm.weight", c.width());
  w.mtp_head_read = BindRead(b, c, p + "nextn.", p + "nextn.shared_head_norm.weight", false);
  w.mtp_embed = b.Matrix(p + "nextn.embed_tokens.weight", c.h, c.vocab, true);
  w.mtp_head = b.Matrix(p + "nextn.shared_head_head.weight", c.h, c.vocab, true);
}

}  // namespace

absl::StatusOr<ModelWeights> BindModelWeights(const GgufFile& file, const ModelConfig& c) {
  ModelWeights w;
  Binder b(file, w);
  w.token_embd = b.Matrix("token_embd.weight", c.h, c.vocab);
  w.output = b.Has("output.weight") ? b.Matrix("output.weight", c.h, c.vocab) : w.token_embd;
  w.output_read = BindRead(b, c, "output_", "output_norm.weight", false);
  if (!c.engram.empty()) {
    // Not a matrix or norm, so MODEL.md's ".weight" rule does not clearly apply: accept both.
    w.engram_token_map = b.I32Vector(
        b.Has("engram_token_map") ? "engram_token_map" : "engram_token_map.weight", c.vocab);
  }

  const int64_t total = c.n_layers + c.nextn;
  w.layers.resize(total);
  for (int64_t i = 0; i < total; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = absl::StrCat("blk.", i, ".");
    l.kind = c.layer_kinds[i];
    l.attn_read = BindRead(b, c, p + "attn_", p + "attn_norm.weight", true);
    l.ffn_read = BindRead(b, c, p + "ffn_", p + "post_attention_norm.weight", true);
    if (l.kind == LayerKind::kGdn) {
      BindGdn(b, c, p, l.gdn);
    } else {
      BindAttention(b, c, p, l.attn);
    }
    BindMoe(b, c, p, l.moe);
    if (const int64_t e = c.engram_index(i); e >= 0) {
      l.has_engram = true;
      BindEngram(b, c, p, c.engram[e], l.engram);
    }
    if (i >= c.n_layers) BindMtp(b, c, p, l);
  }
  if (absl::Status s = b.Status(); !s.ok()) return s;
  return w;
}

}  // namespace tandem
