#include "common/tokenizer/small_tokenizer.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/chatml.h"
#include "common/tokenizer/qwen2_pretokenizer.h"

namespace tandem {
namespace {

struct TrainingWord {
  std::vector<int32_t> symbols;
  int64_t count;
};

// Replaces each non-overlapping occurrence of (left, right), leftmost first, by merged.
void ApplyMerge(int32_t left, int32_t right, int32_t merged, std::vector<int32_t>* symbols) {
  std::vector<int32_t>& s = *symbols;
  size_t out = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
      s[out++] = merged;
      ++i;
    } else {
      s[out++] = s[i];
    }
  }
  s.resize(out);
}

}  // namespace

absl::StatusOr<TokenizerSpec> MakeSmallByteLevelTokenizer(int vocab_size) {
  if (vocab_size < kSmallTokenizerMinVocab || vocab_size > kSmallTokenizerMaxVocab) {
    return absl::InvalidArgumentError(absl::StrFormat("vocab_size = %d is outside [%d, %d]",
                                                      vocab_size, kSmallTokenizerMinVocab,
                                                      kSmallTokenizerMaxVocab));
  }
  const int target_normal = vocab_size - 3;

  // Distinct pre-tokenized words with their counts; std::map keeps the order deterministic.
  std::map<std::string, int64_t> word_counts;
  for (std::string_view piece : PreTokenizeQwen2(kSmallTokenizerCorpus)) {
    ++word_counts[std::string(piece)];
  }
  std::vector<TrainingWord> words;
  for (const auto& [text, count] : word_counts) {
    TrainingWord word{{}, count};
    for (char c : text) word.symbols.push_back(static_cast<uint8_t>(c));
    words.push_back(std::move(word));
  }

  std::vector<std::string> token_bytes;
  for (int byte = 0; byte < 256; ++byte) token_bytes.push_back(std::string(1, char(byte)));
  absl::flat_hash_map<std::string, int32_t> id_of_bytes;
  for (int byte = 0; byte < 256; ++byte) id_of_bytes[token_bytes[byte]] = byte;
  std::vector<std::string> merges;

  while (static_cast<int>(token_bytes.size()) < target_normal) {
    absl::flat_hash_map<uint64_t, int64_t> pair_counts;
    for (const TrainingWord& word : words) {
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        const uint64_t key = (uint64_t{static_cast<uint32_t>(word.symbols[i])} << 32) |
                             static_cast<uint32_t>(word.symbols[i + 1]);
        pair_counts[key] += word.count;
      }
    }
    // The most frequent pair; ties go to the smallest key (left id, then right id), so the
    // choice does not depend on the hash map's iteration order.
    uint64_t best_key = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    }
    if (best_count == 0) break;  // every word is a single token
    const auto left = static_cast<int32_t>(best_key >> 32);
    const auto right = static_cast<int32_t>(best_key & 0xFFFFFFFFu);
    std::string joined = token_bytes[left] + token_bytes[right];
    // Two different pairs can spell the same bytes; they then share one token.
    auto [it, inserted] = id_of_bytes.try_emplace(joined, static_cast<int32_t>(token_bytes.size()));
    if (inserted) token_bytes.push_back(std::move(joined));
    merges.push_back(
        absl::StrCat(ByteLevelEncode(token_bytes[left]), " ", ByteLevelEncode(token_bytes[right])));
    for (TrainingWord& word : words) ApplyMerge(left, right, it->second, &word.symbols);
  }
  if (static_cast<int>(token_bytes.size()) < kSmallTokenizerMinVocab - 3) {
    return absl::InternalError(
        absl::StrFormat("the embedded corpus yields only %d tokens", token_bytes.size()));
  }

  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "qwen2";
  for (const std::string& bytes : token_bytes) {
    spec.tokens.push_back(ByteLevelEncode(bytes));
    spec.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  const auto endoftext_id = static_cast<int32_t>(spec.tokens.size());
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    spec.tokens.push_back(special);
    spec.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  while (static_cast<int>(spec.tokens.size()) < vocab_size) {
    spec.tokens.push_back(absl::StrCat("[PAD", spec.tokens.size(), "]"));
    spec.token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  spec.merges = std::move(merges);
  spec.bos_id = endoftext_id;
  spec.pad_id = endoftext_id;
  spec.eos_id = endoftext_id + 2;
  spec.chat_template = kChatMLTemplate;
  return spec;
}

}  // namespace tandem
