#include "common/tokenizer/chatml.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

const char kChatMLTemplate[] =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

absl::StatusOr<std::string> FormatChatML(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
        message.role != "tool") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "messages[%d].role = \"%s\": expected system, user, assistant or tool", i, message.role));
    }
    absl::StrAppend(&out, "<|im_start|>", message.role, "\n", message.content, "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace tandem
