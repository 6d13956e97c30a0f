#include "gpu_service/server/request_validation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/chatml.h"

namespace tandem {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool KnownRole(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

}  // namespace

absl::Status CheckModelId(const std::string& model_id, const ServingLimits& limits) {
  if (model_id.empty() || model_id == limits.model_id) return absl::OkStatus();
  return Bad("model_id", absl::StrCat("unknown model '", model_id, "' (this service serves '",
                                      limits.model_id, "')"));
}

absl::StatusOr<std::vector<int32_t>> InputTokens(const v1::GenerationInput& input,
                                                 const Tokenizer& tokenizer,
                                                 const ServingLimits& limits,
                                                 const std::string& field) {
  std::vector<int32_t> ids;
  switch (input.input_case()) {
    case v1::GenerationInput::kText:
      if (input.text().empty()) return Bad(field + ".text", "is empty");
      ids = tokenizer.Encode(input.text(), /*parse_special=*/false);
      break;
    case v1::GenerationInput::kTokenIds: {
      const auto& list = input.token_ids().ids();
      if (list.empty()) return Bad(field + ".token_ids.ids", "is empty");
      for (int i = 0; i < list.size(); ++i) {
        if (static_cast<int64_t>(list[i]) >= limits.vocab) {
          return Bad(absl::StrCat(field, ".token_ids.ids[", i, "]"),
                     absl::StrCat(list[i], " is not below the vocabulary size ", limits.vocab));
        }
        ids.push_back(static_cast<int32_t>(list[i]));
      }
      break;
    }
    case v1::GenerationInput::kChat: {
      const auto& messages = input.chat().messages();
      if (messages.empty()) return Bad(field + ".chat.messages", "is empty");
      std::vector<ChatMessage> chat;
      for (int i = 0; i < messages.size(); ++i) {
        if (!KnownRole(messages[i].role())) {
          return Bad(absl::StrCat(field, ".chat.messages[", i, "].role"),
                     absl::StrCat("'", messages[i].role(),
                                  "' is not one of system, user, assistant, tool"));
        }
        chat.push_back(ChatMessage{messages[i].role(), messages[i].content()});
      }
      absl::StatusOr<std::string> text = FormatChatML(chat, input.chat().add_generation_prompt());
      if (!text.ok()) return Bad(field + ".chat", std::string(text.status().message()));
      ids = tokenizer.Encode(*text, /*parse_special=*/true);
      break;
    }
    case v1::GenerationInput::INPUT_NOT_SET:
      return Bad(field, "is empty (set text, token_ids or chat)");
  }
  if (ids.empty()) return Bad(field, "has no tokens");
  return ids;
}

absl::StatusOr<GenerationSpec> BuildGenerationSpec(std::vector<int32_t> prompt,
                                                   const v1::GenerationParameters& params,
                                                   const ServingLimits& limits,
                                                   const std::string& input_field) {
  GenerationSpec spec;
  const v1::SamplingParameters& s = params.sampling();
  const std::string sp = "params.sampling.";
  if (!(s.temperature() >= 0) || !std::isfinite(s.temperature())) {
    return Bad(sp + "temperature", absl::StrCat(s.temperature(), " is not a finite value >= 0"));
  }
  if (s.top_p() != 0 && !(s.top_p() > 0 && s.top_p() <= 1)) {
    return Bad(sp + "top_p", absl::StrCat(s.top_p(), " is outside (0, 1]"));
  }
  if (!(s.min_p() >= 0 && s.min_p() <= 1)) {
    return Bad(sp + "min_p", absl::StrCat(s.min_p(), " is outside [0, 1]"));
  }
  // top_k is unsigned on the wire; a negative value sent by a client of a language without unsigned
  // integers (Java) arrives as a huge number, so the message gives both readings.
  if (s.top_k() > static_cast<uint32_t>(INT32_MAX)) {
    return Bad(sp + "top_k", absl::StrCat(s.top_k(), " (", static_cast<int32_t>(s.top_k()),
                                          " as a signed value) is above ", INT32_MAX));
  }
  if (!(s.repetition_penalty() >= 0) || !std::isfinite(s.repetition_penalty())) {
    return Bad(sp + "repetition_penalty",
               absl::StrCat(s.repetition_penalty(), " is not a finite value > 0 (0 = off)"));
  }
  if (!std::isfinite(s.presence_penalty())) {
    return Bad(sp + "presence_penalty", "is not finite");
  }
  if (!std::isfinite(s.frequency_penalty())) {
    return Bad(sp + "frequency_penalty", "is not finite");
  }
  spec.sampling.temperature = s.temperature();
  spec.sampling.top_k = static_cast<int32_t>(s.top_k());
  spec.sampling.top_p = s.top_p() == 0 ? 1.0f : s.top_p();
  spec.sampling.min_p = s.min_p();
  if (s.has_seed()) spec.sampling.seed = s.seed();
  spec.sampling.repetition_penalty = s.repetition_penalty() == 0 ? 1.0f : s.repetition_penalty();
  spec.sampling.presence_penalty = s.presence_penalty();
  spec.sampling.frequency_penalty = s.frequency_penalty();

  const v1::StoppingCriteria& st = params.stopping();
  const std::string stp = "params.stopping.";
  if (st.max_new_tokens() > limits.max_new_tokens_cap) {
    return Bad(stp + "max_new_tokens", absl::StrCat(st.max_new_tokens(), " is above the cap ",
                                                     limits.max_new_tokens_cap));
  }
  spec.stopping.max_new_tokens =
      st.max_new_tokens() == 0 ? std::min(limits.default_max_new_tokens, limits.max_new_tokens_cap)
                               : st.max_new_tokens();
  if (st.min_new_tokens() > spec.stopping.max_new_tokens) {
    return Bad(stp + "min_new_tokens", absl::StrCat(st.min_new_tokens(), " is above max_new_tokens ",
                                                     spec.stopping.max_new_tokens));
  }
  spec.stopping.min_new_tokens = st.min_new_tokens();
  if (st.stop_sequences_size() > limits.max_stop_sequences) {
    return Bad(stp + "stop_sequences", absl::StrCat(st.stop_sequences_size(),
                                                     " sequences; at most ",
                                                     limits.max_stop_sequences));
  }
  for (int i = 0; i < st.stop_sequences_size(); ++i) {
    const std::string& seq = st.stop_sequences(i);
    const std::string f = absl::StrCat(stp, "stop_sequences[", i, "]");
    if (seq.empty()) return Bad(f, "is empty");
    if (static_cast<int64_t>(seq.size()) > limits.max_stop_sequence_bytes) {
      return Bad(f, absl::StrCat(seq.size(), " bytes; at most ", limits.max_stop_sequence_bytes));
    }
    spec.stopping.stop_sequences.push_back(seq);
  }
  for (int i = 0; i < st.stop_token_ids_size(); ++i) {
    if (static_cast<int64_t>(st.stop_token_ids(i)) >= limits.vocab) {
      return Bad(absl::StrCat(stp, "stop_token_ids[", i, "]"),
                 absl::StrCat(st.stop_token_ids(i), " is not below the vocabulary size ",
                              limits.vocab));
    }
    spec.stopping.stop_token_ids.push_back(static_cast<int32_t>(st.stop_token_ids(i)));
  }
  spec.stopping.ignore_eos = st.ignore_eos();

  const v1::ResponseOptions& r = params.response();
  if (r.top_n_tokens() > limits.max_top_n_tokens) {
    return Bad("params.response.top_n_tokens",
               absl::StrCat(r.top_n_tokens(), " is above ", limits.max_top_n_tokens));
  }
  spec.logprobs = r.logprobs() || r.top_n_tokens() > 0;
  spec.top_n_tokens = static_cast<int32_t>(r.top_n_tokens());

  if (params.truncate_input_tokens() > 0 &&
      prompt.size() > static_cast<size_t>(params.truncate_input_tokens())) {
    prompt.erase(prompt.begin(), prompt.end() - params.truncate_input_tokens());
  }
  if (static_cast<int64_t>(prompt.size()) >= limits.max_context) {
    return Bad(input_field, absl::StrCat(prompt.size(), " tokens leave no room below the context "
                                         "limit of ", limits.max_context,
                                         " (set params.truncate_input_tokens)"));
  }
  spec.prompt = std::move(prompt);
  return spec;
}

SteadyTime RequestDeadline(uint64_t time_limit_millis,
                           std::chrono::system_clock::time_point call_deadline,
                           SteadyTime steady_now, std::chrono::system_clock::time_point system_now) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  // What is left of the steady clock's range, in whole milliseconds: a later point is no deadline.
  const milliseconds room = duration_cast<milliseconds>(SteadyTime::max() - steady_now);
  SteadyTime deadline = SteadyTime::max();
  if (time_limit_millis > 0 && time_limit_millis < static_cast<uint64_t>(room.count())) {
    deadline = steady_now + milliseconds(static_cast<int64_t>(time_limit_millis));
  }
  if (call_deadline != std::chrono::system_clock::time_point::max()) {
    const auto left = call_deadline - system_now - milliseconds(10);
    const auto left_steady = duration_cast<SteadyTime::duration>(left);
    if (left_steady < SteadyTime::max() - steady_now) {
      deadline = std::min(deadline, steady_now + left_steady);
    }
  }
  return deadline;
}

}  // namespace tandem
