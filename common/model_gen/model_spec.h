// What `tandem gen-model` makes: the shape, weight types, seed and routing skew of one synthetic
// qwen3next / qwen4exp model (docs/MODEL.md; docs/GEN_MODEL.md describes the presets and how
// weights are drawn).
#ifndef TANDEM_COMMON_MODEL_GEN_MODEL_SPEC_H_
#define TANDEM_COMMON_MODEL_GEN_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/weights/weight_types.h"

namespace tandem {

struct GenModelSpec {
  std::string arch = "qwen4exp";  // general.architecture: "qwen3next" or "qwen4exp"
  std::string name = "tandem-synthetic";  // general.name

  // Trunk (docs/MODEL.md §1).
  int64_t h = 256;             // embedding_length
  int64_t layers = 6;          // main layers L (block_count = L + nextn)
  int64_t nextn = 1;           // MTP layers: 0 or 1
  int64_t vocab = 1024;        // tokenizer size = rows of token_embd
  int64_t context_length = 4096;
  double eps = 1e-6;

  // Full attention.
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 64;
  int64_t rope_dims = 32;
  double rope_theta = 1e7;
  // Layer i is full attention iff (i + 1) % interval == 0 (both keys are written).
  int64_t full_attention_interval = 3;

  // Gated DeltaNet.
  int64_t ssm_nk = 2;          // key heads (group_count)
  int64_t ssm_nv = 4;          // value heads (time_step_rank)
  int64_t ssm_dk = 64;         // state_size (dk = dv)
  int64_t ssm_conv_kernel = 4;

  // Mixture of experts.
  int64_t experts = 16;        // E
  int64_t experts_used = 4;    // K
  int64_t expert_ffn = 256;    // I
  int64_t shared_ffn = 256;    // Ish (0: no shared expert)

  // qwen4exp: hyper-connection streams (1: none).
  int64_t streams = 1;         // S
  int64_t hc_rank = 0;         // lr (> 0 when streams > 1)
  bool hc_inject = true;       // write {side}_hc_inject (streams > 1)

  // qwen4exp: query-selected sparse attention (idx_heads = 0: dense attention, no indexer).
  int64_t idx_heads = 0;       // ih
  int64_t idx_dim = 0;         // di (>= rope_dims)
  int64_t idx_block = 0;       // cr
  int64_t idx_keep = 0;        // keep

  // qwen4exp: Engram n-gram memory (engram_layers empty: none).
  std::vector<int64_t> engram_layers;
  int64_t engram_max_ngram = 3;     // N (orders 2..N)
  int64_t engram_heads = 2;         // K per order
  int64_t engram_head_dim = 32;     // de
  int64_t engram_conv_kernel = 4;   // ck
  int64_t engram_dilation = 1;      // δ
  int64_t engram_table_rows = 1024; // target rows per (order, head) table: primes just below it
  bool engram_token_map = true;     // write engram_token_map (else identity)

  // Weight types per tensor group. Norms, vectors, conv taps, routers, hc inject and ssm_a /
  // ssm_dt are always F32. A type whose block does not divide a tensor's ne0 falls back (see
  // FitWeightType).
  WeightType expert_gate_up_type = WeightType::kQ4_K;  // ffn_gate_exps, ffn_up_exps
  WeightType expert_down_type = WeightType::kQ4_K;     // ffn_down_exps
  WeightType dense_type = WeightType::kQ8_0;  // attention / GDN / shared expert / hc / Engram / MTP
  WeightType head_type = WeightType::kQ6_K;   // token_embd and output
  bool tied_output = false;                   // omit output.weight (tied to token_embd)

  uint64_t seed = 1;
  // Routing skew: expert popularity ~ rank^-zipf (0: no skew). See docs/GEN_MODEL.md.
  double zipf = 0.0;
};

// Names accepted by PresetSpec, in the order `gen-model --help` lists them.
const std::vector<std::string>& PresetNames();
// "tiny", "tiny-q3n", "small", "q3n-80b", "q4x-80b" (docs/GEN_MODEL.md). NotFound listing the
// names for any other.
absl::StatusOr<GenModelSpec> PresetSpec(const std::string& name);

// Checks every field and every cross-field rule (head counts divide, rot <= hd and <= di, K <= E,
// Engram layers are distinct main layers, the tokenizer can have `vocab` tokens, ...).
// InvalidArgument listing each bad field by name.
absl::Status CheckGenModelSpec(const GenModelSpec& spec);

// Derived quantities (spec must pass CheckGenModelSpec).
bool IsAttentionLayer(const GenModelSpec& spec, int64_t layer);  // MTP layers: always true
int64_t GdnConvChannels(const GenModelSpec& spec);               // 2·nk·dk + nv·dv
int64_t StreamWidth(const GenModelSpec& spec);                   // w = S·h
// A.engram.multipliers: max_ngram odd u64 per Engram layer, from the seed. They are below 2^63 so
// that readers which take integer arrays through int64 accept them.
std::vector<uint64_t> EngramMultipliers(const GenModelSpec& spec);
// A.engram.table_sizes: (max_ngram−1)·heads distinct primes per Engram layer, the largest primes
// below engram_table_rows (all distinct across layers too); independent of the seed.
std::vector<uint32_t> EngramTableSizes(const GenModelSpec& spec);
// The expert popularity rank (1 = most popular) of expert e in layer `layer` under skewed
// routing: a per-layer permutation of 1..E drawn from the seed.
std::vector<int64_t> ExpertPopularityRanks(const GenModelSpec& spec, int64_t layer);

// The type a tensor of the group's `wanted` type gets when its ne0 is `cols`: `wanted` when its
// block divides cols; else Q8_0 when 32 divides cols (for a quantized `wanted`); else F16.
WeightType FitWeightType(WeightType wanted, int64_t cols);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_MODEL_SPEC_H_
