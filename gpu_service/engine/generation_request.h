// One generation request as the engine sees it (already validated by the server), and the sink
// that receives its output. Transport-neutral: the gRPC front converts protos to and from these.
#ifndef TANDEM_GPU_SERVICE_ENGINE_GENERATION_REQUEST_H_
#define TANDEM_GPU_SERVICE_ENGINE_GENERATION_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu_service/scheduler/scheduler.h"

namespace tandem {

// Why a request ended (the proto's StopReason, TGIS semantics).
enum class FinishReason {
  kMaxTokens,     // max_new_tokens generated
  kEosToken,      // the model's EOS token, or one of stop_token_ids
  kStopSequence,  // a stop sequence appeared in the text (it is kept in the text)
  kTimeLimit,     // the deadline passed; the output so far is the answer
  kCancelled,     // the client went away, or the service gave up draining
  kTokenLimit,    // prompt + generated reached the context limit
  kError,         // the backend failed; see GenerationFinal::error
};
const char* FinishReasonName(FinishReason reason);

struct SamplingOptions {
  float temperature = 0;  // 0: greedy
  int32_t top_k = 0;      // 0: off
  float top_p = 1;        // 1: off
  float min_p = 0;        // 0: off
  std::optional<uint64_t> seed;  // unset: the engine draws one
  float repetition_penalty = 1;  // 1: off; over prompt and generated tokens (divides a positive
                                 // logit, multiplies a negative one)
  float presence_penalty = 0;    // subtracted once from each generated token's logit
  float frequency_penalty = 0;   // subtracted per occurrence in the generated tokens
};

struct StopOptions {
  int64_t max_new_tokens = 20;
  int64_t min_new_tokens = 0;  // EOS, stop tokens and stop sequences are ignored before this
  std::vector<std::string> stop_sequences;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

struct GenerationSpec {
  std::vector<int32_t> prompt;  // non-empty, every id < vocab, shorter than the context limit
  SamplingOptions sampling;
  StopOptions stopping;
  bool logprobs = false;        // report each generated token's log-probability
  int32_t top_n_tokens = 0;     // with logprobs: this many alternatives per position
  SteadyTime deadline = SteadyTime::max();  // the time limit and the call's deadline, whichever first
};

struct TopTokenOutput {
  int32_t id = 0;
  float logprob = 0;
};

struct TokenOutput {
  int32_t id = 0;
  float logprob = 0;                 // with logprobs: log-softmax of the (penalised) logits
  std::vector<TopTokenOutput> top;   // with top_n_tokens: the most likely tokens, best first
};

struct GenerationFinal {
  FinishReason reason = FinishReason::kMaxTokens;
  std::string stop_sequence;  // kStopSequence: the one that matched
  std::string error;          // kError: what failed
  // kError: the gRPC code the call ends with (UNAVAILABLE when a host worker was lost, so that
  // clients and load balancers retry elsewhere; INTERNAL for other failures).
  absl::StatusCode error_code = absl::StatusCode::kInternal;
  int64_t input_tokens = 0;
  int64_t generated_tokens = 0;
  uint64_t seed = 0;          // the seed used (drawn when the request had none)
};

// What one engine step produced for one request.
struct GenerationUpdate {
  std::string text;                  // new text (valid UTF-8; control tokens add none)
  std::vector<TokenOutput> tokens;   // new tokens
  int64_t generated_tokens = 0;      // so far
  std::optional<GenerationFinal> finished;  // set in the request's last update
};

// Receives a request's output. Called from the engine's step thread, in order, never
// concurrently for one request; the last call has `finished` set (exactly one such call, also for
// requests that never ran). Implementations must not block and must not call back into the
// engine.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnUpdate(GenerationUpdate update) = 0;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_ENGINE_GENERATION_REQUEST_H_
