#include "gpu_service/offload/offload_client.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

WorkerState LoadState(ChannelHeader& header) {
  return static_cast<WorkerState>(
      AtomicWord(header.worker_state).load(std::memory_order_acquire));
}

absl::Status ReplyError(ReplyStatus status, uint64_t sequence, const char* message) {
  const std::string text = absl::StrCat("worker rejected request #", sequence, " (",
                                        std::string(ReplyStatusName(status)), "): ", message);
  return status == ReplyStatus::kComputeFailed ? absl::InternalError(text)
                                               : absl::InvalidArgumentError(text);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OffloadClient>> OffloadClient::Create(
    const OffloadClientOptions& options) {
  absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(options.capacities);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<std::unique_ptr<SharedSegment>> segment =
      SharedSegment::Create(layout->segment_bytes);
  if (!segment.ok()) return segment.status();
  absl::StatusOr<ChannelView> view =
      ChannelView::Initialize((*segment)->data(), (*segment)->size(), options.capacities,
                              options.model_fingerprint, static_cast<int32_t>(getpid()));
  if (!view.ok()) return view.status();
  auto client = std::unique_ptr<OffloadClient>(
      new OffloadClient(options, *std::move(segment), *view));
  if (!options.worker_path.empty()) {
    // Start the worker now, so that its start-up overlaps with the service's own; how it went
    // is reported by WaitUntilReady.
    if (absl::Status s = client->SpawnWorker(); !s.ok()) return s;
  }
  return client;
}

OffloadClient::OffloadClient(const OffloadClientOptions& options,
                             std::unique_ptr<SharedSegment> segment, ChannelView view)
    : options_(options), segment_(std::move(segment)), view_(view) {}

OffloadClient::~OffloadClient() {
  ChannelHeader& header = view_.header();
  AtomicWord(header.stop_requested).store(1, std::memory_order_release);
  WakeSequenceWaiters(&header.request_seq);
  if (process_ != nullptr) {
    const absl::Time give_up = absl::Now() + options_.terminate_grace;
    while (!process_->HasExited() && absl::Now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    process_->Terminate(absl::ZeroDuration());
  }
}

void OffloadClient::ResetChannelForNewWorker() {
  ChannelHeader& header = view_.header();
  AtomicWord(header.attach_epoch).fetch_add(1, std::memory_order_acq_rel);
  AtomicWord(header.worker_pid).store(0, std::memory_order_relaxed);
  header.worker_message[0] = '\0';
  AtomicWord(header.worker_state)
      .store(static_cast<uint32_t>(WorkerState::kEmpty), std::memory_order_release);
}

void OffloadClient::Disconnect() {
  connected_ = false;
  in_flight_sequence_ = 0;
  worker_pid_ = 0;
  // A spawned worker that is still running (e.g. a hung one) is replaced: kill it.
  if (process_ != nullptr) {
    process_->Terminate(absl::ZeroDuration());
    process_.reset();
  }
  ResetChannelForNewWorker();
}

absl::Status OffloadClient::SpawnWorker() {
  ResetChannelForNewWorker();
  std::vector<std::string> args = options_.worker_args;
  args.push_back(absl::StrCat("--channel=", channel_name()));
  absl::StatusOr<std::unique_ptr<WorkerProcess>> process =
      WorkerProcess::Spawn(options_.worker_path, args);
  if (!process.ok()) return process.status();
  process_ = *std::move(process);
  return absl::OkStatus();
}

absl::Status OffloadClient::TryConnect() {
  if (connected_) return absl::OkStatus();
  ChannelHeader& header = view_.header();
  const bool spawn_mode = !options_.worker_path.empty();
  if (spawn_mode && process_ == nullptr) {
    if (absl::Status s = SpawnWorker(); !s.ok()) return s;
  }
  switch (LoadState(header)) {
    case WorkerState::kReady: {
      connected_ = true;
      worker_pid_ = AtomicWord(header.worker_pid).load(std::memory_order_relaxed);
      next_sequence_ = AtomicWord(header.request_seq).load(std::memory_order_relaxed);
      in_flight_sequence_ = 0;
      return absl::OkStatus();
    }
    case WorkerState::kRefused: {
      std::string reason(header.worker_message,
                         strnlen(header.worker_message, sizeof(header.worker_message)));
      if (process_ != nullptr) {  // a refusing spawned worker exits; do not respawn in a loop
        process_->Terminate(absl::ZeroDuration());
      }
      return absl::FailedPreconditionError(
          absl::StrCat("worker refused channel ", channel_name(), ": ", reason));
    }
    case WorkerState::kExited:
      Disconnect();
      return absl::UnavailableError(
          absl::StrCat("the worker of channel ", channel_name(), " stopped serving"));
    default:
      break;
  }
  if (spawn_mode && process_->HasExited()) {
    const std::string how = process_->ExitDescription();
    process_.reset();
    return absl::UnavailableError(absl::StrCat("worker ", options_.worker_path,
                                               " exited during start-up: ", how));
  }
  return absl::UnavailableError(
      absl::StrCat("no worker serves channel ", channel_name(), " yet"));
}

absl::Status OffloadClient::WaitUntilReady(absl::Time deadline) {
  for (;;) {
    absl::Status s = TryConnect();
    if (s.ok() || absl::IsFailedPrecondition(s)) return s;
    // A spawned worker that exited during start-up is not restarted in a loop.
    if (!options_.worker_path.empty() && process_ == nullptr) return s;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("waiting for a worker: ", s.message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool OffloadClient::WorkerDead(std::string* why) {
  ChannelHeader& header = view_.header();
  if (process_ != nullptr && process_->HasExited()) {
    *why = absl::StrCat("worker pid ", worker_pid_, " exited (", process_->ExitDescription(), ")");
    return true;
  }
  if (LoadState(header) != WorkerState::kReady) {
    *why = absl::StrCat("worker pid ", worker_pid_, " left the channel");
    return true;
  }
  if (worker_pid_ > 0 && kill(worker_pid_, 0) != 0 && errno == ESRCH) {
    *why = absl::StrCat("worker pid ", worker_pid_, " is gone");
    return true;
  }
  // A spawned worker's death is known exactly from waitpid above. A connected worker that died
  // is a zombie of someone else until reaped and still passes kill(pid, 0): the heartbeat covers
  // that case (and a hung process).
  if (process_ != nullptr) return false;
  const uint64_t beat = AtomicWord(header.heartbeat).load(std::memory_order_relaxed);
  const absl::Time now = absl::Now();
  if (beat != last_heartbeat_) {
    last_heartbeat_ = beat;
    last_heartbeat_change_ = now;
  } else if (now - last_heartbeat_change_ > options_.heartbeat_timeout) {
    *why = absl::StrCat("worker pid ", worker_pid_, " has no heartbeat for ",
                        absl::FormatDuration(now - last_heartbeat_change_));
    return true;
  }
  return false;
}

absl::Status OffloadClient::Send(const OffloadRequest& request) {
  if (!connected_) {
    if (absl::Status s = TryConnect(); !s.ok()) return s;
  }
  if (in_flight_sequence_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request #", in_flight_sequence_, " is still in flight; Wait for it before sending"));
  }
  const ChannelCapacities& caps = view_.capacities();
  const uint64_t h = caps.hidden_size;
  if (request.pairs.size() > caps.max_pairs) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", request.pairs.size(),
                                                   " pairs; the channel holds ", caps.max_pairs));
  }
  if (request.activations.size() % h != 0) {
    return absl::InvalidArgumentError(absl::StrCat("request activations hold ",
                                                   request.activations.size(),
                                                   " floats, not a multiple of hidden_size ", h));
  }
  const uint64_t rows = request.activations.size() / h;
  if (rows > caps.max_activation_rows) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", rows,
                                                   " activation rows; the channel holds ",
                                                   caps.max_activation_rows));
  }
  if (!request.pairs.empty()) {  // memcpy's pointers must be non-null even for 0 bytes
    std::memcpy(view_.pairs(), request.pairs.data(), request.pairs.size_bytes());
  }
  if (!request.activations.empty()) {
    std::memcpy(view_.activations(), request.activations.data(),
                request.activations.size_bytes());
  }
  const uint64_t sequence = ++next_sequence_;
  RequestHeader& out = view_.request();
  out.protocol_version = kChannelProtocolVersion;
  out.flags = request.exact ? kRequestFlagExact : 0;
  out.fingerprint = view_.fingerprint();
  out.sequence = sequence;
  out.layer = request.layer;
  out.pair_count = static_cast<uint32_t>(request.pairs.size());
  out.activation_row_count = static_cast<uint32_t>(rows);
  out.reserved = 0;
  out.output_offset = 0;

  ChannelHeader& header = view_.header();
  last_heartbeat_ = AtomicWord(header.heartbeat).load(std::memory_order_relaxed);
  last_heartbeat_change_ = absl::Now();
  in_flight_sequence_ = sequence;
  PublishSequence(&header.request_seq, &header.request_waiters, sequence);
  return absl::OkStatus();
}

absl::StatusOr<OffloadReply> OffloadClient::Wait(absl::Time deadline) {
  if (in_flight_sequence_ == 0) {
    return absl::FailedPreconditionError("no request in flight");
  }
  const uint64_t sequence = in_flight_sequence_;
  ChannelHeader& header = view_.header();
  std::string why;
  const DoorbellWait result =
      WaitForSequence(&header.reply_seq, &header.reply_waiters, sequence, deadline,
                      options_.wait, [&] { return WorkerDead(&why); });
  if (result == DoorbellWait::kDeadline) {
    // A worker that is alive (its heartbeat moves) but does not answer is stuck: waiting longer
    // would stall every later step. Give it up like a dead one: a spawned worker is killed and
    // started again by the next WaitUntilReady, a connected one must be restarted by hand (the
    // channel is reset, so a late reply from it is never taken for a new request's).
    const pid_t stuck = worker_pid_;
    Disconnect();
    return absl::UnavailableError(absl::StrCat("worker pid ", stuck, " did not answer request #", sequence,
                                               " by the deadline; it was given up",
                                               options_.worker_path.empty() ? " (start it again to reconnect)"
                                                                            : " and is being restarted"));
  }
  if (result == DoorbellWait::kAborted) {
    Disconnect();
    return absl::UnavailableError(absl::StrCat(why, " while request #", sequence, " was pending"));
  }
  in_flight_sequence_ = 0;
  const ReplyHeader& reply = view_.reply();
  if (reply.sequence != sequence) {
    return absl::InternalError(absl::StrCat("reply answers request #", reply.sequence,
                                            ", expected #", sequence));
  }
  const auto status = static_cast<ReplyStatus>(reply.status);
  if (status != ReplyStatus::kOk) {
    char message[sizeof(reply.message)];
    CopyMessage(std::string_view(reply.message, strnlen(reply.message, sizeof(reply.message))),
                message, sizeof(message));
    return ReplyError(status, sequence, message);
  }
  const uint32_t pairs = view_.request().pair_count;  // ours: the worker never writes it
  if (reply.pair_count != pairs) {
    return absl::InternalError(absl::StrCat("reply carries ", reply.pair_count,
                                            " rows for a request of ", pairs, " pairs"));
  }
  OffloadReply out;
  out.pair_count = pairs;
  out.worker_compute_ns = static_cast<int64_t>(reply.compute_ns);
  out.outputs = std::span<const float>(view_.outputs(),
                                       size_t{pairs} * view_.capacities().hidden_size);
  return out;
}

absl::StatusOr<OffloadReply> OffloadClient::Call(const OffloadRequest& request,
                                                 std::span<float> outputs, absl::Time deadline) {
  const size_t needed = request.pairs.size() * view_.capacities().hidden_size;
  if (outputs.size() != needed) {
    return absl::InvalidArgumentError(absl::StrCat("outputs hold ", outputs.size(),
                                                   " floats; the request needs ", needed));
  }
  if (in_flight_sequence_ != 0) {  // a Send without its Wait: collect that reply first
    absl::StatusOr<OffloadReply> stale = Wait(deadline);
    if (!stale.ok() && absl::IsUnavailable(stale.status())) return stale.status();
  }
  if (absl::Status s = Send(request); !s.ok()) return s;
  absl::StatusOr<OffloadReply> reply = Wait(deadline);
  if (!reply.ok()) return reply.status();
  if (!reply->outputs.empty()) {
    std::memcpy(outputs.data(), reply->outputs.data(), reply->outputs.size_bytes());
  }
  reply->outputs = {};
  return reply;
}

bool OffloadClient::WorkerSleeping() const {
  return AtomicWord(view_.header().request_waiters).load(std::memory_order_acquire) != 0;
}

}  // namespace tandem
