// The hyper-parameters of a Qwen3-Next Hugging Face checkpoint (config.json, as transformers'
// Qwen3NextConfig writes it), checked for what the converter and Tandem support.
#ifndef TANDEM_COMMON_CONVERT_HF_CONFIG_H_
#define TANDEM_COMMON_CONVERT_HF_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct Qwen3NextHfConfig {
  std::string architecture;  // architectures[0]: "Qwen3NextForCausalLM"
  int64_t vocab = 0;         // vocab_size
  int64_t h = 0;             // hidden_size
  int64_t ffn = 0;           // intermediate_size (written as feed_forward_length, unused)
  int64_t layers = 0;        // num_hidden_layers
  int64_t nh = 0, kvh = 0, hd = 0;
  int64_t rot = 0;           // hd · partial_rotary_factor
  double theta = 10000.0;
  double eps = 1e-6;
  int64_t context_length = 0;
  std::vector<bool> recurrent;  // per main layer: true = linear_attention (GDN)
  bool has_layer_types = false;  // layer_types given (else derived from full_attention_interval)
  int64_t full_attention_interval = 4;
  int64_t nk = 0, nv = 0, dk = 0, dv = 0, kk = 0;  // linear_* (GDN)
  int64_t E = 0, K = 0, I = 0, Ish = 0;            // experts
  bool tied = false;         // tie_word_embeddings
  std::optional<int64_t> bos_id, eos_id, pad_id;   // config.json's *_token_id (fallbacks)
  std::string name;          // directory name (general.name)

  int64_t c_dim() const { return 2 * nk * dk + nv * dv; }
};

// Reads DIR/config.json. Errors name the field: unknown architecture, missing or bad key, or a
// feature Tandem does not implement (dense MLP layers, attention bias, unnormalized top-k, ...).
absl::StatusOr<Qwen3NextHfConfig> ReadQwen3NextHfConfig(const std::string& dir);

}  // namespace tandem

#endif  // TANDEM_COMMON_CONVERT_HF_CONFIG_H_
