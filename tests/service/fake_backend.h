// A Backend for engine tests: no model, deterministic logits that depend only on the sequence's
// own tokens (so batching cannot change them), one "page" per live slot, and a record of every
// step's batch.
#ifndef TANDEM_TESTS_SERVICE_FAKE_BACKEND_H_
#define TANDEM_TESTS_SERVICE_FAKE_BACKEND_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/small_tokenizer.h"
#include "gpu_service/backend/backend.h"
#include "gtest/gtest.h"

namespace tandem {

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(int64_t context_length = 4096, int vocab = 1024) {
    config_.arch = "fake";
    config_.vocab = vocab;
    config_.context_length = context_length;
    absl::StatusOr<TokenizerSpec> spec = MakeSmallByteLevelTokenizer(vocab);
    EXPECT_TRUE(spec.ok());
    absl::StatusOr<Tokenizer> tok = Tokenizer::Create(*spec);
    EXPECT_TRUE(tok.ok());
    tokenizer_ = std::make_unique<Tokenizer>(*std::move(tok));
  }

  std::string name() const override { return "fake"; }
  const ModelConfig& config() const override { return config_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  uint64_t parameter_count() const override { return 0; }

  absl::StatusOr<SequenceSlot> CreateSequence() override {
    std::lock_guard<std::mutex> lock(mu_);
    const SequenceSlot s = next_++;
    slots_[s] = {};
    return s;
  }
  void ReleaseSequence(SequenceSlot slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.erase(slot);
  }
  absl::Status Step(std::span<const StepInput> inputs) override {
    {
      std::unique_lock<std::mutex> gate(gate_mu_);
      gate_cv_.wait(gate, [this] { return !held_; });
    }
    if (const int64_t ms = step_sleep_ms.load(); ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    std::lock_guard<std::mutex> lock(mu_);
    // A bounded cache, like the CUDA backend's KV pages: refuse the step before changing anything.
    if (const int64_t cap = token_capacity.load(); cap > 0) {
      int64_t held = 0;
      for (const auto& [slot, tokens] : slots_) held += static_cast<int64_t>(tokens.size());
      for (const StepInput& in : inputs) held += static_cast<int64_t>(in.tokens.size());
      if (held > cap) {
        ++exhausted_steps;
        return absl::ResourceExhaustedError(absl::StrCat("fake: ", held, " tokens, capacity ", cap));
      }
    }
    std::vector<int64_t> counts;
    for (const StepInput& in : inputs) {
      auto it = slots_.find(in.slot);
      if (it == slots_.end()) return absl::InvalidArgumentError("unknown slot");
      it->second.insert(it->second.end(), in.tokens.begin(), in.tokens.end());
      counts.push_back(static_cast<int64_t>(in.tokens.size()));
      if (in.logits != nullptr) {
        if (in.logits < logits_begin_ || in.logits + config_.vocab > logits_end_) ++foreign_logits;
        Logits(it->second, in.logits);
      }
    }
    batches_.push_back(counts);
    return absl::OkStatus();
  }
  // Plain heap memory as the default's, remembered so that Step can tell whether the engine's
  // logits rows come from it (foreign_logits counts the rows that do not).
  LogitsBuffer AllocateLogits(size_t floats) override {
    ++logits_allocations;
    if (refuse_logits.load()) return LogitsBuffer();
    LogitsBuffer b = Backend::AllocateLogits(floats);
    std::lock_guard<std::mutex> lock(mu_);
    logits_begin_ = b.get();
    logits_end_ = b.get() + floats;
    return b;
  }
  absl::Status KeepFirst(SequenceSlot, int64_t) override {
    return absl::UnimplementedError("fake backend: no speculation");
  }
  StateUsage state_usage() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return StateUsage{static_cast<int64_t>(slots_.size()), 0};
  }
  ExpertPlacementTotals placement() const override { return {}; }

  // Between Hold() and Release() a step waits before it touches anything: a test can queue several
  // requests before the engine's first step returns, whatever the threads' timing.
  void Hold() {
    std::lock_guard<std::mutex> gate(gate_mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> gate(gate_mu_);
      held_ = false;
    }
    gate_cv_.notify_all();
  }

  // Token counts of every step so far, per input.
  std::vector<std::vector<int64_t>> batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  // When > 0, EOS is the most likely token once a sequence holds this many tokens.
  std::atomic<int64_t> eos_at_length{0};
  // When > 0, a step that would make the live slots hold more tokens than this fails with
  // ResourceExhausted and changes nothing; exhausted_steps counts those.
  std::atomic<int64_t> token_capacity{0};
  std::atomic<int64_t> exhausted_steps{0};
  // AllocateLogits calls; when refuse_logits, it returns null (no host memory).
  std::atomic<int64_t> logits_allocations{0};
  std::atomic<bool> refuse_logits{false};
  std::atomic<int64_t> foreign_logits{0};
  // When > 0, every step takes at least this long (a slow backend for the deadline tests).
  std::atomic<int64_t> step_sleep_ms{0};

 private:
  // Logits from a hash of the whole history; EOS far down unless eos_at_length says otherwise.
  void Logits(const std::vector<int32_t>& history, float* out) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : history) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    for (int64_t v = 0; v < config_.vocab; ++v) {
      uint64_t x = (h + static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull);
      x ^= x >> 29;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 32;
      out[v] = static_cast<float>(x % 10000) / 1000.0f;  // 0 .. 10
    }
    const int32_t eos = *tokenizer_->eos_id();
    const int64_t at = eos_at_length.load();
    out[eos] = at > 0 && static_cast<int64_t>(history.size()) >= at ? 100.0f : -100.0f;
    // Keep the other control tokens out of generations too.
    for (int64_t v = 0; v < config_.vocab; ++v) {
      if (v != eos && tokenizer_->IsControl(static_cast<int32_t>(v))) out[v] = -100.0f;
    }
  }

  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  mutable std::mutex mu_;
  std::mutex gate_mu_;  // Hold / Release
  std::condition_variable gate_cv_;
  bool held_ = false;
  std::map<SequenceSlot, std::vector<int32_t>> slots_;
  SequenceSlot next_ = 1;
  std::vector<std::vector<int64_t>> batches_;
  const float* logits_begin_ = nullptr;  // the last AllocateLogits buffer
  const float* logits_end_ = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_TESTS_SERVICE_FAKE_BACKEND_H_
