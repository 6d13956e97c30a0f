#include "common/tokenizer/chatml.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/tokenizer/small_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(ChatMLTest, GoldenConversation) {
  const std::vector<ChatMessage> messages = {
      {"system", "You are a helpful assistant."},
      {"user", "What is 2+2?"},
      {"assistant", "4"},
      {"tool", "{\"result\": 4}"},
  };
  absl::StatusOr<std::string> prompt = FormatChatML(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>tool\n{\"result\": 4}<|im_end|>\n"
            "<|im_start|>assistant\n");
  prompt = FormatChatML({{"user", "hi"}}, /*add_generation_prompt=*/false);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt, "<|im_start|>user\nhi<|im_end|>\n");
  prompt = FormatChatML({}, /*add_generation_prompt=*/true);
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt, "<|im_start|>assistant\n");
}

TEST(ChatMLTest, UnknownRoleIsRejectedWithIndexAndRole) {
  absl::StatusOr<std::string> prompt =
      FormatChatML({{"user", "a"}, {"assistant", "b"}, {"robot", "c"}}, true);
  ASSERT_FALSE(prompt.ok());
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(prompt.status().message()), HasSubstr("messages[2].role = \"robot\""));
  EXPECT_FALSE(FormatChatML({{"User", "case matters"}}, false).ok());
}

TEST(ChatMLTest, MarkersEncodeToControlTokens) {
  absl::StatusOr<TokenizerSpec> spec = MakeSmallByteLevelTokenizer(400);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<Tokenizer> tok = Tokenizer::Create(*std::move(spec));
  ASSERT_TRUE(tok.ok()) << tok.status();
  absl::StatusOr<std::string> prompt = FormatChatML({{"user", "hello"}}, true);
  ASSERT_TRUE(prompt.ok());
  const std::vector<int32_t> ids = tok->Encode(*prompt, /*parse_special=*/true);
  const int32_t im_start = *tok->FindToken("<|im_start|>");
  const int32_t im_end = *tok->FindToken("<|im_end|>");
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 1);
  EXPECT_EQ(tok->eos_id(), im_end);
  absl::StatusOr<std::string> back = tok->Decode(ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *prompt);
}

}  // namespace
}  // namespace tandem
