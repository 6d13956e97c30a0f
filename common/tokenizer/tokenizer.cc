#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/qwen2_pretokenizer.h"
#include "common/tokenizer/utf8.h"

namespace tandem {
namespace {

bool IsBpeType(TokenType type) { return type == TokenType::kNormal || type == TokenType::kByte; }

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

absl::Status CheckOptionalId(const char* field, const std::optional<int32_t>& id, size_t vocab) {
  if (id.has_value() && (*id < 0 || static_cast<size_t>(*id) >= vocab)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s = %d is outside the vocabulary [0, %d)", field, *id, vocab));
  }
  return absl::OkStatus();
}

absl::string_view AbslView(std::string_view view) { return {view.data(), view.size()}; }

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Create(TokenizerSpec spec) {
  if (spec.model != "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.model = \"", spec.model,
                     "\": only \"gpt2\" (byte-level BPE) is supported"));
  }
  if (spec.pre != "qwen2" && spec.pre != "deepseek-r1-qwen") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.pre = \"", spec.pre,
        "\": only the Qwen2 pre-tokenizer (\"qwen2\", \"deepseek-r1-qwen\") is supported"));
  }
  const size_t vocab = spec.tokens.size();
  if (vocab == 0 || vocab > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer.ggml.tokens has %d entries", vocab));
  }
  if (!spec.token_types.empty() && spec.token_types.size() != vocab) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tokenizer.ggml.token_type has %d entries but tokenizer.ggml.tokens has %d",
                        spec.token_types.size(), vocab));
  }
  for (const auto& [field, id] : {std::pair{"tokenizer.ggml.bos_token_id", spec.bos_id},
                                  std::pair{"tokenizer.ggml.eos_token_id", spec.eos_id},
                                  std::pair{"tokenizer.ggml.padding_token_id", spec.pad_id}}) {
    if (absl::Status status = CheckOptionalId(field, id, vocab); !status.ok()) return status;
  }

  Tokenizer tok;
  tok.bytes_.resize(vocab);
  tok.types_.resize(vocab);
  for (size_t id = 0; id < vocab; ++id) {
    const int32_t raw_type = spec.token_types.empty() ? 1 : spec.token_types[id];
    if (raw_type < 1 || raw_type > 6) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer.ggml.token_type[%d] = %d is not a token type (1..6)", id, raw_type));
    }
    const TokenType type = static_cast<TokenType>(raw_type);
    std::string& text = spec.tokens[id];
    tok.types_[id] = type;
    if (text.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("tokenizer.ggml.tokens[%d] is empty", id));
    }
    if (IsBpeType(type)) {
      absl::StatusOr<std::string> bytes = ByteLevelDecode(text);
      if (!bytes.ok()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tokenizer.ggml.tokens[%d] (a normal token): %s", id, bytes.status().message()));
      }
      tok.bytes_[id] = *std::move(bytes);
      auto [it, inserted] = tok.bpe_ids_.try_emplace(std::move(text), static_cast<int32_t>(id));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tokenizer.ggml.tokens[%d] repeats the text of tokens[%d]", id, it->second));
      }
    } else {
      tok.bytes_[id] = text;
      if (type == TokenType::kUnused) continue;  // never matched; duplicates are harmless
      auto [it, inserted] = tok.other_ids_.try_emplace(std::move(text), static_cast<int32_t>(id));
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrFormat("tokenizer.ggml.tokens[%d] repeats the text of added token tokens[%d]",
                            id, it->second));
      }
      const auto first_byte = static_cast<uint8_t>(tok.bytes_[id][0]);
      tok.added_by_first_byte_[first_byte].push_back(static_cast<int32_t>(id));
    }
  }
  for (std::vector<int32_t>& bucket : tok.added_by_first_byte_) {
    // Longest first so that the first match is the longest; ties by id for determinism.
    std::sort(bucket.begin(), bucket.end(), [&tok](int32_t a, int32_t b) {
      if (tok.bytes_[a].size() != tok.bytes_[b].size()) {
        return tok.bytes_[a].size() > tok.bytes_[b].size();
      }
      return a < b;
    });
  }

  for (int byte = 0; byte < 256; ++byte) {
    std::string mapped;
    AppendUtf8(ByteToMappedCodePoint(static_cast<uint8_t>(byte)), &mapped);
    auto it = tok.bpe_ids_.find(mapped);
    if (it == tok.bpe_ids_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer.ggml.tokens has no normal token for byte 0x%02X (spelled \"%s\")", byte,
          mapped));
    }
    tok.byte_ids_[byte] = it->second;
  }

  tok.merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& merge = spec.merges[rank];
    const size_t space = merge.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer.ggml.merges[%d] = \"%s\" is not two tokens separated by one space", rank,
          merge));
    }
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    const std::string joined = left + right;
    int32_t ids[3];
    const std::string* parts[3] = {&left, &right, &joined};
    const char* roles[3] = {"left part", "right part", "merged result"};
    for (int k = 0; k < 3; ++k) {
      auto it = tok.bpe_ids_.find(*parts[k]);
      if (it == tok.bpe_ids_.end()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("tokenizer.ggml.merges[%d] = \"%s\": %s \"%s\" is not a normal token",
                            rank, merge, roles[k], *parts[k]));
      }
      ids[k] = it->second;
    }
    // A repeated pair keeps its first (lowest) rank.
    tok.merges_.try_emplace(PairKey(ids[0], ids[1]), Merge{static_cast<int32_t>(rank), ids[2]});
  }

  tok.bos_id_ = spec.bos_id;
  tok.eos_id_ = spec.eos_id;
  tok.pad_id_ = spec.pad_id;
  tok.chat_template_ = std::move(spec.chat_template);
  return tok;
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view text) const {
  if (auto it = bpe_ids_.find(AbslView(text)); it != bpe_ids_.end()) return it->second;
  if (auto it = other_ids_.find(AbslView(text)); it != other_ids_.end()) return it->second;
  return std::nullopt;
}

size_t Tokenizer::MatchAddedToken(std::string_view text, size_t offset, bool parse_special,
                                  int32_t* id) const {
  for (int32_t candidate : added_by_first_byte_[static_cast<uint8_t>(text[offset])]) {
    if (!parse_special && types_[candidate] != TokenType::kUserDefined) continue;
    const std::string& literal = bytes_[candidate];
    if (text.compare(offset, literal.size(), literal) == 0) {
      *id = candidate;
      return literal.size();
    }
  }
  return 0;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t ordinary_start = 0;
  for (size_t offset = 0; offset < text.size();) {
    int32_t added_id;
    const size_t length = MatchAddedToken(text, offset, parse_special, &added_id);
    if (length == 0) {
      ++offset;
      continue;
    }
    EncodeOrdinary(text.substr(ordinary_start, offset - ordinary_start), &ids);
    ids.push_back(added_id);
    offset += length;
    ordinary_start = offset;
  }
  EncodeOrdinary(text.substr(ordinary_start), &ids);
  return ids;
}

void Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  for (std::string_view piece : PreTokenizeQwen2(text)) EncodePiece(piece, ids);
}

void Tokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const {
  // Symbols start as single bytes in a doubly linked list over positions; the heap holds
  // candidate pairs ordered by (merge rank, left position), so the lowest rank merges first and
  // equal ranks merge leftmost first. Entries made stale by an earlier merge are skipped: a
  // symbol's id only ever changes to a longer token, so comparing ids detects staleness.
  struct Symbol {
    int32_t id;    // -1 once merged into its left neighbour
    int32_t prev;  // -1 at the start
    int32_t next;  // -1 at the end
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // position of the left symbol
    int32_t left_id;
    int32_t right_id;
    int32_t result_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  if (n == 0) return;
  if (n == 1) {
    ids->push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (left < 0 || right < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.result_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.left];
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = c.result_id;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!IsValidId(ids[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token id %d at index %d is outside the vocabulary [0, %d)", ids[i], i, vocab_size()));
    }
    out += bytes_[ids[i]];
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::DecodeToText(std::span<const int32_t> ids) const {
  absl::StatusOr<std::string> bytes = Decode(ids);
  if (!bytes.ok()) return bytes.status();
  return SanitizeUtf8(*bytes);
}

}  // namespace tandem
