// The tokenizer of Qwen-family models: GPT-2 style byte-level BPE with the Qwen2 pre-tokenizer,
// plus literal matching of added tokens (<|im_start|>, <|im_end|>, <tool_call>, ...).
//
// Built from plain data (TokenizerSpec), which the GGUF loader fills from the tokenizer.ggml.*
// keys. A Tokenizer is immutable after Create() and safe to use from many threads at once.
//
// Token kinds (tokenizer.ggml.token_type):
//   normal (1), byte (6): BPE tokens; their text is in the GPT-2 byte-level alphabet
//     (byte_level.h) and their bytes are that text mapped back.
//   control (3), unknown (2): special tokens; their text is their literal bytes. Encode() matches
//     them in the input only when parse_special is true.
//   user-defined (4): added tokens; literal bytes, always matched by Encode() (as llama.cpp does
//     and as Hugging Face does for non-special added tokens).
//   unused (5): literal bytes, never produced by Encode() (e.g. "[PAD151700]" padding rows).
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem {

enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer as stored in a GGUF file (key names in the comments).
struct TokenizerSpec {
  std::string model;                 // tokenizer.ggml.model; must be "gpt2"
  std::string pre;                   // tokenizer.ggml.pre; "qwen2" (or alias "deepseek-r1-qwen")
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens; id = index
  std::vector<std::string> merges;   // tokenizer.ggml.merges; "A B", rank = index
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type; empty means all normal
  std::optional<int32_t> bos_id;     // tokenizer.ggml.bos_token_id
  std::optional<int32_t> eos_id;     // tokenizer.ggml.eos_token_id
  std::optional<int32_t> pad_id;     // tokenizer.ggml.padding_token_id
  std::string chat_template;         // tokenizer.chat_template (a Jinja template; kept as text)
};

class Tokenizer {
 public:
  // Validates `spec` and builds the lookup tables. Fails with InvalidArgument naming the bad field
  // (and index) if: model is not "gpt2"; pre is not a Qwen2 name; token_types has the wrong length
  // or a value outside 1..6; a normal/byte token is empty or not in the byte-level alphabet; two
  // normal/byte tokens (or two matchable added tokens) share a text; an added token is empty;
  // some byte has no single-character token; a merge is not "A B" with A, B and AB all normal/byte
  // tokens; or bos/eos/pad is out of range.
  static absl::StatusOr<Tokenizer> Create(TokenizerSpec spec);

  // Token ids for the bytes of `text` (any bytes; invalid UTF-8 is encoded byte-wise too, so
  // Decode(Encode(text)) == text always). Added tokens are matched first, leftmost-longest; the
  // text between them is pre-tokenized (qwen2_pretokenizer.h) and each piece BPE-encoded with
  // the lowest-rank merge applied first (leftmost on ties). No BOS/EOS is added.
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // The exact bytes of the tokens, concatenated (control tokens included). Fails with
  // InvalidArgument naming the index of the first id outside [0, vocab_size()). The bytes need not
  // be valid UTF-8; see DecodeToText().
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const;
  // Decode() followed by SanitizeUtf8() (utf8.h): displayable text, U+FFFD for invalid bytes.
  absl::StatusOr<std::string> DecodeToText(std::span<const int32_t> ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  bool IsValidId(int32_t id) const { return id >= 0 && id < vocab_size(); }
  // Preconditions for the two below: IsValidId(id).
  // The bytes the token stands for.
  const std::string& TokenBytes(int32_t id) const { return bytes_[id]; }
  TokenType token_type(int32_t id) const { return types_[id]; }
  // Control and unknown tokens: the ones a chat front end usually hides.
  bool IsControl(int32_t id) const {
    return types_[id] == TokenType::kControl || types_[id] == TokenType::kUnknown;
  }
  // The id of the token whose vocabulary text is `text` (mapped form for normal/byte tokens,
  // literal for the others), if any.
  std::optional<int32_t> FindToken(std::string_view text) const;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  const std::string& chat_template() const { return chat_template_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result_id;
  };

  Tokenizer() = default;
  // Appends the tokens of a text fragment that holds no added token.
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const;
  // Appends the BPE tokens of one pre-tokenized piece.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const;
  // Length of the longest added token matching at text[offset], and its id; 0 if none.
  size_t MatchAddedToken(std::string_view text, size_t offset, bool parse_special,
                         int32_t* id) const;

  std::vector<std::string> bytes_;                       // per id
  std::vector<TokenType> types_;                         // per id
  absl::flat_hash_map<std::string, int32_t> bpe_ids_;    // mapped text of normal/byte tokens
  absl::flat_hash_map<std::string, int32_t> other_ids_;  // literal text of the other tokens
  std::array<int32_t, 256> byte_ids_{};                  // the token of each single byte
  absl::flat_hash_map<uint64_t, Merge> merges_;          // key: left id << 32 | right id
  // Matchable added tokens (control, unknown, user-defined) by first byte, longest first.
  std::array<std::vector<int32_t>, 256> added_by_first_byte_;
  std::optional<int32_t> bos_id_, eos_id_, pad_id_;
  std::string chat_template_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
