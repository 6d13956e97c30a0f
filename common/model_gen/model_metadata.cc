#include "common/model_gen/model_metadata.h"

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

class MetadataBuilder {
 public:
  explicit MetadataBuilder(std::string arch) : arch_(std::move(arch)) {}

  void General(std::string key, GgufValue v) { out_.emplace_back(std::move(key), std::move(v)); }
  void Arch(const char* suffix, GgufValue v) {
    out_.emplace_back(absl::StrCat(arch_, ".", suffix), std::move(v));
  }
  void ArchU32(const char* suffix, int64_t v) {
    Arch(suffix, GgufValue::Scalar<uint32_t>(static_cast<uint32_t>(v)));
  }
  void ArchF32(const char* suffix, double v) {
    Arch(suffix, GgufValue::Scalar<float>(static_cast<float>(v)));
  }
  MetadataList Take() { return std::move(out_); }

 private:
  std::string arch_;
  MetadataList out_;
};

}  // namespace

MetadataList BuildModelMetadata(const GenModelSpec& s, const TokenizerSpec& tok) {
  MetadataBuilder m(s.arch);
  m.General("general.architecture", GgufValue::String(s.arch));
  m.General("general.name", GgufValue::String(s.name));
  m.General("general.type", GgufValue::String("model"));

  m.ArchU32("block_count", s.layers + s.nextn);
  m.ArchU32("context_length", s.context_length);
  m.ArchU32("embedding_length", s.h);
  m.ArchU32("attention.head_count", s.n_head);
  m.ArchU32("attention.head_count_kv", s.n_head_kv);
  m.ArchU32("attention.key_length", s.head_dim);
  m.ArchU32("attention.value_length", s.head_dim);
  m.ArchF32("attention.layer_norm_rms_epsilon", s.eps);
  m.ArchF32("rope.freq_base", s.rope_theta);
  m.ArchU32("rope.dimension_count", s.rope_dims);
  m.ArchU32("full_attention_interval", s.full_attention_interval);
  std::vector<bool> recurrent(s.layers + s.nextn);
  for (int64_t i = 0; i < s.layers + s.nextn; ++i) recurrent[i] = !IsAttentionLayer(s, i);
  m.Arch("attention.recurrent_layers", GgufValue::BoolArray(recurrent));
  m.ArchU32("nextn_predict_layers", s.nextn);

  m.ArchU32("ssm.conv_kernel", s.ssm_conv_kernel);
  m.ArchU32("ssm.state_size", s.ssm_dk);
  m.ArchU32("ssm.group_count", s.ssm_nk);
  m.ArchU32("ssm.time_step_rank", s.ssm_nv);
  m.ArchU32("ssm.inner_size", s.ssm_nv * s.ssm_dk);

  m.ArchU32("expert_count", s.experts);
  m.ArchU32("expert_used_count", s.experts_used);
  m.ArchU32("expert_feed_forward_length", s.expert_ffn);
  m.ArchU32("expert_shared_feed_forward_length", s.shared_ffn);

  if (s.streams > 1) {
    m.ArchU32("hyper.stream_count", s.streams);
    m.ArchU32("hyper.rank", s.hc_rank);
  }
  if (s.idx_heads > 0) {
    m.ArchU32("attention.indexer.head_count", s.idx_heads);
    m.ArchU32("attention.indexer.key_length", s.idx_dim);
    m.ArchU32("attention.indexer.block_size", s.idx_block);
    m.ArchU32("attention.indexer.top_blocks", s.idx_keep);
  }
  if (!s.engram_layers.empty()) {
    std::vector<uint32_t> layers;
    for (int64_t l : s.engram_layers) layers.push_back(static_cast<uint32_t>(l));
    m.Arch("engram.layers", GgufValue::Array(layers));
    m.ArchU32("engram.max_ngram", s.engram_max_ngram);
    m.ArchU32("engram.heads", s.engram_heads);
    m.ArchU32("engram.head_dim", s.engram_head_dim);
    m.ArchU32("engram.conv_kernel", s.engram_conv_kernel);
    m.ArchU32("engram.conv_dilation", s.engram_dilation);
    m.Arch("engram.multipliers", GgufValue::Array(EngramMultipliers(s)));
    m.Arch("engram.table_sizes", GgufValue::Array(EngramTableSizes(s)));
  }

  m.General("tokenizer.ggml.model", GgufValue::String(tok.model));
  m.General("tokenizer.ggml.pre", GgufValue::String(tok.pre));
  m.General("tokenizer.ggml.tokens", GgufValue::StringArray(tok.tokens));
  m.General("tokenizer.ggml.token_type", GgufValue::Array(tok.token_types));
  m.General("tokenizer.ggml.merges", GgufValue::StringArray(tok.merges));
  if (tok.bos_id) m.General("tokenizer.ggml.bos_token_id", GgufValue::Scalar<uint32_t>(*tok.bos_id));
  if (tok.eos_id) m.General("tokenizer.ggml.eos_token_id", GgufValue::Scalar<uint32_t>(*tok.eos_id));
  if (tok.pad_id) {
    m.General("tokenizer.ggml.padding_token_id", GgufValue::Scalar<uint32_t>(*tok.pad_id));
  }
  m.General("tokenizer.ggml.add_bos_token", GgufValue::Scalar<bool>(false));
  m.General("tokenizer.chat_template", GgufValue::String(tok.chat_template));

  m.General("tandem.generator.seed", GgufValue::Scalar<uint64_t>(s.seed));
  m.General("tandem.generator.routing_zipf", GgufValue::Scalar<float>(static_cast<float>(s.zipf)));
  return m.Take();
}

}  // namespace tandem
