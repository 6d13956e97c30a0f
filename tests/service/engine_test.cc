// The engine over a fake backend: stop conditions, sampling determinism, cancellation and time
// limits, the step budget. No gRPC.
#include "gpu_service/engine/engine.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/service/fake_backend.h"

namespace tandem {
namespace {

// Collects a request's updates. With hold_at > 0, the engine thread waits inside the hold_at-th
// update until Release() (so a test can act at a known point of the generation).
class CollectingSink : public GenerationSink {
 public:
  explicit CollectingSink(int hold_at = 0) : hold_at_(hold_at) {}
  void OnUpdate(GenerationUpdate u) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++updates_;
    text_ += u.text;
    for (const TokenOutput& t : u.tokens) tokens_.push_back(t);
    if (u.finished) final_ = *u.finished;
    cv_.notify_all();
    if (updates_ == hold_at_ && !u.finished) {
      held_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
  }
  void WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  GenerationFinal WaitFinal() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return final_.has_value(); });
    return *final_;
  }
  std::vector<int32_t> ids() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int32_t> out;
    for (const TokenOutput& t : tokens_) out.push_back(t.id);
    return out;
  }
  std::vector<TokenOutput> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int hold_at_;
  int updates_ = 0;
  bool held_ = false, released_ = false;
  std::string text_;
  std::vector<TokenOutput> tokens_;
  std::optional<GenerationFinal> final_;
};

GenerationSpec Spec(std::vector<int32_t> prompt, int64_t max_new_tokens) {
  GenerationSpec s;
  s.prompt = std::move(prompt);
  s.stopping.max_new_tokens = max_new_tokens;
  return s;
}

// Runs one request to its end and returns the sink.
std::shared_ptr<CollectingSink> RunAlone(Engine& engine, GenerationSpec spec) {
  auto sink = std::make_shared<CollectingSink>();
  EXPECT_TRUE(engine.Submit(std::move(spec), sink).ok());
  sink->WaitFinal();
  return sink;
}

TEST(EngineTest, GeneratesMaxNewTokensAndFreesState) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  auto sink = RunAlone(engine, Spec({300, 301, 302}, 7));
  GenerationFinal f = sink->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kMaxTokens);
  EXPECT_EQ(f.generated_tokens, 7);
  EXPECT_EQ(f.input_tokens, 3);
  EXPECT_EQ(sink->ids().size(), 7u);
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
  EXPECT_EQ(backend.state_usage().pages_in_use, 0);
  // The text is the decoding of the tokens.
  absl::StatusOr<std::string> text = backend.tokenizer().DecodeToText(sink->ids());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(sink->text(), *text);
}

TEST(EngineTest, LogitsRowsComeFromTheBackendsBuffer) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine.Submit(Spec({300, 301 + i}, 5), sinks.back()).ok());
  }
  for (auto& s : sinks) EXPECT_EQ(s->WaitFinal().reason, FinishReason::kMaxTokens);
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
  // Every row the backend filled lay in the buffer it handed out (page-locked for the CUDA
  // backend), allocated once per growth (at most 1, 2, 4 rows: three times).
  EXPECT_EQ(backend.foreign_logits.load(), 0);
  EXPECT_GE(backend.logits_allocations.load(), 1);
  EXPECT_LE(backend.logits_allocations.load(), 3);
}

TEST(EngineTest, NoHostMemoryForLogitsEndsTheStepsRequestsWithAnError) {
  FakeBackend backend;
  backend.refuse_logits = true;
  Engine engine(&backend, {}, nullptr);
  auto sink = RunAlone(engine, Spec({300, 301}, 5));
  const GenerationFinal f = sink->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kError);
  EXPECT_EQ(f.error_code, absl::StatusCode::kResourceExhausted);
  EXPECT_NE(f.error.find("logits"), std::string::npos) << f.error;
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
  EXPECT_EQ(backend.state_usage().pages_in_use, 0);
  // The engine serves again once memory is there.
  backend.refuse_logits = false;
  EXPECT_EQ(RunAlone(engine, Spec({300, 302}, 3))->WaitFinal().reason, FinishReason::kMaxTokens);
}

TEST(EngineTest, SeededSamplingIsTheSameAloneAndBatched) {
  FakeBackend backend;
  EngineOptions options;
  options.scheduler.step_token_budget = 5;  // forces chunked prefill when batched
  Engine engine(&backend, options, nullptr);
  GenerationSpec a = Spec({300, 301, 302, 303}, 12);
  a.sampling.temperature = 1.0f;
  a.sampling.top_k = 50;
  a.sampling.top_p = 0.9f;
  a.sampling.seed = 7;
  const std::vector<int32_t> alone = RunAlone(engine, a)->ids();

  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    GenerationSpec other = Spec({static_cast<int32_t>(400 + i), 500, 501}, 9);
    other.sampling.temperature = 0.7f;
    other.sampling.seed = i;
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine.Submit(other, sinks.back()).ok());
    if (i == 1) {
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE(engine.Submit(a, sinks.back()).ok());
    }
  }
  for (auto& s : sinks) s->WaitFinal();
  EXPECT_EQ(sinks[2]->ids(), alone);
  // An unseeded request reports the seed it drew; rerunning with it repeats the output.
  GenerationSpec unseeded = a;
  unseeded.sampling.seed.reset();
  auto first = RunAlone(engine, unseeded);
  unseeded.sampling.seed = first->WaitFinal().seed;
  EXPECT_EQ(RunAlone(engine, unseeded)->ids(), first->ids());
}

// A backend whose cache cannot hold every running request at once: the engine preempts the
// youngest request (it is fed again later) instead of failing the step's requests, every request
// finishes with the tokens it gets alone, and a request that cannot fit even alone fails with
// RESOURCE_EXHAUSTED.
TEST(EngineTest, PreemptsWhenTheBackendIsFullAndOutputsDoNotChange) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  std::vector<GenerationSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back(Spec({static_cast<int32_t>(300 + i), 301, 302, 303}, 12));
  std::vector<std::vector<int32_t>> alone;
  for (const GenerationSpec& s : specs) alone.push_back(RunAlone(engine, s)->ids());
  // Four requests need 4 x 16 tokens at the end; the cache holds 40. Steps wait until all four are
  // queued, so that they run together (else a loaded machine could finish the first alone).
  backend.token_capacity = 40;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  {
    backend.Hold();
    struct ReleaseOnExit {  // also when an assertion below returns early
      FakeBackend& b;
      ~ReleaseOnExit() { b.Release(); }
    } release{backend};
    for (const GenerationSpec& s : specs) {
      sinks.push_back(std::make_shared<CollectingSink>());
      ASSERT_TRUE(engine.Submit(s, sinks.back()).ok());
    }
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    const GenerationFinal f = sinks[i]->WaitFinal();
    EXPECT_EQ(f.reason, FinishReason::kMaxTokens) << i << ": " << f.error;
    EXPECT_EQ(sinks[i]->ids(), alone[i]) << "request " << i;
  }
  EXPECT_GT(backend.exhausted_steps.load(), 0) << "the capacity never bit: the test checks nothing";
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
  EXPECT_EQ(backend.state_usage().pages_in_use, 0);
  // Alone and still too large: an error naming the cause, not a hang.
  backend.token_capacity = 10;
  const GenerationFinal too_big = RunAlone(engine, Spec({300, 301, 302, 303}, 12))->WaitFinal();
  EXPECT_EQ(too_big.reason, FinishReason::kError);
  EXPECT_EQ(too_big.error_code, absl::StatusCode::kResourceExhausted) << too_big.error;
}

TEST(EngineTest, StepsStayWithinTheTokenBudget) {
  FakeBackend backend;
  EngineOptions options;
  options.scheduler.step_token_budget = 6;
  Engine engine(&backend, options, nullptr);
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 5; ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    ASSERT_TRUE(engine.Submit(Spec(std::vector<int32_t>(4 + i, 300 + i), 3), sinks.back()).ok());
  }
  for (auto& s : sinks) EXPECT_EQ(s->WaitFinal().generated_tokens, 3);
  for (const auto& batch : backend.batches()) {
    int64_t total = 0;
    for (int64_t n : batch) total += n;
    EXPECT_LE(total, 6);
  }
}

TEST(EngineTest, StopSequenceEndsTheTextAfterTheMatch) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  GenerationSpec spec = Spec({300, 301}, 16);
  const std::string full = RunAlone(engine, spec)->text();
  ASSERT_GE(full.size(), 8u);
  // A stop sequence taken from the middle of the full output.
  const std::string stop = full.substr(full.size() / 2, 3);
  spec.stopping.stop_sequences = {stop};
  auto sink = RunAlone(engine, spec);
  GenerationFinal f = sink->WaitFinal();
  ASSERT_EQ(f.reason, FinishReason::kStopSequence);
  EXPECT_EQ(f.stop_sequence, stop);
  const size_t end = full.find(stop) + stop.size();
  EXPECT_EQ(sink->text(), full.substr(0, end));
}

TEST(EngineTest, EosEndsUnlessIgnoredOrBeforeMinNewTokens) {
  FakeBackend backend;
  backend.eos_at_length = 5;  // EOS is the best token once prompt + generated >= 5
  Engine engine(&backend, {}, nullptr);
  GenerationFinal f = RunAlone(engine, Spec({300, 301, 302}, 10))->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kEosToken);
  EXPECT_EQ(f.generated_tokens, 3);  // two tokens, then EOS at length 5

  GenerationSpec min = Spec({300, 301, 302}, 10);
  min.stopping.min_new_tokens = 6;
  f = RunAlone(engine, min)->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kEosToken);
  EXPECT_EQ(f.generated_tokens, 7);

  GenerationSpec ignore = Spec({300, 301, 302}, 10);
  ignore.stopping.ignore_eos = true;
  f = RunAlone(engine, ignore)->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kMaxTokens);
}

TEST(EngineTest, StopsAtTheContextLimit) {
  FakeBackend backend(/*context_length=*/12);
  Engine engine(&backend, {}, nullptr);
  GenerationFinal f = RunAlone(engine, Spec({300, 301, 302, 303, 304}, 100))->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kTokenLimit);
  EXPECT_EQ(f.generated_tokens, 7);
}

TEST(EngineTest, LogprobsComeWithTopAlternatives) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  GenerationSpec spec = Spec({300, 301}, 4);
  spec.logprobs = true;
  spec.top_n_tokens = 3;
  auto sink = RunAlone(engine, spec);
  for (const TokenOutput& t : sink->tokens()) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].id, t.id);  // greedy: the pick is the best alternative
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
    EXPECT_LE(t.logprob, 0.0f);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
  }
}

TEST(EngineTest, CancellationFreesStateAtTheNextStep) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  auto sink = std::make_shared<CollectingSink>(/*hold_at=*/3);
  absl::StatusOr<uint64_t> id = engine.Submit(Spec({300, 301}, 1000), sink);
  ASSERT_TRUE(id.ok());
  sink->WaitHeld();
  EXPECT_EQ(backend.state_usage().pages_in_use, 1);
  engine.Cancel(*id);
  sink->Release();
  GenerationFinal f = sink->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kCancelled);
  EXPECT_EQ(f.generated_tokens, 3);
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
  EXPECT_EQ(backend.state_usage().pages_in_use, 0);
}

TEST(EngineTest, TimeLimitEndsWithThePartialOutput) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  // Already past its deadline while queued: no tokens.
  GenerationSpec late = Spec({300, 301}, 10);
  late.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  GenerationFinal f = RunAlone(engine, late)->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kTimeLimit);
  EXPECT_EQ(f.generated_tokens, 0);

  // Running: held after two tokens until the deadline has passed.
  GenerationSpec spec = Spec({300, 301}, 1000);
  spec.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  auto sink = std::make_shared<CollectingSink>(/*hold_at=*/2);
  ASSERT_TRUE(engine.Submit(spec, sink).ok());
  sink->WaitHeld();
  while (std::chrono::steady_clock::now() <= spec.deadline) std::this_thread::yield();
  sink->Release();
  f = sink->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kTimeLimit);
  EXPECT_EQ(f.generated_tokens, 2);
  EXPECT_EQ(sink->ids().size(), 2u);
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
  EXPECT_EQ(backend.state_usage().pages_in_use, 0);
}

TEST(EngineTest, ADeadlineBeforeTheNextStepEndsEndsTheRequestThen) {
  // Steps of at least 100 ms. A request whose deadline is one step away when it arrives cannot get
  // a token before it: the engine ends it at the next step boundary with no token, instead of
  // running it through a step that would answer it after its deadline.
  FakeBackend backend;
  backend.step_sleep_ms = 100;
  Engine engine(&backend, {}, nullptr);
  auto runner = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> runner_id = engine.Submit(Spec({300, 301}, 1000), runner);
  ASSERT_TRUE(runner_id.ok());
  while (runner->ids().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  GenerationSpec hurried = Spec({400, 401}, 1000);
  hurried.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  GenerationFinal f = RunAlone(engine, hurried)->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kTimeLimit);
  EXPECT_EQ(f.generated_tokens, 0);

  // A deadline several steps away still gets tokens, and is answered before it.
  GenerationSpec later = Spec({500, 501}, 1000);
  later.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(450);
  f = RunAlone(engine, later)->WaitFinal();
  EXPECT_EQ(f.reason, FinishReason::kTimeLimit);
  EXPECT_GE(f.generated_tokens, 1);
  EXPECT_LE(f.generated_tokens, 4);

  engine.Cancel(*runner_id);
  EXPECT_EQ(runner->WaitFinal().reason, FinishReason::kCancelled);
  EXPECT_TRUE(engine.WaitUntilIdle(SteadyTime::max()));
}

TEST(EngineTest, FullQueueAndDrainingRefuse) {
  FakeBackend backend;
  EngineOptions options;
  options.scheduler.max_running = 1;
  options.scheduler.max_queue = 1;
  Engine engine(&backend, options, nullptr);
  auto running = std::make_shared<CollectingSink>(/*hold_at=*/1);
  absl::StatusOr<uint64_t> a = engine.Submit(Spec({300}, 100), running);
  ASSERT_TRUE(a.ok());
  running->WaitHeld();  // a runs; the engine thread is inside its first update
  auto queued = std::make_shared<CollectingSink>();
  absl::StatusOr<uint64_t> b = engine.Submit(Spec({301}, 2), queued);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<uint64_t> c = engine.Submit(Spec({302}, 2), std::make_shared<CollectingSink>());
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  engine.StopAdmitting();
  absl::StatusOr<uint64_t> d = engine.Submit(Spec({303}, 2), std::make_shared<CollectingSink>());
  EXPECT_TRUE(absl::IsUnavailable(d.status())) << d.status();
  engine.Cancel(*a);
  running->Release();
  EXPECT_EQ(running->WaitFinal().reason, FinishReason::kCancelled);
  EXPECT_EQ(queued->WaitFinal().reason, FinishReason::kMaxTokens);  // queued work still drains
}

TEST(EngineTest, PenaltiesChangeTheGreedyChoice) {
  FakeBackend backend;
  Engine engine(&backend, {}, nullptr);
  GenerationSpec plain = Spec({300, 301}, 8);
  const std::vector<int32_t> base = RunAlone(engine, plain)->ids();
  GenerationSpec penalised = plain;
  penalised.sampling.presence_penalty = 100.0f;  // no generated token may repeat
  const std::vector<int32_t> ids = RunAlone(engine, penalised)->ids();
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t j = i + 1; j < ids.size(); ++j) EXPECT_NE(ids[i], ids[j]);
  }
  EXPECT_EQ(ids[0], base[0]);  // nothing generated yet at the first pick
}

}  // namespace
}  // namespace tandem
