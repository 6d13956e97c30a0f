#include "gpu_service/server/generation_service.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "gpu_service/server/raw_request.h"
#include "gpu_service/server/request_log.h"

namespace tandem {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

v1::StopReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kMaxTokens: return v1::MAX_TOKENS;
    case FinishReason::kEosToken: return v1::EOS_TOKEN;
    case FinishReason::kStopSequence: return v1::STOP_SEQUENCE;
    case FinishReason::kTimeLimit: return v1::TIME_LIMIT;
    case FinishReason::kCancelled: return v1::CANCELLED;
    case FinishReason::kTokenLimit: return v1::TOKEN_LIMIT;
    case FinishReason::kError: return v1::ERROR;
  }
  return v1::ERROR;
}

SteadyTime DeadlineOf(const grpc::CallbackServerContext& ctx, uint64_t time_limit_millis) {
  return RequestDeadline(time_limit_millis, ctx.deadline(), std::chrono::steady_clock::now(),
                         std::chrono::system_clock::now());
}

// Adds generated tokens to a result or chunk, as the response options ask.
void AddTokens(const Tokenizer& tok, const v1::ResponseOptions& options,
               const std::vector<TokenOutput>& tokens,
               google::protobuf::RepeatedPtrField<v1::TokenInfo>* out) {
  const bool with_logprobs = options.logprobs() || options.top_n_tokens() > 0;
  if (!options.generated_tokens() && !with_logprobs) return;
  for (const TokenOutput& t : tokens) {
    v1::TokenInfo* info = out->Add();
    info->set_id(static_cast<uint32_t>(t.id));
    info->set_text(SanitizeUtf8(tok.TokenBytes(t.id)));
    if (with_logprobs) info->set_logprob(t.logprob);
    for (const TopTokenOutput& alt : t.top) {
      v1::TopToken* top = info->add_top_tokens();
      top->set_id(static_cast<uint32_t>(alt.id));
      top->set_text(SanitizeUtf8(tok.TokenBytes(alt.id)));
      top->set_logprob(alt.logprob);
    }
  }
}

double SecondsSince(SteadyTime t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

GenerationService::GenerationService(Engine* engine, const Backend* backend,
                                     const ServingLimits& limits)
    : engine_(engine), backend_(backend), limits_(limits) {}

// ---------------------------------------------------------------------------------------------
// Generate: every input is validated first, then all are submitted; the answer goes out when the
// last one has finished.
class GenerationService::GenerateCall : public grpc::ServerUnaryReactor {
 public:
  GenerateCall(GenerationService* service, grpc::CallbackServerContext* ctx,
               const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : state_(std::make_shared<State>()) {
    State& s = *state_;
    s.call = this;
    s.out = response;
    s.engine = service->engine_;
    s.tokenizer = &service->backend_->tokenizer();
    s.arrived = std::chrono::steady_clock::now();
    s.request_id = RequestIdOf(*ctx);
    ctx->AddInitialMetadata("x-request-id", s.request_id);
    s.response.set_request_id(s.request_id);

    std::lock_guard<std::mutex> lock(s.mu);
    v1::GenerateRequest req;
    absl::Status status = ParseMessage(*request, &req);
    if (status.ok()) status = CheckModelId(req.model_id(), service->limits_);
    if (status.ok() && req.inputs_size() == 0) {
      status = absl::InvalidArgumentError("inputs: is empty");
    }
    if (status.ok() && req.inputs_size() > service->limits_.max_inputs) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "inputs: ", req.inputs_size(), " inputs; at most ", service->limits_.max_inputs));
    }
    std::vector<GenerationSpec> specs;
    for (int i = 0; status.ok() && i < req.inputs_size(); ++i) {
      const std::string field = absl::StrCat("inputs[", i, "]");
      absl::StatusOr<std::vector<int32_t>> ids =
          InputTokens(req.inputs(i), *s.tokenizer, service->limits_, field);
      if (!ids.ok()) {
        status = ids.status();
        break;
      }
      absl::StatusOr<GenerationSpec> spec =
          BuildGenerationSpec(*std::move(ids), req.params(), service->limits_, field);
      if (!spec.ok()) {
        status = spec.status();
        break;
      }
      spec->deadline = DeadlineOf(*ctx, req.params().stopping().time_limit_millis());
      specs.push_back(*std::move(spec));
    }
    if (!status.ok()) {
      s.status = ToGrpc(status);
      FinishLocked();
      return;
    }
    s.options = req.params().response();
    s.remaining = static_cast<int>(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      v1::GenerationResult* result = s.response.add_results();
      result->set_input_token_count(static_cast<uint32_t>(specs[i].prompt.size()));
      if (s.options.input_tokens()) {
        for (int32_t id : specs[i].prompt) result->add_input_token_ids(static_cast<uint32_t>(id));
      }
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      absl::StatusOr<uint64_t> id =
          s.engine->Submit(std::move(specs[i]), std::make_shared<Sink>(state_, static_cast<int>(i)));
      if (!id.ok()) {
        // Refuse the whole call; inputs already queued are cancelled and waited for.
        s.status = ToGrpc(id.status());
        s.remaining -= static_cast<int>(specs.size() - i);
        for (uint64_t queued : s.ids) s.engine->Cancel(queued);
        break;
      }
      s.ids.push_back(*id);
    }
    if (s.remaining == 0) FinishLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (uint64_t id : state_->ids) state_->engine->Cancel(id);
  }
  void OnDone() override { delete this; }

 private:
  struct State {
    std::mutex mu;
    GenerateCall* call = nullptr;  // valid until Finish
    grpc::ByteBuffer* out = nullptr;
    Engine* engine = nullptr;
    const Tokenizer* tokenizer = nullptr;
    SteadyTime arrived;
    std::string request_id;
    v1::ResponseOptions options;
    v1::GenerateResponse response;
    std::vector<uint64_t> ids;
    int remaining = 0;
    bool finished = false;
    grpc::Status status;  // the first error
    std::string stop_reasons;
  };

  class Sink : public GenerationSink {
   public:
    Sink(std::shared_ptr<State> state, int index) : state_(std::move(state)), index_(index) {}
    void OnUpdate(GenerationUpdate u) override {
      State& s = *state_;
      std::lock_guard<std::mutex> lock(s.mu);
      v1::GenerationResult* r = s.response.mutable_results(index_);
      r->mutable_text()->append(u.text);
      AddTokens(*s.tokenizer, s.options, u.tokens, r->mutable_tokens());
      r->set_generated_token_count(static_cast<uint32_t>(u.generated_tokens));
      if (!u.finished.has_value()) return;
      const GenerationFinal& f = *u.finished;
      r->set_stop_reason(ToProto(f.reason));
      r->set_stop_sequence(f.stop_sequence);
      r->set_error_message(f.error);
      if (f.reason == FinishReason::kError && s.status.ok()) {
        s.status = grpc::Status(static_cast<grpc::StatusCode>(f.error_code), f.error);
      }
      if (f.reason == FinishReason::kCancelled && s.status.ok()) {
        s.status = grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled");
      }
      if (--s.remaining == 0) s.call->FinishLocked();
    }

   private:
    std::shared_ptr<State> state_;
    int index_;
  };

  // Sends the answer (state_->mu held).
  void FinishLocked() {
    State& s = *state_;
    if (s.finished) return;
    s.finished = true;
    RequestLogEntry log;
    log.request_id = s.request_id;
    log.method = "Generate";
    log.code = StatusCodeName(s.status.error_code());
    log.message = s.status.error_message();
    log.inputs = s.response.results_size();
    for (const v1::GenerationResult& r : s.response.results()) {
      log.input_tokens += r.input_token_count();
      log.generated_tokens += r.generated_token_count();
      absl::StrAppend(&log.stop_reasons, log.stop_reasons.empty() ? "" : ",",
                      v1::StopReason_Name(r.stop_reason()));
    }
    log.seconds = SecondsSince(s.arrived);
    WriteRequestLog(log);
    if (s.status.ok()) SerializeMessage(s.response, s.out);
    s.call = nullptr;
    Finish(s.status);
  }

  std::shared_ptr<State> state_;
};

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return new GenerateCall(this, context, request, response);
}

// ---------------------------------------------------------------------------------------------
// GenerateStream: one write in flight at a time; updates that arrive meanwhile are merged into
// one pending chunk (so a slow client costs memory bounded by its output, and the pieces still
// concatenate to the whole text).
class GenerationService::StreamCall : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamCall(GenerationService* service, grpc::CallbackServerContext* ctx,
             const grpc::ByteBuffer* request)
      : state_(std::make_shared<State>()) {
    State& s = *state_;
    s.call = this;
    s.engine = service->engine_;
    s.tokenizer = &service->backend_->tokenizer();
    s.arrived = std::chrono::steady_clock::now();
    s.request_id = RequestIdOf(*ctx);
    ctx->AddInitialMetadata("x-request-id", s.request_id);

    std::lock_guard<std::mutex> lock(s.mu);
    v1::GenerateStreamRequest req;
    absl::Status status = ParseMessage(*request, &req);
    if (status.ok()) status = CheckModelId(req.model_id(), service->limits_);
    absl::StatusOr<GenerationSpec> spec;
    if (status.ok()) {
      absl::StatusOr<std::vector<int32_t>> ids =
          InputTokens(req.input(), *s.tokenizer, service->limits_, "input");
      status = ids.status();
      if (ids.ok()) {
        spec = BuildGenerationSpec(*std::move(ids), req.params(), service->limits_, "input");
        status = spec.status();
      }
    }
    if (!status.ok()) {
      s.final_status = ToGrpc(status);
      s.final_received = true;
      FinishLocked();
      return;
    }
    spec->deadline = DeadlineOf(*ctx, req.params().stopping().time_limit_millis());
    s.options = req.params().response();
    s.input_tokens = static_cast<int64_t>(spec->prompt.size());
    v1::GenerationChunk first;
    first.set_request_id(s.request_id);
    first.set_input_token_count(static_cast<uint32_t>(spec->prompt.size()));
    if (s.options.input_tokens()) {
      for (int32_t id : spec->prompt) first.add_input_token_ids(static_cast<uint32_t>(id));
    }
    absl::StatusOr<uint64_t> id = s.engine->Submit(*std::move(spec), std::make_shared<Sink>(state_));
    if (!id.ok()) {
      s.final_status = ToGrpc(id.status());
      s.final_received = true;
      FinishLocked();
      return;
    }
    s.id = *id;
    s.submitted = true;
    s.pending = std::move(first);
    WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    State& s = *state_;
    s.writing = false;
    if (!ok && !s.broken) {
      // The client is gone; stop generating. The engine's CANCELLED update finishes the call.
      s.broken = true;
      s.engine->Cancel(s.id);
    }
    if (s.broken) {
      if (s.final_received) FinishLocked();
      return;
    }
    if (s.last_written) {
      FinishLocked();
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->broken = true;
    if (state_->submitted) state_->engine->Cancel(state_->id);
  }
  void OnDone() override { delete this; }

 private:
  struct State {
    std::mutex mu;
    StreamCall* call = nullptr;  // valid until Finish
    Engine* engine = nullptr;
    const Tokenizer* tokenizer = nullptr;
    SteadyTime arrived;
    std::string request_id;
    v1::ResponseOptions options;
    uint64_t id = 0;
    bool submitted = false;
    int64_t input_tokens = 0, generated_tokens = 0;
    std::string stop_reason;
    std::optional<v1::GenerationChunk> pending;  // not yet written
    bool pending_is_last = false;
    grpc::ByteBuffer out;  // the write in flight
    bool writing = false, last_written = false, broken = false;
    bool final_received = false, finished = false;
    grpc::Status final_status;
  };

  class Sink : public GenerationSink {
   public:
    explicit Sink(std::shared_ptr<State> state) : state_(std::move(state)) {}
    void OnUpdate(GenerationUpdate u) override {
      State& s = *state_;
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.pending.has_value()) {
        s.pending.emplace();
        s.pending->set_request_id(s.request_id);
      }
      v1::GenerationChunk& c = *s.pending;
      c.mutable_text()->append(u.text);
      AddTokens(*s.tokenizer, s.options, u.tokens, c.mutable_tokens());
      c.set_generated_token_count(static_cast<uint32_t>(u.generated_tokens));
      s.generated_tokens = u.generated_tokens;
      if (u.finished.has_value()) {
        const GenerationFinal& f = *u.finished;
        c.set_stop_reason(ToProto(f.reason));
        c.set_stop_sequence(f.stop_sequence);
        c.set_error_message(f.error);
        s.stop_reason = v1::StopReason_Name(ToProto(f.reason));
        s.final_received = true;
        s.pending_is_last = true;
        if (f.reason == FinishReason::kError) {
          s.final_status = grpc::Status(static_cast<grpc::StatusCode>(f.error_code), f.error);
        } else if (f.reason == FinishReason::kCancelled) {
          s.final_status = grpc::Status(grpc::StatusCode::CANCELLED, "the request was cancelled");
        }
      }
      if (s.broken) {
        if (s.final_received && !s.writing) s.call->FinishLocked();
        return;
      }
      if (!s.writing) s.call->WriteNextLocked();
    }

   private:
    std::shared_ptr<State> state_;
  };

  // Starts writing the pending chunk, if any (state_->mu held, no write in flight).
  void WriteNextLocked() {
    State& s = *state_;
    if (!s.pending.has_value() || s.finished) return;
    SerializeMessage(*s.pending, &s.out);
    s.pending.reset();
    s.writing = true;
    s.last_written = s.pending_is_last;
    StartWrite(&s.out);
  }

  // Ends the call (state_->mu held).
  void FinishLocked() {
    State& s = *state_;
    if (s.finished) return;
    s.finished = true;
    RequestLogEntry log;
    log.request_id = s.request_id;
    log.method = "GenerateStream";
    log.code = StatusCodeName(s.final_status.error_code());
    log.message = s.final_status.error_message();
    log.inputs = 1;
    log.input_tokens = s.input_tokens;
    log.generated_tokens = s.generated_tokens;
    log.stop_reasons = s.stop_reason;
    log.seconds = SecondsSince(s.arrived);
    WriteRequestLog(log);
    s.call = nullptr;
    Finish(s.final_status);
  }

  std::shared_ptr<State> state_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new StreamCall(this, context, request);
}

// ---------------------------------------------------------------------------------------------
// The small unary methods answer at once.
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const char* method,
                                 const std::string& request_id, SteadyTime arrived,
                                 const absl::Status& status,
                                 const google::protobuf::Message* response,
                                 grpc::ByteBuffer* out) {
  RequestLogEntry log;
  log.request_id = request_id;
  log.method = method;
  log.code = StatusCodeName(static_cast<int>(status.code()));
  log.message = std::string(status.message());
  log.seconds = SecondsSince(arrived);
  WriteRequestLog(log);
  if (status.ok()) SerializeMessage(*response, out);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

// What every small unary method starts with: its arrival time, the request id (echoed as
// metadata), and the request parsed with its model id checked (`status` holds the first error).
struct UnaryStart {
  SteadyTime arrived;
  std::string request_id;
  absl::Status status;
};

template <typename Request>
UnaryStart StartUnary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& request,
                      const ServingLimits& limits, Request* req) {
  UnaryStart s{std::chrono::steady_clock::now(), RequestIdOf(*ctx), absl::OkStatus()};
  ctx->AddInitialMetadata("x-request-id", s.request_id);
  s.status = ParseMessage(request, req);
  if (s.status.ok()) s.status = CheckModelId(req->model_id(), limits);
  return s;
}

}  // namespace

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  v1::TokenizeRequest req;
  v1::TokenizeResponse resp;
  auto [arrived, request_id, status] = StartUnary(ctx, *request, limits_, &req);
  if (status.ok()) {
    absl::StatusOr<std::vector<int32_t>> ids =
        InputTokens(req.input(), backend_->tokenizer(), limits_, "input");
    status = ids.status();
    if (ids.ok()) {
      for (int32_t id : *ids) {
        resp.add_ids(static_cast<uint32_t>(id));
        if (req.return_pieces()) {
          resp.add_pieces(SanitizeUtf8(backend_->tokenizer().TokenBytes(id)));
        }
      }
    }
  }
  return Answer(ctx, "Tokenize", request_id, arrived, status, &resp, response);
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  v1::DetokenizeRequest req;
  v1::DetokenizeResponse resp;
  auto [arrived, request_id, status] = StartUnary(ctx, *request, limits_, &req);
  std::vector<int32_t> ids;
  for (int i = 0; status.ok() && i < req.ids_size(); ++i) {
    if (static_cast<int64_t>(req.ids(i)) >= limits_.vocab) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "ids[", i, "]: ", req.ids(i), " is not below the vocabulary size ", limits_.vocab));
    }
    ids.push_back(static_cast<int32_t>(req.ids(i)));
  }
  if (status.ok()) {
    absl::StatusOr<std::string> text = backend_->tokenizer().DecodeToText(ids);
    status = text.status();
    if (text.ok()) resp.set_text(*text);
  }
  return Answer(ctx, "Detokenize", request_id, arrived, status, &resp, response);
}

grpc::ServerUnaryReactor* GenerationService::ModelInfo(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  v1::ModelInfoRequest req;
  v1::ModelInfoResponse resp;
  auto [arrived, request_id, status] = StartUnary(ctx, *request, limits_, &req);
  if (status.ok()) {
    const ModelConfig& c = backend_->config();
    resp.set_model_id(limits_.model_id);
    resp.set_architecture(c.arch);
    resp.set_vocab_size(static_cast<uint32_t>(limits_.vocab));
    resp.set_max_context(static_cast<uint32_t>(limits_.max_context));
    resp.set_max_new_tokens_cap(static_cast<uint32_t>(limits_.max_new_tokens_cap));
    resp.set_layer_count(static_cast<uint32_t>(c.n_layers));
    resp.set_expert_count(static_cast<uint32_t>(c.moe.E));
    resp.set_experts_per_token(static_cast<uint32_t>(c.moe.K));
    resp.set_parameter_count(backend_->parameter_count());
    resp.set_backend(backend_->name());
    if (backend_->tokenizer().eos_id().has_value()) {
      resp.set_eos_token_id(static_cast<uint64_t>(*backend_->tokenizer().eos_id()));
    }
  }
  return Answer(ctx, "ModelInfo", request_id, arrived, status, &resp, response);
}

}  // namespace tandem
