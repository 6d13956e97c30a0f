#include "common/model_gen/model_spec.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_gen/gen_random.h"
#include "common/tokenizer/small_tokenizer.h"

namespace tandem {
namespace {

GenModelSpec TinySpec() {
  GenModelSpec s;  // the defaults are the tiny trunk (qwen4exp)
  s.name = "tandem-tiny";
  s.streams = 4;
  s.hc_rank = 32;
  s.hc_inject = true;
  s.idx_heads = 2;
  s.idx_dim = 32;
  s.idx_block = 8;   // sparse selection starts at position (keep + 1)·cr = 40
  s.idx_keep = 4;
  s.engram_layers = {1, 4};
  s.engram_max_ngram = 3;
  s.engram_heads = 2;
  s.engram_head_dim = 32;
  s.engram_conv_kernel = 4;
  s.engram_dilation = 2;
  s.engram_table_rows = 1024;
  s.engram_token_map = true;
  return s;
}

GenModelSpec TinyQ3nSpec() {
  GenModelSpec s;
  s.arch = "qwen3next";
  s.name = "tandem-tiny-q3n";
  s.engram_token_map = false;
  return s;
}

GenModelSpec SmallSpec() {
  GenModelSpec s;
  s.arch = "qwen3next";
  s.name = "tandem-small";
  s.h = 1024;
  s.layers = 8;
  s.nextn = 1;
  s.vocab = 32768;
  s.context_length = 32768;
  s.n_head = 8;
  s.n_head_kv = 2;
  s.head_dim = 128;
  s.rope_dims = 32;
  s.full_attention_interval = 4;
  s.ssm_nk = 8;
  s.ssm_nv = 16;
  s.ssm_dk = 128;
  s.experts = 64;
  s.experts_used = 8;
  s.expert_ffn = 512;
  s.shared_ffn = 512;
  s.engram_token_map = false;
  return s;
}

GenModelSpec Q3n80bSpec() {
  GenModelSpec s;
  s.arch = "qwen3next";
  s.name = "tandem-q3n-80b (Qwen3-Next-80B-A3B shapes, random weights)";
  s.h = 2048;
  s.layers = 48;
  s.nextn = 1;
  s.vocab = 151936;
  s.context_length = 262144;
  s.n_head = 16;
  s.n_head_kv = 2;
  s.head_dim = 256;
  s.rope_dims = 64;
  s.rope_theta = 1e7;
  s.full_attention_interval = 4;
  s.ssm_nk = 16;
  s.ssm_nv = 32;
  s.ssm_dk = 128;
  s.ssm_conv_kernel = 4;
  s.experts = 512;
  s.experts_used = 10;
  s.expert_ffn = 512;
  s.shared_ffn = 512;
  s.engram_token_map = false;
  s.expert_gate_up_type = WeightType::kQ4_K;
  s.expert_down_type = WeightType::kQ4_K;
  s.dense_type = WeightType::kQ8_0;
  s.head_type = WeightType::kQ6_K;
  return s;
}

GenModelSpec Q4x80bSpec() {
  GenModelSpec s = Q3n80bSpec();
  s.arch = "qwen4exp";
  s.name = "tandem-q4x-80b (Qwen3-Next-80B-A3B shapes plus qwen4exp features, random weights)";
  s.streams = 4;
  s.hc_rank = 64;
  s.hc_inject = true;
  s.idx_heads = 8;
  s.idx_dim = 128;
  s.idx_block = 64;
  s.idx_keep = 32;
  s.engram_layers = {1, 13};
  s.engram_max_ngram = 3;
  s.engram_heads = 4;
  s.engram_head_dim = 64;
  s.engram_conv_kernel = 4;
  s.engram_dilation = 3;
  s.engram_table_rows = 262144;
  s.engram_token_map = true;
  s.expert_gate_up_type = WeightType::kQ2_K;  // the seed's 2-bit expert gate/up
  s.expert_down_type = WeightType::kQ4_K;
  return s;
}

bool IsPrime(uint32_t n) {
  if (n < 2) return false;
  for (uint32_t d = 2; static_cast<uint64_t>(d) * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

int64_t EngramTableCount(const GenModelSpec& s) {
  return static_cast<int64_t>(s.engram_layers.size()) * (s.engram_max_ngram - 1) * s.engram_heads;
}

}  // namespace

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string>* names =
      new std::vector<std::string>{"tiny", "tiny-q3n", "small", "q3n-80b", "q4x-80b"};
  return *names;
}

absl::StatusOr<GenModelSpec> PresetSpec(const std::string& name) {
  if (name == "tiny") return TinySpec();
  if (name == "tiny-q3n") return TinyQ3nSpec();
  if (name == "small") return SmallSpec();
  if (name == "q3n-80b") return Q3n80bSpec();
  if (name == "q4x-80b") return Q4x80bSpec();
  return absl::NotFoundError(absl::StrCat("unknown preset '", name, "' (presets: ",
                                          absl::StrJoin(PresetNames(), ", "), ")"));
}

absl::Status CheckGenModelSpec(const GenModelSpec& s) {
  std::vector<std::string> bad;
  auto require = [&bad](bool ok, std::string message) {
    if (!ok) bad.push_back(std::move(message));
  };
  auto positive = [&require](const char* field, int64_t v, int64_t max) {
    require(v >= 1 && v <= max, absl::StrCat(field, " = ", v, " must be in [1, ", max, "]"));
  };
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  const bool q4x = s.arch == "qwen4exp";
  require(s.arch == "qwen3next" || q4x,
          absl::StrCat("arch = '", s.arch, "' must be 'qwen3next' or 'qwen4exp'"));
  positive("h", s.h, kMaxDim);
  positive("layers", s.layers, 4096);
  require(s.nextn == 0 || s.nextn == 1, absl::StrCat("nextn = ", s.nextn, " must be 0 or 1"));
  require(s.vocab >= kSmallTokenizerMinVocab && s.vocab <= kSmallTokenizerMaxVocab,
          absl::StrCat("vocab = ", s.vocab, " must be in [", kSmallTokenizerMinVocab, ", ",
                       kSmallTokenizerMaxVocab, "] (the generated tokenizer's range)"));
  require(s.context_length >= 1, absl::StrCat("context_length = ", s.context_length, " must be >= 1"));
  require(s.eps > 0 && s.eps < 1, absl::StrCat("eps = ", s.eps, " must be in (0, 1)"));
  positive("n_head", s.n_head, 4096);
  positive("n_head_kv", s.n_head_kv, 4096);
  require(s.n_head_kv < 1 || s.n_head % s.n_head_kv == 0,
          absl::StrCat("n_head = ", s.n_head, " must be a multiple of n_head_kv = ", s.n_head_kv));
  positive("head_dim", s.head_dim, 1 << 14);
  require(s.rope_dims >= 0 && s.rope_dims % 2 == 0 && s.rope_dims <= s.head_dim,
          absl::StrCat("rope_dims = ", s.rope_dims, " must be even and <= head_dim = ", s.head_dim));
  require(s.rope_theta > 0, absl::StrCat("rope_theta = ", s.rope_theta, " must be > 0"));
  positive("full_attention_interval", s.full_attention_interval, 1 << 20);
  positive("ssm_nk", s.ssm_nk, 4096);
  positive("ssm_nv", s.ssm_nv, 4096);
  require(s.ssm_nk < 1 || s.ssm_nv % s.ssm_nk == 0,
          absl::StrCat("ssm_nv = ", s.ssm_nv, " must be a multiple of ssm_nk = ", s.ssm_nk));
  positive("ssm_dk", s.ssm_dk, 4096);
  require(s.ssm_conv_kernel >= 2 && s.ssm_conv_kernel <= 64,
          absl::StrCat("ssm_conv_kernel = ", s.ssm_conv_kernel, " must be in [2, 64]"));
  positive("experts", s.experts, 1 << 16);
  positive("experts_used", s.experts_used, 1 << 10);
  require(s.experts_used <= s.experts, absl::StrCat("experts_used = ", s.experts_used,
                                                    " exceeds experts = ", s.experts));
  positive("expert_ffn", s.expert_ffn, kMaxDim);
  require(s.shared_ffn >= 0 && s.shared_ffn <= kMaxDim,
          absl::StrCat("shared_ffn = ", s.shared_ffn, " must be in [0, ", kMaxDim, "]"));
  require(s.zipf >= 0 && s.zipf <= 8, absl::StrCat("zipf = ", s.zipf, " must be in [0, 8]"));

  // qwen4exp features.
  const bool has_q4x_feature = s.streams != 1 || s.idx_heads != 0 || !s.engram_layers.empty();
  require(q4x || !has_q4x_feature,
          "streams, idx_heads and engram_layers are qwen4exp features; arch is 'qwen3next'");
  positive("streams", s.streams, 64);
  require(s.streams == 1 || (s.hc_rank >= 1 && s.hc_rank <= kMaxDim),
          absl::StrCat("hc_rank = ", s.hc_rank, " must be >= 1 with streams = ", s.streams));
  if (s.idx_heads != 0) {
    positive("idx_heads", s.idx_heads, 1 << 10);
    require(s.idx_dim >= 2 && s.idx_dim <= (1 << 14) && s.idx_dim >= s.rope_dims,
            absl::StrCat("idx_dim = ", s.idx_dim, " must be in [max(2, rope_dims = ", s.rope_dims,
                         "), 16384]"));
    positive("idx_block", s.idx_block, 1 << 20);
    positive("idx_keep", s.idx_keep, 1 << 20);
  }
  if (!s.engram_layers.empty()) {
    std::set<int64_t> seen;
    for (size_t j = 0; j < s.engram_layers.size(); ++j) {
      const int64_t l = s.engram_layers[j];
      require(l >= 0 && l < s.layers, absl::StrCat("engram_layers[", j, "] = ", l,
                                                   " is not a main layer (0..", s.layers - 1, ")"));
      require(seen.insert(l).second, absl::StrCat("engram_layers[", j, "] = ", l, " is repeated"));
    }
    require(s.engram_max_ngram >= 2 && s.engram_max_ngram <= 16,
            absl::StrCat("engram_max_ngram = ", s.engram_max_ngram, " must be in [2, 16]"));
    positive("engram_heads", s.engram_heads, 1 << 10);
    positive("engram_head_dim", s.engram_head_dim, 1 << 14);
    require(s.engram_conv_kernel >= 1 && s.engram_conv_kernel <= 64,
            absl::StrCat("engram_conv_kernel = ", s.engram_conv_kernel, " must be in [1, 64]"));
    positive("engram_dilation", s.engram_dilation, 1 << 10);
    const int64_t tables = EngramTableCount(s);
    // Enough primes below the target: roughly target / ln(target), keep a wide margin.
    require(s.engram_table_rows >= 64 && s.engram_table_rows <= (int64_t{1} << 31) &&
                tables * 32 <= s.engram_table_rows,
            absl::StrCat("engram_table_rows = ", s.engram_table_rows, " must be in [max(64, 32 × ",
                         tables, " tables), 2^31]"));
  }
  if (!bad.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad model spec: ", absl::StrJoin(bad, "; ")));
  }
  return absl::OkStatus();
}

bool IsAttentionLayer(const GenModelSpec& s, int64_t layer) {
  if (layer >= s.layers) return true;
  return (layer + 1) % s.full_attention_interval == 0;
}

int64_t GdnConvChannels(const GenModelSpec& s) {
  return 2 * s.ssm_nk * s.ssm_dk + s.ssm_nv * s.ssm_dk;
}

int64_t StreamWidth(const GenModelSpec& s) { return s.streams * s.h; }

std::vector<uint64_t> EngramMultipliers(const GenModelSpec& s) {
  GenRandom rng(StreamSeed(s.seed, "engram.multipliers"));
  std::vector<uint64_t> out;
  for (size_t j = 0; j < s.engram_layers.size(); ++j) {
    for (int64_t i = 0; i < s.engram_max_ngram; ++i) out.push_back((rng.Next() >> 1) | 1u);
  }
  return out;
}

std::vector<uint32_t> EngramTableSizes(const GenModelSpec& s) {
  std::vector<uint32_t> out;
  const int64_t count = EngramTableCount(s);
  uint32_t candidate = static_cast<uint32_t>(s.engram_table_rows);
  while (static_cast<int64_t>(out.size()) < count && candidate > 2) {
    --candidate;
    if (IsPrime(candidate)) out.push_back(candidate);
  }
  return out;
}

std::vector<int64_t> ExpertPopularityRanks(const GenModelSpec& s, int64_t layer) {
  std::vector<int64_t> ranks(s.experts);
  std::iota(ranks.begin(), ranks.end(), 1);
  GenRandom rng(StreamSeed(s.seed, absl::StrCat("routing.ranks.", layer)));
  for (int64_t i = s.experts - 1; i > 0; --i) {
    std::swap(ranks[i], ranks[rng.Below(static_cast<uint32_t>(i + 1))]);
  }
  return ranks;
}

WeightType FitWeightType(WeightType wanted, int64_t cols) {
  const WeightTypeInfo& info = GetWeightTypeInfo(wanted);
  if (cols % info.block_elems == 0) return wanted;
  if (info.block_elems > 1 && cols % 32 == 0) return WeightType::kQ8_0;
  return WeightType::kF16;
}

}  // namespace tandem
