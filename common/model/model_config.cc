#include "common/model/model_config.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

// Collects every problem found while reading the config, so that one load reports all of them.
class Problems {
 public:
  void Add(std::string message) { messages_.push_back(std::move(message)); }
  void Add(const absl::Status& status) { messages_.emplace_back(status.message()); }
  bool empty() const { return messages_.empty(); }
  absl::Status ToStatus(const std::string& source) const {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a model Tandem can serve (",
                                                   messages_.size(), " problem",
                                                   messages_.size() == 1 ? "" : "s", "):\n  ",
                                                   absl::StrJoin(messages_, "\n  ")));
  }

 private:
  std::vector<std::string> messages_;
};

class ConfigReader {
 public:
  ConfigReader(const GgufFile& file, std::string arch, Problems& problems)
      : file_(file), arch_(std::move(arch)), problems_(problems) {}

  // A required integer in [min, max]; 0 (and a problem noted) when absent or bad.
  int64_t Int(const char* suffix, int64_t min, int64_t max) {
    absl::StatusOr<int64_t> v = file_.GetInt(ArchKey(arch_, suffix), min, max);
    if (!v.ok()) {
      problems_.Add(v.status());
      return 0;
    }
    return *v;
  }
  // An optional integer: `fallback` when absent, a problem when present but bad.
  int64_t OptionalInt(const char* suffix, int64_t fallback, int64_t min, int64_t max) {
    if (!file_.HasKey(ArchKey(arch_, suffix))) return fallback;
    return Int(suffix, min, max);
  }
  double Float(const char* suffix, double fallback, bool required) {
    const std::string key = ArchKey(arch_, suffix);
    if (!required && !file_.HasKey(key)) return fallback;
    absl::StatusOr<double> v = file_.GetFloat(key);
    if (!v.ok()) {
      problems_.Add(v.status());
      return fallback;
    }
    return *v;
  }
  std::vector<int64_t> IntArray(const char* suffix) {
    absl::StatusOr<std::vector<int64_t>> v = file_.GetIntArray(ArchKey(arch_, suffix));
    if (!v.ok()) {
      problems_.Add(v.status());
      return {};
    }
    return *v;
  }
  // An array of unsigned 64-bit values (u64 elements kept whole; other integer types widened).
  std::vector<uint64_t> U64Array(const char* suffix) {
    const std::string key = ArchKey(arch_, suffix);
    absl::StatusOr<const GgufValue*> arr = file_.GetArray(key);
    if (arr.ok() && (*arr)->element_type() == GgufType::kU64) {
      absl::StatusOr<std::vector<uint64_t>> v = file_.GetArrayOf<uint64_t>(key);
      if (v.ok()) return *v;
      problems_.Add(v.status());
      return {};
    }
    std::vector<uint64_t> out;
    for (int64_t x : IntArray(suffix)) out.push_back(static_cast<uint64_t>(x));
    return out;
  }
  bool Has(const char* suffix) const { return file_.HasKey(ArchKey(arch_, suffix)); }
  void Require(bool ok, std::string message) {
    if (!ok) problems_.Add(std::move(message));
  }
  std::string Key(const char* suffix) const { return ArchKey(arch_, suffix); }
  const GgufFile& file() const { return file_; }

 private:
  const GgufFile& file_;
  std::string arch_;
  Problems& problems_;
};

constexpr int64_t kMaxDim = int64_t{1} << 24;

void ReadLayerKinds(ConfigReader& r, ModelConfig& c) {
  const int64_t total = c.n_layers + c.nextn;
  c.layer_kinds.assign(total, LayerKind::kAttention);
  if (r.Has("attention.recurrent_layers")) {
    absl::StatusOr<const GgufValue*> arr = r.file().GetArray(r.Key("attention.recurrent_layers"));
    if (!arr.ok()) {
      r.Require(false, std::string(arr.status().message()));
      return;
    }
    const GgufValue& v = **arr;
    r.Require(v.element_type() == GgufType::kBool || IsGgufIntegerType(v.element_type()),
              absl::StrCat(r.Key("attention.recurrent_layers"), ": expected an array of bool, found ",
                           GgufTypeName(v.element_type())));
    r.Require(static_cast<int64_t>(v.array_size()) >= c.n_layers,
              absl::StrCat(r.Key("attention.recurrent_layers"), ": has ", v.array_size(),
                           " entries, the model has ", c.n_layers, " main layers"));
    if (static_cast<int64_t>(v.array_size()) < c.n_layers) return;
    for (int64_t i = 0; i < c.n_layers; ++i) {
      absl::StatusOr<int64_t> bit = v.ElementAt(i).ToInt();
      const bool gdn = v.element_type() == GgufType::kBool ? (v.ElementAt(i).scalar_bits() != 0)
                                                            : (bit.ok() && *bit != 0);
      c.layer_kinds[i] = gdn ? LayerKind::kGdn : LayerKind::kAttention;
    }
    return;
  }
  const int64_t interval = r.Int("full_attention_interval", 1, 1 << 20);
  if (interval == 0) return;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    c.layer_kinds[i] = (i + 1) % interval == 0 ? LayerKind::kAttention : LayerKind::kGdn;
  }
}

void ReadEngram(ConfigReader& r, ModelConfig& c) {
  if (!r.Has("engram.layers")) return;
  const std::vector<int64_t> layers = r.IntArray("engram.layers");
  const int64_t N = r.Int("engram.max_ngram", 2, 16);
  const int64_t K = r.Int("engram.heads", 1, 1 << 10);
  const int64_t de = r.Int("engram.head_dim", 1, kMaxDim);
  const int64_t ck = r.Int("engram.conv_kernel", 1, 64);
  const int64_t dil = r.Int("engram.conv_dilation", 1, 1 << 10);
  const std::vector<uint64_t> mult = r.U64Array("engram.multipliers");
  const std::vector<int64_t> sizes = r.IntArray("engram.table_sizes");
  if (N == 0 || K == 0) return;
  const size_t n_eng = layers.size();
  r.Require(mult.size() == n_eng * N,
            absl::StrCat(r.Key("engram.multipliers"), ": has ", mult.size(), " entries, expected ",
                         n_eng * N, " (max_ngram per Engram layer)"));
  r.Require(sizes.size() == n_eng * (N - 1) * K,
            absl::StrCat(r.Key("engram.table_sizes"), ": has ", sizes.size(), " entries, expected ",
                         n_eng * (N - 1) * K, " ((max_ngram-1)*heads per Engram layer)"));
  if (mult.size() != n_eng * N || sizes.size() != n_eng * (N - 1) * K) return;
  for (size_t j = 0; j < n_eng; ++j) {
    const int64_t layer = layers[j];
    r.Require(layer >= 0 && layer < c.n_layers,
              absl::StrCat(r.Key("engram.layers"), "[", j, "] = ", layer, " is not a main layer"));
    EngramConfig e;
    e.max_ngram = N;
    e.heads = K;
    e.head_dim = de;
    e.conv_kernel = ck;
    e.dilation = dil;
    for (int64_t i = 0; i < N; ++i) e.multipliers.push_back(mult[j * N + i]);
    for (int64_t i = 0; i < (N - 1) * K; ++i) {
      const int64_t p = sizes[j * (N - 1) * K + i];
      r.Require(p > 0 && p <= UINT32_MAX,
                absl::StrCat(r.Key("engram.table_sizes"), "[", j * (N - 1) * K + i, "] = ", p,
                             " is not a valid table size"));
      e.table_sizes.push_back(static_cast<uint32_t>(std::clamp<int64_t>(p, 1, UINT32_MAX)));
    }
    if (absl::Status s = CheckEngramConfig(e); !s.ok()) {
      r.Require(false, absl::StrCat("Engram layer ", layer, ": ", s.message()));
    }
    c.engram_layers.push_back(layer);
    c.engram.push_back(std::move(e));
  }
}

}  // namespace

std::string ArchKey(const std::string& arch, const char* suffix) {
  return absl::StrCat(arch, ".", suffix);
}

int64_t ModelConfig::engram_index(int64_t layer) const {
  for (size_t j = 0; j < engram_layers.size(); ++j) {
    if (engram_layers[j] == layer) return static_cast<int64_t>(j);
  }
  return -1;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file) {
  Problems problems;
  ModelConfig c;
  absl::StatusOr<std::string> arch = file.GetString("general.architecture");
  if (!arch.ok()) return problems.Add(arch.status()), problems.ToStatus(file.source());
  if (*arch != "qwen3next" && *arch != "qwen4exp") {
    problems.Add(absl::StrCat("general.architecture is '", *arch,
                              "'; Tandem serves 'qwen3next' and 'qwen4exp'"));
    return problems.ToStatus(file.source());
  }
  c.arch = *arch;
  if (absl::StatusOr<std::string> name = file.GetString("general.name"); name.ok()) c.name = *name;
  ConfigReader r(file, c.arch, problems);

  c.h = r.Int("embedding_length", 1, kMaxDim);
  const int64_t blocks = r.Int("block_count", 1, 4096);
  c.nextn = r.OptionalInt("nextn_predict_layers", 0, 0, 1);
  c.n_layers = blocks - c.nextn;
  r.Require(c.n_layers >= 1, absl::StrCat(r.Key("block_count"), " = ", blocks,
                                          " leaves no main layer besides the MTP layers"));
  if (c.n_layers < 1) return problems.ToStatus(file.source());
  c.context_length = r.OptionalInt("context_length", 0, 0, int64_t{1} << 40);
  c.eps = static_cast<float>(r.Float("attention.layer_norm_rms_epsilon", 1e-6, true));
  ReadLayerKinds(r, c);

  // Attention.
  AttnDims& a = c.attn;
  a.h = c.h;
  a.eps = c.eps;
  a.nh = r.Int("attention.head_count", 1, 1 << 12);
  a.kvh = r.Int("attention.head_count_kv", 1, 1 << 12);
  a.hd = r.Int("attention.key_length", 1, 1 << 14);
  const int64_t vlen = r.OptionalInt("attention.value_length", a.hd, 1, 1 << 14);
  r.Require(vlen == a.hd, absl::StrCat(r.Key("attention.value_length"), " = ", vlen, " differs from ",
                                       r.Key("attention.key_length"), " = ", a.hd));
  a.rot = r.OptionalInt("rope.dimension_count", a.hd, 0, 1 << 14);
  a.theta = r.Float("rope.freq_base", 10000.0, false);
  r.Require(a.kvh == 0 || a.nh % a.kvh == 0,
            absl::StrCat(r.Key("attention.head_count"), " = ", a.nh, " is not a multiple of ",
                         r.Key("attention.head_count_kv"), " = ", a.kvh));
  r.Require(a.rot % 2 == 0 && a.rot <= a.hd,
            absl::StrCat(r.Key("rope.dimension_count"), " = ", a.rot, " must be even and <= ",
                         r.Key("attention.key_length"), " = ", a.hd));
  if (r.Has("attention.indexer.head_count")) {
    a.ih = r.Int("attention.indexer.head_count", 1, 1 << 10);
    a.di = r.Int("attention.indexer.key_length", 2, 1 << 14);
    a.cr = r.Int("attention.indexer.block_size", 1, 1 << 20);
    a.keep = r.Int("attention.indexer.top_blocks", 1, 1 << 20);
    r.Require(a.rot <= a.di, absl::StrCat(r.Key("rope.dimension_count"), " = ", a.rot, " exceeds ",
                                          r.Key("attention.indexer.key_length"), " = ", a.di));
  }

  // Gated DeltaNet (only needed when some layer is GDN).
  const bool any_gdn = std::any_of(c.layer_kinds.begin(), c.layer_kinds.end(),
                                   [](LayerKind k) { return k == LayerKind::kGdn; });
  GdnDims& g = c.gdn;
  g.h = c.h;
  g.eps = c.eps;
  if (any_gdn) {
    g.nk = r.Int("ssm.group_count", 1, 1 << 12);
    g.nv = r.Int("ssm.time_step_rank", 1, 1 << 12);
    g.dk = r.Int("ssm.state_size", 1, 1 << 12);
    g.dv = g.dk;
    g.kk = r.Int("ssm.conv_kernel", 2, 64);
    r.Require(g.nk == 0 || g.nv % g.nk == 0,
              absl::StrCat(r.Key("ssm.time_step_rank"), " = ", g.nv, " is not a multiple of ",
                           r.Key("ssm.group_count"), " = ", g.nk));
    if (r.Has("ssm.inner_size")) {
      const int64_t inner = r.Int("ssm.inner_size", 1, kMaxDim);
      r.Require(inner == g.nv * g.dv, absl::StrCat(r.Key("ssm.inner_size"), " = ", inner,
                                                   " differs from time_step_rank * state_size = ",
                                                   g.nv * g.dv));
    }
  }

  // Mixture of experts.
  c.moe.h = c.h;
  c.moe.E = r.Int("expert_count", 1, 1 << 16);
  c.moe.K = r.Int("expert_used_count", 1, 1 << 10);
  r.Require(c.moe.K <= c.moe.E, absl::StrCat(r.Key("expert_used_count"), " = ", c.moe.K, " exceeds ",
                                              r.Key("expert_count"), " = ", c.moe.E));
  c.expert_ffn = r.Int("expert_feed_forward_length", 1, kMaxDim);
  c.shared_ffn = r.OptionalInt("expert_shared_feed_forward_length", 0, 0, kMaxDim);

  // Hyper-connection streams.
  c.n_streams = r.OptionalInt("hyper.stream_count", 1, 1, 64);
  c.hc_rank = r.OptionalInt("hyper.rank", 0, 0, kMaxDim);
  r.Require(c.n_streams == 1 || c.hc_rank > 0,
            absl::StrCat(r.Key("hyper.stream_count"), " = ", c.n_streams, " needs ",
                         r.Key("hyper.rank"), " > 0"));

  ReadEngram(r, c);

  // The vocabulary: rows of token_embd.
  if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight"); embd == nullptr) {
    problems.Add("tensor 'token_embd.weight' is missing");
  } else {
    c.vocab = embd->ne[1];
    if (embd->ne[0] != c.h) {
      problems.Add(absl::StrCat("tensor 'token_embd.weight' has ne0 = ", embd->ne[0], ", expected ",
                                r.Key("embedding_length"), " = ", c.h));
    }
  }
  if (!problems.empty()) return problems.ToStatus(file.source());
  return c;
}

}  // namespace tandem
