// A tiny synthetic Qwen3-Next Hugging Face checkpoint, written by hand from the formats
// (config.json, tokenizer.json, tokenizer_config.json, sharded safetensors with an index), for the
// converter tests. The tensors are kept in memory (as the f32 values the files hold, bf16 ones
// already rounded) so tests can compute what each GGUF tensor must contain.
#ifndef TANDEM_TESTS_CONVERT_HF_FIXTURE_H_
#define TANDEM_TESTS_CONVERT_HF_FIXTURE_H_

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // exactly representable in `dtype`
  std::string dtype;          // "F32" or "BF16"
  int shard = 0;
};

struct HfFixture {
  // Dimensions (Qwen3NextConfig names in comments).
  int64_t V = 300, h = 32, layers = 4, nh = 4, kvh = 2, hd = 16;
  int64_t nk = 2, nv = 4, dk = 8, kk = 4, E = 8, K = 2, I = 16, Ish = 16;
  bool mtp = true;
  bool fused_experts = false;  // transformers 5's gate_up_proj / down_proj
  std::string architecture = "Qwen3NextForCausalLM";
  std::map<std::string, HfTensor> tensors;

  int64_t r() const { return nv / nk; }
  int64_t c_dim() const { return 2 * nk * dk + nv * dk; }
  bool recurrent(int64_t i) const { return (i + 1) % 4 != 0; }

  void Add(const std::string& name, std::vector<int64_t> shape, std::mt19937& rng, float scale,
           bool bf16, float offset = 0.0f) {
    HfTensor t;
    t.shape = std::move(shape);
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::uniform_real_distribution<float> u(-scale, scale);
    t.values.resize(n);
    for (float& v : t.values) {
      v = offset + u(rng);
      if (bf16) {  // keep the top 16 bits: exactly a bf16 value
        uint32_t b;
        std::memcpy(&b, &v, 4);
        b &= 0xFFFF0000u;
        std::memcpy(&v, &b, 4);
      }
    }
    t.dtype = bf16 ? "BF16" : "F32";
    t.shard = static_cast<int>(tensors.size() % 2);
    tensors[name] = std::move(t);
  }

  void AddLayer(const std::string& s, bool recurrent_layer, std::mt19937& rng) {
    Add(s + "input_layernorm.weight", {h}, rng, 0.1f, false);
    Add(s + "post_attention_layernorm.weight", {h}, rng, 0.1f, false);
    if (recurrent_layer) {
      Add(s + "linear_attn.in_proj_qkvz.weight", {nk * (2 * dk + 2 * r() * dk), h}, rng, 0.2f, true);
      Add(s + "linear_attn.in_proj_ba.weight", {2 * nv, h}, rng, 0.2f, false);
      Add(s + "linear_attn.conv1d.weight", {c_dim(), 1, kk}, rng, 0.5f, false);
      Add(s + "linear_attn.A_log", {nv}, rng, 0.5f, false);
      Add(s + "linear_attn.dt_bias", {nv}, rng, 0.5f, false);
      Add(s + "linear_attn.norm.weight", {dk}, rng, 0.1f, false, 1.0f);
      Add(s + "linear_attn.out_proj.weight", {h, nv * dk}, rng, 0.2f, false);
    } else {
      Add(s + "self_attn.q_proj.weight", {nh * 2 * hd, h}, rng, 0.2f, false);
      Add(s + "self_attn.k_proj.weight", {kvh * hd, h}, rng, 0.2f, true);
      Add(s + "self_attn.v_proj.weight", {kvh * hd, h}, rng, 0.2f, false);
      Add(s + "self_attn.o_proj.weight", {h, nh * hd}, rng, 0.2f, false);
      Add(s + "self_attn.q_norm.weight", {hd}, rng, 0.1f, false);
      Add(s + "self_attn.k_norm.weight", {hd}, rng, 0.1f, false);
    }
    Add(s + "mlp.gate.weight", {E, h}, rng, 0.3f, false);
    if (fused_experts) {
      Add(s + "mlp.experts.gate_up_proj", {E, 2 * I, h}, rng, 0.2f, true);
      Add(s + "mlp.experts.down_proj", {E, h, I}, rng, 0.2f, false);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string p = absl::StrCat(s, "mlp.experts.", e, ".");
        Add(p + "gate_proj.weight", {I, h}, rng, 0.2f, true);
        Add(p + "up_proj.weight", {I, h}, rng, 0.2f, false);
        Add(p + "down_proj.weight", {h, I}, rng, 0.2f, e % 2 == 0);
      }
    }
    Add(s + "mlp.shared_expert_gate.weight", {1, h}, rng, 0.3f, false);
    Add(s + "mlp.shared_expert.gate_proj.weight", {Ish, h}, rng, 0.2f, false);
    Add(s + "mlp.shared_expert.up_proj.weight", {Ish, h}, rng, 0.2f, true);
    Add(s + "mlp.shared_expert.down_proj.weight", {h, Ish}, rng, 0.2f, false);
  }

  void Build(uint32_t seed = 7) {
    std::mt19937 rng(seed);
    tensors.clear();
    Add("model.embed_tokens.weight", {V, h}, rng, 0.5f, false);
    Add("model.norm.weight", {h}, rng, 0.1f, false);
    Add("lm_head.weight", {V, h}, rng, 0.3f, true);
    for (int64_t i = 0; i < layers; ++i) AddLayer(absl::StrCat("model.layers.", i, "."), recurrent(i), rng);
    if (mtp) {
      AddLayer("mtp.layers.0.", false, rng);
      Add("mtp.fc.weight", {h, 2 * h}, rng, 0.2f, false);
      Add("mtp.pre_fc_norm_embedding.weight", {h}, rng, 0.1f, false);
      Add("mtp.pre_fc_norm_hidden.weight", {h}, rng, 0.1f, false);
      Add("mtp.norm.weight", {h}, rng, 0.1f, false);
    }
  }

  nlohmann::json Config() const {
    nlohmann::json c;
    c["architectures"] = {architecture};
    c["model_type"] = "qwen3_next";
    c["vocab_size"] = V;
    c["hidden_size"] = h;
    c["intermediate_size"] = 64;
    c["num_hidden_layers"] = layers;
    c["num_attention_heads"] = nh;
    c["num_key_value_heads"] = kvh;
    c["head_dim"] = hd;
    c["max_position_embeddings"] = 4096;
    c["rms_norm_eps"] = 1e-6;
    c["rope_theta"] = 10000.0;
    c["partial_rotary_factor"] = 0.25;
    c["linear_num_key_heads"] = nk;
    c["linear_num_value_heads"] = nv;
    c["linear_key_head_dim"] = dk;
    c["linear_value_head_dim"] = dk;
    c["linear_conv_kernel_dim"] = kk;
    c["num_experts"] = E;
    c["num_experts_per_tok"] = K;
    c["moe_intermediate_size"] = I;
    c["shared_expert_intermediate_size"] = Ish;
    c["norm_topk_prob"] = true;
    c["hidden_act"] = "silu";
    c["tie_word_embeddings"] = false;
    c["full_attention_interval"] = 4;
    std::vector<std::string> types;
    for (int64_t i = 0; i < layers; ++i) types.push_back(recurrent(i) ? "linear_attention" : "full_attention");
    c["layer_types"] = types;
    c["bos_token_id"] = 290;
    c["eos_token_id"] = 291;
    return c;
  }

  // 256 byte tokens, 20 merges of byte pairs, two added tokens at 290, 291 (ids 276..289 and
  // 292..299 are undefined: "[PAD<id>]" rows).
  nlohmann::json TokenizerJson() const {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) {
      vocab[ByteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
    }
    std::vector<std::vector<std::string>> merges;
    const char* pairs[20][2] = {{"t", "h"}, {"h", "e"}, {"i", "n"}, {"e", "r"}, {"a", "n"},
                                {"o", "n"}, {"r", "e"}, {"e", "d"}, {"n", "d"}, {"h", "a"},
                                {"a", "t"}, {"e", "n"}, {"o", "u"}, {"t", "o"}, {"i", "s"},
                                {"o", "r"}, {"e", "s"}, {"i", "t"}, {"a", "r"}, {"s", "t"}};
    for (int i = 0; i < 20; ++i) {
      vocab[std::string(pairs[i][0]) + pairs[i][1]] = 256 + i;
      merges.push_back({pairs[i][0], pairs[i][1]});
    }
    nlohmann::json t;
    t["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
    t["added_tokens"] = {{{"id", 290}, {"content", "<|endoftext|>"}, {"special", true}},
                         {{"id", 291}, {"content", "<|im_end|>"}, {"special", true}}};
    return t;
  }

  static void WriteText(const std::filesystem::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  }

  // Writes the checkpoint; shards = 1 writes model.safetensors, 2 two shards and an index.
  void Write(const std::filesystem::path& dir, int shards = 2) const {
    std::filesystem::create_directories(dir);
    WriteText(dir / "config.json", Config().dump(2));
    WriteText(dir / "tokenizer.json", TokenizerJson().dump());
    WriteText(dir / "tokenizer_config.json",
              nlohmann::json{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"},
                             {"bos_token", nullptr}, {"chat_template", "{{ messages }}"}}.dump());
    nlohmann::json index;
    for (int s = 0; s < shards; ++s) {
      const std::string file = shards == 1 ? "model.safetensors"
                                           : absl::StrCat("model-0000", s + 1, "-of-0000", shards, ".safetensors");
      nlohmann::json header = nlohmann::json::object();
      header["__metadata__"] = {{"format", "pt"}};
      std::string data;
      for (const auto& [name, t] : tensors) {
        if (shards > 1 && t.shard != s) continue;
        const size_t begin = data.size();
        for (float v : t.values) {
          uint32_t b;
          std::memcpy(&b, &v, 4);
          if (t.dtype == "BF16") {
            const uint16_t hi = static_cast<uint16_t>(b >> 16);
            data.append(reinterpret_cast<const char*>(&hi), 2);
          } else {
            data.append(reinterpret_cast<const char*>(&b), 4);
          }
        }
        header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
        index["weight_map"][name] = file;
      }
      const std::string h = header.dump();
      const uint64_t n = h.size();
      std::string bytes(reinterpret_cast<const char*>(&n), 8);
      WriteText(dir / file, bytes + h + data);
    }
    if (shards > 1) WriteText(dir / "model.safetensors.index.json", index.dump());
  }
};

}  // namespace tandem

#endif  // TANDEM_TESTS_CONVERT_HF_FIXTURE_H_
