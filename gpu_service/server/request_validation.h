// Turns the public API's requests into engine requests, checking every rule of
// proto/tandem/v1/generation.proto. Each error is InvalidArgument and starts with the path of the
// bad field as the request spells it ("inputs[1].token_ids.ids[3]", "params.sampling.top_p"),
// followed by what is wrong with it.
#ifndef TANDEM_GPU_SERVICE_SERVER_REQUEST_VALIDATION_H_
#define TANDEM_GPU_SERVICE_SERVER_REQUEST_VALIDATION_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "gpu_service/engine/generation_request.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

struct ServingLimits {
  std::string model_id;               // the served model's id; requests may also leave it empty
  int64_t vocab = 0;                  // token ids must be below this
  int64_t max_context = 0;            // prompt + generated tokens
  int64_t max_new_tokens_cap = 1024;  // max_new_tokens above this is refused
  int64_t default_max_new_tokens = 20;  // when max_new_tokens is 0 (TGIS's default)
  int64_t max_stop_sequences = 16;
  int64_t max_stop_sequence_bytes = 240;
  int64_t max_top_n_tokens = 20;
  int64_t max_inputs = 64;            // prompts in one Generate call
};

// model_id empty or equal to limits.model_id.
absl::Status CheckModelId(const std::string& model_id, const ServingLimits& limits);

// The token ids of one input (text, token ids or chat messages). `field` is the input's path
// ("inputs[0]", "input"). Errors: no input form set, no tokens, an id >= vocab, a chat message
// with an unknown role. (Invalid UTF-8 is caught while parsing; see raw_request.h.)
absl::StatusOr<std::vector<int32_t>> InputTokens(const v1::GenerationInput& input,
                                                 const Tokenizer& tokenizer,
                                                 const ServingLimits& limits,
                                                 const std::string& field);

// The engine's request for a prompt and the parameters. Applies truncate_input_tokens, then
// refuses a prompt that leaves no room to generate (prompt >= max_context). `input_field` names
// the input in errors. The deadline is left for the caller.
absl::StatusOr<GenerationSpec> BuildGenerationSpec(std::vector<int32_t> prompt,
                                                   const v1::GenerationParameters& params,
                                                   const ServingLimits& limits,
                                                   const std::string& input_field);

// The engine's deadline for a request: `time_limit_millis` after `steady_now` (0: none), or the
// call's deadline less a 10 ms margin, so that the engine ends the request with its partial output
// before gRPC cancels the call, whichever comes first. `call_deadline` is
// system_clock::time_point::max() for a call without one. A limit too large for the clock (the
// field is a uint64 of milliseconds) is no limit, not an overflow into the past.
SteadyTime RequestDeadline(uint64_t time_limit_millis,
                           std::chrono::system_clock::time_point call_deadline,
                           SteadyTime steady_now, std::chrono::system_clock::time_point system_now);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_REQUEST_VALIDATION_H_
