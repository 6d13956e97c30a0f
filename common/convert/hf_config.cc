#include "common/convert/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

class Fields {
 public:
  Fields(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

  int64_t Int(const char* key, int64_t min, std::optional<int64_t> fallback = std::nullopt) {
    if (!j_.contains(key) || j_[key].is_null()) {
      if (fallback) return *fallback;
      problems_.push_back(absl::StrCat("'", key, "' is missing"));
      return 0;
    }
    if (!j_[key].is_number_integer() || j_[key].get<int64_t>() < min) {
      problems_.push_back(absl::StrCat("'", key, "' = ", j_[key].dump(), " is not an integer >= ", min));
      return 0;
    }
    return j_[key].get<int64_t>();
  }
  double Float(const Json& obj, const char* key, double fallback) {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_number()) {
      problems_.push_back(absl::StrCat("'", key, "' = ", obj[key].dump(), " is not a number"));
      return fallback;
    }
    return obj[key].get<double>();
  }
  void Require(bool ok, std::string message) {
    if (!ok) problems_.push_back(std::move(message));
  }
  absl::Status Status() const {
    if (problems_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(source_, ": not a Qwen3-Next config the converter ",
                                                   "understands:\n  ", absl::StrJoin(problems_, "\n  ")));
  }

 private:
  const Json& j_;
  std::string source_;
  std::vector<std::string> problems_;
};

std::optional<int64_t> OptionalId(const Json& j, const char* key) {
  if (j.contains(key) && j[key].is_number_integer()) return j[key].get<int64_t>();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<Qwen3NextHfConfig> ReadQwen3NextHfConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open (is ", dir, " a checkpoint?)"));
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": does not parse as a JSON object"));
  }
  Qwen3NextHfConfig c;
  std::string model_type = j.value("model_type", "");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    c.architecture = j["architectures"][0].get<std::string>();
  }
  if (c.architecture != "Qwen3NextForCausalLM" && model_type != "qwen3_next") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": unknown architecture (architectures[0] = '", c.architecture, "', model_type = '",
        model_type, "'); the converter reads Qwen3NextForCausalLM / qwen3_next checkpoints"));
  }
  Fields f(j, path);
  c.vocab = f.Int("vocab_size", 1);
  c.h = f.Int("hidden_size", 1);
  c.ffn = f.Int("intermediate_size", 0, 0);
  c.layers = f.Int("num_hidden_layers", 1);
  c.nh = f.Int("num_attention_heads", 1);
  c.kvh = f.Int("num_key_value_heads", 1);
  c.hd = f.Int("head_dim", 1, c.nh > 0 ? std::optional<int64_t>(c.h / c.nh) : std::nullopt);
  c.context_length = f.Int("max_position_embeddings", 0, 0);
  c.eps = f.Float(j, "rms_norm_eps", 1e-6);
  // transformers 5 keeps RoPE settings in rope_parameters; 4.x at the top level.
  const Json empty = Json::object();
  const Json& rope = j.contains("rope_parameters") && j["rope_parameters"].is_object()
                         ? j["rope_parameters"]
                         : (j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"] : empty);
  c.theta = f.Float(rope, "rope_theta", f.Float(j, "rope_theta", 10000.0));
  const double partial = f.Float(rope, "partial_rotary_factor", f.Float(j, "partial_rotary_factor", 0.25));
  c.rot = static_cast<int64_t>(std::llround(c.hd * partial));
  if (rope.contains("rope_type") && rope["rope_type"].is_string()) {
    const std::string type = rope["rope_type"].get<std::string>();
    f.Require(type == "default", absl::StrCat("rope_type '", type, "': only plain RoPE is supported"));
  }
  c.nk = f.Int("linear_num_key_heads", 1);
  c.nv = f.Int("linear_num_value_heads", 1);
  c.dk = f.Int("linear_key_head_dim", 1);
  c.dv = f.Int("linear_value_head_dim", 1);
  c.kk = f.Int("linear_conv_kernel_dim", 2);
  c.E = f.Int("num_experts", 1);
  c.K = f.Int("num_experts_per_tok", 1);
  c.I = f.Int("moe_intermediate_size", 1);
  c.Ish = f.Int("shared_expert_intermediate_size", 0, 0);
  c.tied = j.value("tie_word_embeddings", false);
  c.full_attention_interval = f.Int("full_attention_interval", 1, 4);
  c.bos_id = OptionalId(j, "bos_token_id");
  c.eos_id = OptionalId(j, "eos_token_id");
  c.pad_id = OptionalId(j, "pad_token_id");
  c.name = fs::path(dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = fs::path(dir).lexically_normal().parent_path().filename().string();

  c.recurrent.assign(c.layers, false);
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    c.has_layer_types = true;
    const Json& lt = j["layer_types"];
    f.Require(static_cast<int64_t>(lt.size()) == c.layers,
              absl::StrCat("'layer_types' has ", lt.size(), " entries, num_hidden_layers is ", c.layers));
    for (size_t i = 0; i < lt.size() && static_cast<int64_t>(i) < c.layers; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      f.Require(t == "linear_attention" || t == "full_attention",
                absl::StrCat("'layer_types'[", i, "] = ", lt[i].dump(),
                             " is neither linear_attention nor full_attention"));
      c.recurrent[i] = t == "linear_attention";
    }
  } else if (c.full_attention_interval > 0) {
    for (int64_t i = 0; i < c.layers; ++i) c.recurrent[i] = (i + 1) % c.full_attention_interval != 0;
  }

  // Features of the Qwen3-Next family that Tandem's engine does not implement.
  const std::string act = j.value("hidden_act", "silu");
  f.Require(act == "silu", absl::StrCat("'hidden_act' = '", act, "': only silu is supported"));
  f.Require(!j.value("attention_bias", false), "'attention_bias' = true: attention biases are not supported");
  f.Require(j.value("norm_topk_prob", true), "'norm_topk_prob' = false: Tandem renormalizes the top-k weights");
  f.Require(f.Int("decoder_sparse_step", 1, 1) == 1, "'decoder_sparse_step' != 1: dense MLP layers are not supported");
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
    f.Require(j["mlp_only_layers"].empty(), "'mlp_only_layers' is not empty: dense MLP layers are not supported");
  }
  f.Require(c.dk == c.dv, absl::StrCat("linear_key_head_dim = ", c.dk, " differs from linear_value_head_dim = ",
                                       c.dv, " (GGUF has one ssm.state_size)"));
  f.Require(c.nk == 0 || c.nv % c.nk == 0, "linear_num_value_heads is not a multiple of linear_num_key_heads");
  f.Require(c.kvh == 0 || c.nh % c.kvh == 0, "num_attention_heads is not a multiple of num_key_value_heads");
  f.Require(c.K <= c.E, "num_experts_per_tok exceeds num_experts");
  f.Require(c.rot % 2 == 0 && c.rot <= c.hd, absl::StrCat("rotary dims ", c.rot, " must be even and <= head_dim"));
  if (absl::Status s = f.Status(); !s.ok()) return s;
  return c;
}

}  // namespace tandem
