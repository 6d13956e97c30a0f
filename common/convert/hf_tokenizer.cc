#include "common/convert/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::StatusOr<Json> ReadJson(const std::string& path, bool required) {
  std::ifstream in(path);
  if (!in) {
    if (!required) return Json();
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": does not parse as a JSON object"));
  }
  return j;
}

// tokenizer_config.json's "bos_token" etc.: a string, {"content": "..."}, or null.
std::optional<std::string> SpecialContent(const Json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return std::nullopt;
  const Json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<TokenizerSpec> ReadHfTokenizer(const std::string& dir, const Qwen3NextHfConfig& config) {
  namespace fs = std::filesystem;
  const std::string tok_path = (fs::path(dir) / "tokenizer.json").string();
  absl::StatusOr<Json> tok = ReadJson(tok_path, true);
  if (!tok.ok()) return tok.status();
  absl::StatusOr<Json> cfg = ReadJson((fs::path(dir) / "tokenizer_config.json").string(), false);
  if (!cfg.ok()) return cfg.status();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(tok_path, ": ", what));
  };
  if (!tok->contains("model") || !(*tok)["model"].is_object()) return bad("no 'model' object");
  const Json& model = (*tok)["model"];
  if (model.value("type", "BPE") != "BPE") {
    return bad(absl::StrCat("model.type is '", model.value("type", ""), "'; expected BPE"));
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) return bad("no 'model.vocab' object");

  const int64_t V = config.vocab;
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "qwen2";
  spec.tokens.assign(V, std::string());
  spec.token_types.assign(V, static_cast<int32_t>(TokenType::kUnused));
  std::vector<bool> defined(V, false);
  std::map<std::string, int32_t> by_text;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return bad(absl::StrCat("model.vocab['", it.key(), "'] is not an id"));
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= V) {
      return bad(absl::StrCat("model.vocab['", it.key(), "'] = ", id, " is outside the model's ",
                              "vocab_size ", V));
    }
    spec.tokens[id] = it.key();
    spec.token_types[id] = static_cast<int32_t>(TokenType::kNormal);
    defined[id] = true;
    by_text[it.key()] = static_cast<int32_t>(id);
  }
  if (tok->contains("added_tokens") && (*tok)["added_tokens"].is_array()) {
    size_t i = 0;
    for (const Json& a : (*tok)["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return bad(absl::StrCat("added_tokens[", i, "] needs an integer id and a string content"));
      }
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= V) {
        return bad(absl::StrCat("added_tokens[", i, "].id = ", id, " is outside vocab_size ", V));
      }
      const std::string content = a["content"].get<std::string>();
      const bool special = a.value("special", false) ||
                           (content.size() >= 4 && content.rfind("<|", 0) == 0 &&
                            content.compare(content.size() - 2, 2, "|>") == 0);
      spec.tokens[id] = content;
      spec.token_types[id] = static_cast<int32_t>(special ? TokenType::kControl : TokenType::kUserDefined);
      defined[id] = true;
      by_text[content] = static_cast<int32_t>(id);
      ++i;
    }
  }
  for (int64_t id = 0; id < V; ++id) {
    if (!defined[id]) spec.tokens[id] = absl::StrCat("[PAD", id, "]");
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    size_t i = 0;
    for (const Json& m : model["merges"]) {
      // Older tokenizers write "A B"; newer ones ["A", "B"].
      if (m.is_string()) {
        spec.merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        spec.merges.push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
      } else {
        return bad(absl::StrCat("model.merges[", i, "] is neither \"A B\" nor [\"A\", \"B\"]"));
      }
      ++i;
    }
  }

  auto special_id = [&](const char* key, std::optional<int64_t> fallback,
                        std::optional<int32_t>* out) -> absl::Status {
    if (std::optional<std::string> content = SpecialContent(*cfg, key)) {
      auto it = by_text.find(*content);
      if (it == by_text.end()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", key, " '", *content,
                                                       "' is not in the vocabulary"));
      }
      *out = it->second;
    } else if (fallback && *fallback >= 0 && *fallback < V) {
      *out = static_cast<int32_t>(*fallback);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = special_id("bos_token", config.bos_id, &spec.bos_id); !s.ok()) return s;
  if (absl::Status s = special_id("eos_token", config.eos_id, &spec.eos_id); !s.ok()) return s;
  if (absl::Status s = special_id("pad_token", config.pad_id, &spec.pad_id); !s.ok()) return s;

  if (cfg->is_object() && cfg->contains("chat_template") && (*cfg)["chat_template"].is_string()) {
    spec.chat_template = (*cfg)["chat_template"].get<std::string>();
  } else if (std::ifstream jinja(fs::path(dir) / "chat_template.jinja"); jinja) {
    std::stringstream text;
    text << jinja.rdbuf();
    spec.chat_template = text.str();
  }
  return spec;
}

}  // namespace tandem
