// ChatML prompt formatting as Qwen models expect it:
//   <|im_start|>{role}\n{content}<|im_end|>\n   for each message, then, when asked,
//   <|im_start|>assistant\n                     to open the model's turn.
// This is the plain ChatML form (what kChatMLTemplate renders). No default system message is
// inserted (Qwen2/2.5's own templates add "You are a helpful assistant."; Qwen3's do not), and a
// "tool" message is rendered with role "tool" as is (Qwen2.5/3 templates instead wrap tool results
// in a user turn with <tool_response> tags); callers needing those exact renderings build them.
// Encode the result with parse_special = true so the markers become their control tokens.
#ifndef TANDEM_COMMON_TOKENIZER_CHATML_H_
#define TANDEM_COMMON_TOKENIZER_CHATML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
};

// A Jinja chat template that renders exactly what FormatChatML() produces.
extern const char kChatMLTemplate[];

// Fails with InvalidArgument naming the message index and role for a role other than the four
// above. Content is copied verbatim (it is not escaped: content containing "<|im_end|>" will be
// parsed as that token if encoded with parse_special = true).
absl::StatusOr<std::string> FormatChatML(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_CHATML_H_
