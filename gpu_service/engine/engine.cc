#include "gpu_service/engine/engine.h"

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu_service/engine/output_text.h"
#include "gpu_service/engine/token_sampler.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kMaxTokens: return "max_tokens";
    case FinishReason::kEosToken: return "eos_token";
    case FinishReason::kStopSequence: return "stop_sequence";
    case FinishReason::kTimeLimit: return "time_limit";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kTokenLimit: return "token_limit";
    case FinishReason::kError: return "error";
  }
  return "error";
}

namespace {

double Seconds(SteadyTime a, SteadyTime b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t DrawSeed() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return rng();
}

}  // namespace

// A request's state. The scheduler's view is the base; the rest is touched only by the engine's
// thread after Submit (except `cancelled`).
struct Engine::Request : ScheduledSequence {
  GenerationSpec spec;
  std::shared_ptr<GenerationSink> sink;
  std::optional<SequenceSlot> slot;
  std::vector<int32_t> tokens;  // prompt, then every generated token
  uint64_t seed = 0;
  std::optional<TokenSampler> sampler;
  std::optional<OutputText> text;
  std::vector<int32_t> end_tokens;  // EOS (unless ignore_eos) and stop_token_ids
  int64_t generated = 0;
  SteadyTime arrived, last_token;
  bool preempted = false;  // was sent back to the queue once (admission metrics counted already)
};

Engine::Engine(Backend* backend, const EngineOptions& options, ServiceMetrics* metrics)
    : backend_(backend), metrics_(metrics), scheduler_(options.scheduler) {
  const int64_t model_limit = backend->config().context_length;
  max_context_ = options.max_context > 0 ? options.max_context : model_limit;
  if (model_limit > 0) max_context_ = std::min(max_context_, model_limit);
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    admitting_ = false;
    for (auto& [id, r] : requests_) r->cancelled.store(true);
  }
  work_cv_.notify_all();
  thread_.join();
}

absl::StatusOr<uint64_t> Engine::Submit(GenerationSpec spec,
                                        std::shared_ptr<GenerationSink> sink) {
  auto r = std::make_unique<Request>();
  r->arrived = std::chrono::steady_clock::now();
  r->seed = spec.sampling.seed.has_value() ? *spec.sampling.seed : DrawSeed();
  r->tokens = spec.prompt;
  r->known_tokens = static_cast<int64_t>(spec.prompt.size());
  r->deadline = spec.deadline;
  r->sampler.emplace(spec.sampling, r->seed, spec.prompt);
  r->text.emplace(backend_->tokenizer(), spec.stopping.stop_sequences);
  if (!spec.stopping.ignore_eos && backend_->tokenizer().eos_id().has_value()) {
    r->end_tokens.push_back(*backend_->tokenizer().eos_id());
  }
  for (int32_t id : spec.stopping.stop_token_ids) r->end_tokens.push_back(id);
  r->spec = std::move(spec);
  r->sink = std::move(sink);

  std::lock_guard<std::mutex> lock(mu_);
  if (!admitting_) {
    if (metrics_) metrics_->rejected_draining->Add(1);
    return absl::UnavailableError("the service is shutting down and admits no new requests");
  }
  if (absl::Status s = scheduler_.Enqueue(r.get()); !s.ok()) {
    if (metrics_) metrics_->rejected_queue_full->Add(1);
    return s;
  }
  const uint64_t id = next_id_++;
  r->id = id;
  requests_[id] = std::move(r);
  if (metrics_) metrics_->waiting->Set(static_cast<double>(scheduler_.waiting()));
  work_cv_.notify_one();
  return id;
}

void Engine::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  it->second->cancelled.store(true, std::memory_order_release);
  work_cv_.notify_one();
}

void Engine::StopAdmitting() {
  std::lock_guard<std::mutex> lock(mu_);
  admitting_ = false;
}

bool Engine::WaitUntilIdle(SteadyTime deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [&] { return scheduler_.idle(); };
  if (deadline == SteadyTime::max()) {
    idle_cv_.wait(lock, idle);
    return true;
  }
  return idle_cv_.wait_until(lock, deadline, idle);
}

void Engine::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, r] : requests_) r->cancelled.store(true, std::memory_order_release);
  work_cv_.notify_one();
}

int64_t Engine::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.running();
}

int64_t Engine::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.waiting();
}

void Engine::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stopping_ || !scheduler_.idle(); });
    if (scheduler_.idle()) break;  // stopping, and nothing left to answer
    const SteadyTime start = std::chrono::steady_clock::now();
    const SteadyTime::duration expected_step =
        *std::max_element(recent_steps_.begin(), recent_steps_.end());
    StepPlan plan = scheduler_.Schedule(start + expected_step);
    if (metrics_) {
      metrics_->running->Set(static_cast<double>(scheduler_.running()));
      metrics_->waiting->Set(static_cast<double>(scheduler_.waiting()));
    }
    lock.unlock();
    RunStep(plan);
    recent_steps_[steps_run_++ % recent_steps_.size()] = std::chrono::steady_clock::now() - start;
    lock.lock();
    if (metrics_) metrics_->running->Set(static_cast<double>(scheduler_.running()));
    if (scheduler_.idle()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

void Engine::RunStep(StepPlan& plan) {
  for (ScheduledSequence* s : plan.cancelled) {
    Finish(static_cast<Request*>(s), {}, FinishReason::kCancelled, "");
  }
  for (ScheduledSequence* s : plan.expired) {
    Finish(static_cast<Request*>(s), {}, FinishReason::kTimeLimit, "");
  }
  const SteadyTime now = std::chrono::steady_clock::now();
  std::vector<Request*> dropped;  // admitted but given no state
  for (ScheduledSequence* s : plan.admitted) {
    Request* r = static_cast<Request*>(s);
    if (metrics_ && !r->preempted) {
      metrics_->queue_time->Observe(Seconds(r->arrived, now));
      metrics_->prompt_tokens->Add(static_cast<double>(r->spec.prompt.size()));
    }
    absl::StatusOr<SequenceSlot> slot = backend_->CreateSequence();
    if (slot.ok()) {
      r->slot = *slot;
    } else {
      dropped.push_back(r);
    }
  }
  const int64_t V = backend_->config().vocab;
  std::vector<Backend::StepInput> inputs;
  std::vector<Request*> batch;
  std::vector<bool> samples;
  size_t sampling = 0;
  for (const StepPlan::Chunk& c : plan.chunks) sampling += c.samples ? 1 : 0;
  // Admitted requests that got no state end after the loops over the chunks, which still read them.
  auto end_dropped = [&] {
    for (Request* r : dropped) Finish(r, {}, FinishReason::kError, "no state slot is free (the state pool is full)");
  };
  if (const size_t need = sampling * static_cast<size_t>(V); need > logits_floats_) {
    // Doubling: a page-locked allocation costs milliseconds, so it should happen a few times only.
    const size_t floats = std::max(need, 2 * logits_floats_);
    logits_ = backend_->AllocateLogits(floats);
    logits_floats_ = logits_ != nullptr ? floats : 0;
    if (logits_ == nullptr) {
      for (const StepPlan::Chunk& c : plan.chunks) {
        Request* r = static_cast<Request*>(c.seq);
        if (!r->slot.has_value()) continue;  // dropped
        Finish(r, {}, FinishReason::kError, absl::StrCat("no host memory for ", floats, " logits"),
               absl::StatusCode::kResourceExhausted);
      }
      end_dropped();
      return;
    }
  }
  size_t row = 0;
  for (const StepPlan::Chunk& c : plan.chunks) {
    Request* r = static_cast<Request*>(c.seq);
    if (!r->slot.has_value()) continue;  // dropped above
    Backend::StepInput in;
    in.slot = *r->slot;
    in.tokens = std::span<const int32_t>(r->tokens).subspan(c.start, c.count);
    in.logits = c.samples ? logits_.get() + (row++) * V : nullptr;
    in.rewindable = false;  // the engine never calls KeepFirst: spare the backend its checkpoint
    inputs.push_back(in);
    batch.push_back(r);
    samples.push_back(c.samples);
  }
  end_dropped();
  if (inputs.empty()) return;
  absl::Status s = backend_->Step(inputs);
  if (absl::IsResourceExhausted(s) && batch.size() > 1) {
    // No room for the whole step (the backend's KV cache is full); the backend left every slot as
    // it was. The youngest request goes back to the queue (it is fed again from its first token
    // when re-admitted, so its output does not change) and the others run next step.
    Request* youngest = *std::max_element(batch.begin(), batch.end(),
                                          [](const Request* a, const Request* b) { return a->id < b->id; });
    backend_->ReleaseSequence(*youngest->slot);
    youngest->slot.reset();
    youngest->preempted = true;
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_.Preempt(youngest);
    return;
  }
  if (!s.ok()) {
    for (Request* r : batch) {
      Finish(r, {}, FinishReason::kError, absl::StrCat("backend step failed: ", s.message()),
             absl::IsUnavailable(s)           ? absl::StatusCode::kUnavailable
             : absl::IsResourceExhausted(s) ? absl::StatusCode::kResourceExhausted
                                            : absl::StatusCode::kInternal);
    }
    return;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->computed_tokens += static_cast<int64_t>(inputs[i].tokens.size());
    if (samples[i]) Advance(batch[i], std::span<const float>(inputs[i].logits, V));
  }
}

void Engine::Advance(Request* r, std::span<const float> logits) {
  const StopOptions& stop = r->spec.stopping;
  const bool before_min = r->generated < stop.min_new_tokens;
  TokenOutput tok = r->sampler->Next(logits, r->spec.logprobs, r->spec.top_n_tokens,
                                     before_min ? std::span<const int32_t>(r->end_tokens)
                                                : std::span<const int32_t>());
  const SteadyTime now = std::chrono::steady_clock::now();
  if (metrics_) {
    if (r->generated == 0) {
      metrics_->time_to_first_token->Observe(Seconds(r->arrived, now));
    } else {
      metrics_->time_per_output_token->Observe(Seconds(r->last_token, now));
    }
    metrics_->generation_tokens->Add(1);
  }
  r->last_token = now;
  r->tokens.push_back(tok.id);
  ++r->known_tokens;
  ++r->generated;
  const bool past_min = r->generated >= stop.min_new_tokens;
  OutputText::Piece piece = r->text->Push(tok.id, past_min);

  GenerationUpdate u;
  u.text = std::move(piece.text);
  const int32_t id = tok.id;
  u.tokens.push_back(std::move(tok));
  u.generated_tokens = r->generated;
  std::optional<FinishReason> reason;
  std::string detail;
  if (past_min && std::find(r->end_tokens.begin(), r->end_tokens.end(), id) != r->end_tokens.end()) {
    reason = FinishReason::kEosToken;
  } else if (piece.stop != nullptr) {
    reason = FinishReason::kStopSequence;
    detail = *piece.stop;
  } else if (r->generated >= stop.max_new_tokens) {
    reason = FinishReason::kMaxTokens;
  } else if (r->known_tokens >= max_context_) {
    reason = FinishReason::kTokenLimit;
  }
  if (reason.has_value()) {
    Finish(r, std::move(u), *reason, std::move(detail));
  } else {
    r->sink->OnUpdate(std::move(u));
  }
}

void Engine::Finish(Request* r, GenerationUpdate update, FinishReason reason, std::string detail,
                    absl::StatusCode error_code) {
  // State first, so that a client that sees the last message also sees the pool released.
  if (r->slot.has_value()) {
    backend_->ReleaseSequence(*r->slot);
    r->slot.reset();
  }
  if (reason != FinishReason::kStopSequence) update.text += r->text->Finish();
  update.generated_tokens = r->generated;
  GenerationFinal f;
  f.reason = reason;
  if (reason == FinishReason::kStopSequence) f.stop_sequence = detail;
  if (reason == FinishReason::kError) {
    f.error = detail;
    f.error_code = error_code;
  }
  f.input_tokens = static_cast<int64_t>(r->spec.prompt.size());
  f.generated_tokens = r->generated;
  f.seed = r->seed;
  update.finished = std::move(f);
  if (metrics_) {
    metrics_->finished(FinishReasonName(reason))->Add(1);
    metrics_->e2e_latency->Observe(Seconds(r->arrived, std::chrono::steady_clock::now()));
  }
  r->sink->OnUpdate(std::move(update));
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_.Finish(r);
  requests_.erase(r->id);
  if (metrics_) metrics_->waiting->Set(static_cast<double>(scheduler_.waiting()));
}

}  // namespace tandem
