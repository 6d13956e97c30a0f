#include "host_expert_worker/channel/channel_server.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stop_token>
#include <thread>

#include "absl/strings/str_cat.h"
#include "host_expert_worker/channel/request_validator.h"

namespace tandem {
namespace {

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool ProcessIsGone(int32_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// Checks the model fields of a claimed segment; empty string when they match.
std::string ModelMismatch(const ChannelView& view, const ExpertModelShape& shape) {
  const ChannelCapacities& caps = view.capacities();
  if (view.fingerprint() != shape.fingerprint) {
    return absl::StrCat("model fingerprint mismatch: the service's model is ",
                        absl::Hex(view.fingerprint()), ", this worker's is ",
                        absl::Hex(shape.fingerprint));
  }
  if (caps.layer_count != shape.layer_count) {
    return absl::StrCat("layer_count mismatch: segment ", caps.layer_count, ", worker ",
                        shape.layer_count);
  }
  if (caps.expert_count != shape.expert_count) {
    return absl::StrCat("expert_count mismatch: segment ", caps.expert_count, ", worker ",
                        shape.expert_count);
  }
  if (caps.hidden_size != shape.hidden_size) {
    return absl::StrCat("hidden_size mismatch: segment ", caps.hidden_size, ", worker ",
                        shape.hidden_size);
  }
  if (shape.expert_begin >= shape.expert_end || shape.expert_end > shape.expert_count) {
    return absl::StrCat("worker's held expert range [", shape.expert_begin, ", ",
                        shape.expert_end, ") is empty or beyond expert_count ",
                        shape.expert_count);
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChannelServer>> ChannelServer::Attach(
    const std::string& channel_name, ExpertRowComputer* computer,
    const ChannelServerOptions& options) {
  absl::StatusOr<std::unique_ptr<SharedSegment>> segment = SharedSegment::Open(channel_name);
  if (!segment.ok()) return segment.status();
  absl::StatusOr<ChannelView> view = ChannelView::Open((*segment)->data(), (*segment)->size());
  if (!view.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("channel ", channel_name, ": ", view.status().message()));
  }
  ChannelHeader& header = view->header();

  // Claim the channel: only from a state in which no worker serves it.
  std::atomic_ref<uint32_t> state(header.worker_state);
  uint32_t observed = state.load(std::memory_order_acquire);
  for (;;) {
    if (observed == static_cast<uint32_t>(WorkerState::kAttaching) ||
        observed == static_cast<uint32_t>(WorkerState::kReady)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "channel ", channel_name, " is already served by worker pid ",
          AtomicWord(header.worker_pid).load(std::memory_order_relaxed)));
    }
    if (state.compare_exchange_weak(observed, static_cast<uint32_t>(WorkerState::kAttaching),
                                    std::memory_order_acq_rel)) {
      break;
    }
  }
  const uint64_t epoch = AtomicWord(header.attach_epoch).load(std::memory_order_acquire);
  AtomicWord(header.worker_pid).store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);

  const std::string mismatch = ModelMismatch(*view, computer->shape());
  if (!mismatch.empty()) {
    CopyMessage(mismatch, header.worker_message, sizeof(header.worker_message));
    state.store(static_cast<uint32_t>(WorkerState::kRefused), std::memory_order_release);
    return absl::FailedPreconditionError(
        absl::StrCat("refusing channel ", channel_name, ": ", mismatch));
  }
  return std::unique_ptr<ChannelServer>(
      new ChannelServer(*std::move(segment), *view, computer, options, epoch));
}

ChannelServer::ChannelServer(std::unique_ptr<SharedSegment> segment, ChannelView view,
                             ExpertRowComputer* computer, const ChannelServerOptions& options,
                             uint64_t epoch)
    : segment_(std::move(segment)),
      view_(view),
      computer_(computer),
      options_(options),
      epoch_(epoch),
      pairs_(view.capacities().max_pairs) {}

ChannelServer::~ChannelServer() = default;

void ChannelServer::Stop() {
  stop_.store(true, std::memory_order_release);
  WakeSequenceWaiters(&view_.header().request_seq);
}

ChannelServer::StopReason ChannelServer::CheckStop() const {
  ChannelHeader& header = view_.header();
  if (stop_.load(std::memory_order_acquire) ||
      AtomicWord(header.stop_requested).load(std::memory_order_acquire) != 0) {
    return StopReason::kStopped;
  }
  if (AtomicWord(header.attach_epoch).load(std::memory_order_acquire) != epoch_) {
    return StopReason::kReplaced;
  }
  if (ProcessIsGone(header.client_pid)) return StopReason::kClientGone;
  return StopReason::kNone;
}

absl::Status ChannelServer::Serve() {
  ChannelHeader& header = view_.header();
  // The heartbeat has its own thread so that a long computation does not look like a dead worker.
  std::jthread heartbeat([&header, interval = options_.heartbeat_interval](std::stop_token stop) {
    while (!stop.stop_requested()) {
      AtomicWord(header.heartbeat).fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(interval));
    }
  });

  // Requests published before this worker attached belong to a previous worker: skip them.
  uint64_t last = AtomicWord(header.request_seq).load(std::memory_order_acquire);
  PublishSequence(&header.reply_seq, &header.reply_waiters, last);
  AtomicWord(header.worker_state)
      .store(static_cast<uint32_t>(WorkerState::kReady), std::memory_order_release);

  StopReason reason = StopReason::kNone;
  for (;;) {
    const DoorbellWait result = WaitForSequence(
        &header.request_seq, &header.request_waiters, last + 1, absl::InfiniteFuture(),
        options_.wait, [&] { return (reason = CheckStop()) != StopReason::kNone; });
    if (result == DoorbellWait::kAborted) break;
    const uint64_t sequence = AtomicWord(header.request_seq).load(std::memory_order_acquire);
    Answer(sequence);
    last = sequence;
  }

  if (reason != StopReason::kReplaced) {
    AtomicWord(header.worker_state)
        .store(static_cast<uint32_t>(WorkerState::kExited), std::memory_order_release);
  }
  switch (reason) {
    case StopReason::kClientGone:
      return absl::UnavailableError(
          absl::StrCat("the service (pid ", header.client_pid, ") is gone"));
    case StopReason::kReplaced:
      return absl::AbortedError("the service handed the channel to another worker");
    default:
      return absl::OkStatus();
  }
}

void ChannelServer::Answer(uint64_t sequence) {
  const int64_t start = MonotonicNanos();
  ChannelHeader& header = view_.header();
  // Snapshot: validate and compute with private copies, never re-reading the shared fields.
  RequestHeader request;
  std::memcpy(&request, &view_.request(), sizeof(request));
  const ExpertModelShape& shape = computer_->shape();

  RequestVerdict verdict = ValidateRequestHeader(request, view_, shape);
  if (verdict.status == ReplyStatus::kOk) {
    std::memcpy(pairs_.data(), view_.pairs(), size_t{request.pair_count} * sizeof(ExpertRowPair));
    verdict = ValidateRequestPairs(std::span(pairs_.data(), request.pair_count),
                                   request.activation_row_count, shape);
  }
  if (verdict.status == ReplyStatus::kOk && request.pair_count > 0) {
    ExpertBatch batch;
    batch.layer = request.layer;
    batch.pairs = std::span<const ExpertRowPair>(pairs_.data(), request.pair_count);
    batch.activations = view_.activations();
    batch.activation_row_count = request.activation_row_count;
    batch.hidden_size = view_.capacities().hidden_size;
    batch.exact = (request.flags & kRequestFlagExact) != 0;
    float* outputs = view_.outputs() + request.output_offset / sizeof(float);
    if (absl::Status s = computer_->Compute(batch, outputs); !s.ok()) {
      verdict = {ReplyStatus::kComputeFailed, std::string(s.message())};
    }
  }

  ReplyHeader& reply = view_.reply();
  reply.status = static_cast<uint32_t>(verdict.status);
  reply.pair_count = verdict.status == ReplyStatus::kOk ? request.pair_count : 0;
  reply.sequence = sequence;
  CopyMessage(verdict.message, reply.message, sizeof(reply.message));
  reply.compute_ns = static_cast<uint64_t>(MonotonicNanos() - start);
  served_.fetch_add(1, std::memory_order_relaxed);
  PublishSequence(&header.reply_seq, &header.reply_waiters, sequence);
}

}  // namespace tandem
