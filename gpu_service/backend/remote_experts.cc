#include "gpu_service/backend/remote_experts.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/offload/model_fingerprint.h"

namespace tandem {
namespace {

// How often an idle recovery thread checks that the workers are alive (an empty request each),
// so that a worker lost between requests turns health NOT_SERVING without waiting for traffic.
constexpr auto kIdleProbeInterval = std::chrono::milliseconds(500);
// Pause after a worker refused its channel or exited during start-up, so that a worker that
// cannot start is not respawned in a tight loop.
constexpr auto kRestartBackoff = std::chrono::milliseconds(500);

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostExpertWorkers>> HostExpertWorkers::Start(
    const GgufFile& file, const ModelConfig& config, uint32_t layer_count,
    HostExpertWorkersOptions options) {
  if (options.workers.empty()) return absl::InvalidArgumentError("no host workers given");
  if (options.max_rows_per_request < 1) {
    return absl::InvalidArgumentError("max_rows_per_request must be >= 1");
  }
  absl::StatusOr<uint64_t> fingerprint = ExpertTensorsFingerprint(file, layer_count);
  if (!fingerprint.ok()) return fingerprint.status();
  const uint32_t experts = static_cast<uint32_t>(config.moe.E);
  const uint32_t k = static_cast<uint32_t>(std::max<int64_t>(config.moe.K, 1));
  const uint32_t n = static_cast<uint32_t>(options.workers.size());
  if (n > experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " host workers for ", experts, " routed experts: at most one per expert"));
  }
  ChannelCapacities caps;
  caps.max_activation_rows = options.max_rows_per_request;
  caps.max_pairs = options.max_rows_per_request * k;
  caps.max_output_rows = caps.max_pairs;
  caps.hidden_size = static_cast<uint32_t>(config.h);
  caps.layer_count = layer_count;
  caps.expert_count = experts;
  const std::vector<ExpertRange> ranges = SplitExpertRanges(experts, n);
  std::vector<WorkerShare> shares;
  for (uint32_t i = 0; i < n; ++i) {
    const RemoteWorkerSpec& spec = options.workers[i];
    if (spec.share_count != static_cast<int>(n) || spec.share_index != static_cast<int>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", i, " has share ",
                                                     spec.share_text(), "; expected ", i, "/", n));
    }
    WorkerShare share;
    share.experts = ranges[i];
    share.client.capacities = caps;
    share.client.model_fingerprint = *fingerprint;
    if (spec.spawn) {
      if (options.worker_binary.empty()) {
        return absl::InvalidArgumentError("--worker-binary: no worker executable given");
      }
      share.client.worker_path = options.worker_binary;
      share.client.worker_args = WorkerArguments(spec, options.model_path, options.exact);
      share.client.worker_args.insert(share.client.worker_args.end(), options.extra_worker_args.begin(),
                                      options.extra_worker_args.end());
    }
    shares.push_back(std::move(share));
  }
  absl::StatusOr<std::unique_ptr<MultiWorkerClient>> client =
      MultiWorkerClient::Create(std::move(shares));
  if (!client.ok()) return client.status();
  return std::unique_ptr<HostExpertWorkers>(new HostExpertWorkers(
      std::move(options), caps.hidden_size, k, *std::move(client)));
}

HostExpertWorkers::HostExpertWorkers(HostExpertWorkersOptions options, uint32_t hidden,
                                     uint32_t experts_per_token,
                                     std::unique_ptr<MultiWorkerClient> client)
    : options_(std::move(options)),
      hidden_(hidden),
      experts_per_token_(experts_per_token),
      client_(std::move(client)),
      known_pids_(client_->worker_count(), 0) {}

HostExpertWorkers::~HostExpertWorkers() {
  {
    std::lock_guard<std::mutex> lock(recovery_mu_);
    stopping_ = true;
  }
  recovery_cv_.notify_all();
  if (recovery_.joinable()) recovery_.join();
  std::lock_guard<std::mutex> lock(mu_);
  client_.reset();  // stops the workers
}

void HostExpertWorkers::SetAvailabilityListener(std::function<void(bool)> listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(listener);
  if (listener_) listener_(available());
}

std::vector<HostExpertWorkers::WorkerStatus> HostExpertWorkers::worker_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerStatus> out;
  for (size_t i = 0; i < client_->worker_count(); ++i) {
    OffloadClient& w = client_->worker(i);
    out.push_back({options_.workers[i].share_text(), w.channel_name(), options_.workers[i].spawn,
                   w.connected() ? w.worker_pid() : 0});
  }
  return out;
}

void HostExpertWorkers::LogReadyWorkers() {
  for (size_t i = 0; i < client_->worker_count(); ++i) {
    OffloadClient& w = client_->worker(i);
    if (!w.connected() || w.worker_pid() == known_pids_[i]) continue;
    known_pids_[i] = w.worker_pid();
    if (options_.log) {
      options_.log("worker_ready",
                   absl::StrCat("\"share\":\"", options_.workers[i].share_text(), "\",\"pid\":",
                                w.worker_pid(), ",\"channel\":", JsonString(w.channel_name()),
                                ",\"spawned\":", options_.workers[i].spawn ? "true" : "false",
                                ",\"exact\":", options_.exact ? "true" : "false"));
    }
  }
}

absl::Status HostExpertWorkers::WaitUntilReady(absl::Time deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status s = client_->WaitUntilReady(deadline);
    if (!s.ok()) return s;
    LogReadyWorkers();
  }
  available_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(listener_mu_);
    if (listener_) listener_(true);
  }
  std::lock_guard<std::mutex> lock(recovery_mu_);
  if (!recovery_.joinable()) recovery_ = std::thread([this] { RecoveryLoop(); });
  return absl::OkStatus();
}

void HostExpertWorkers::MarkLost(const absl::Status& why) {
  if (!available_.exchange(false, std::memory_order_acq_rel)) return;
  losses_.fetch_add(1, std::memory_order_acq_rel);
  std::fill(known_pids_.begin(), known_pids_.end(), 0);  // log every worker again on recovery
  if (options_.log) {
    options_.log("worker_lost", absl::StrCat("\"reason\":", JsonString(std::string(why.message()))));
  }
  {
    std::lock_guard<std::mutex> lock(listener_mu_);
    if (listener_) listener_(false);
  }
  recovery_cv_.notify_all();
}

void HostExpertWorkers::RecoveryLoop() {
  std::unique_lock<std::mutex> recovery_lock(recovery_mu_);
  while (!stopping_) {
    if (available()) {
      // Idle probe: an empty request to every worker, unless a step is using the client.
      recovery_cv_.wait_for(recovery_lock, kIdleProbeInterval);
      if (stopping_ || !available()) continue;
      std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
      if (!lock.owns_lock()) continue;  // a step is running: it will notice a loss itself
      const absl::Time deadline = absl::Now() + absl::Seconds(1);
      for (size_t i = 0; i < client_->worker_count(); ++i) {
        absl::StatusOr<OffloadReply> r =
            client_->worker(i).Call(OffloadRequest{}, std::span<float>(), deadline);
        if (!r.ok() && absl::IsUnavailable(r.status())) {
          MarkLost(r.status());
          break;
        }
      }
      continue;
    }
    recovery_lock.unlock();
    absl::Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = client_->WaitUntilReady(absl::Now() + absl::Milliseconds(50));
      if (s.ok()) {
        LogReadyWorkers();
        available_.store(true, std::memory_order_release);
      }
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(listener_mu_);
      if (listener_) listener_(true);
    } else if (!absl::IsDeadlineExceeded(s)) {
      // Refused, or exited during start-up: try again after a pause (the next attempt respawns).
      if (options_.log) {
        options_.log("worker_restart_failed",
                     absl::StrCat("\"reason\":", JsonString(std::string(s.message()))));
      }
      recovery_lock.lock();
      recovery_cv_.wait_for(recovery_lock, kRestartBackoff);
      continue;
    }
    recovery_lock.lock();
  }
}

absl::Status HostExpertWorkers::Run(int64_t layer, std::span<const ExpertWork> work,
                                    const float* x, int64_t h, float* out) {
  if (h != hidden_) {
    return absl::InvalidArgumentError(
        absl::StrCat("host workers: rows of ", h, " floats; the channel holds ", hidden_));
  }
  if (!available()) {
    return absl::UnavailableError("a host expert worker is lost and is being restarted");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const uint32_t max_rows = options_.max_rows_per_request;
  const size_t max_pairs = size_t{max_rows} * experts_per_token_;
  size_t begin = 0;
  pairs_.clear();
  rows_.clear();
  chunk_index_.clear();
  auto flush = [&]() -> absl::Status {
    if (pairs_.empty()) return absl::OkStatus();
    OffloadRequest request{static_cast<uint32_t>(layer), pairs_, rows_, options_.exact};
    absl::StatusOr<OffloadReply> reply = client_->Call(
        request, std::span<float>(out + begin * hidden_, pairs_.size() * hidden_), deadline);
    if (reply.ok()) activation_bytes_ += reply->activation_bytes;
    for (size_t i : chunk_index_) row_of_token_[static_cast<size_t>(work[i].token)] = -1;
    begin += pairs_.size();
    pairs_.clear();
    rows_.clear();
    chunk_index_.clear();
    if (!reply.ok()) {
      if (absl::IsUnavailable(reply.status())) MarkLost(reply.status());
      return absl::Status(reply.status().code(),
                          absl::StrCat("host workers, layer ", layer, ": ",
                                       reply.status().message()));
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < work.size(); ++i) {
    const int64_t token = work[i].token;
    if (token < 0 || work[i].expert < 0) {
      return absl::InvalidArgumentError(absl::StrCat("host workers: work ", i, " has token ",
                                                     token, ", expert ", work[i].expert));
    }
    if (static_cast<size_t>(token) >= row_of_token_.size()) {
      row_of_token_.resize(static_cast<size_t>(token) + 1, -1);
    }
    const bool new_row = row_of_token_[static_cast<size_t>(token)] < 0;
    if (pairs_.size() == max_pairs || (new_row && rows_.size() / hidden_ == max_rows)) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
    int64_t& row = row_of_token_[static_cast<size_t>(token)];
    if (row < 0) {
      row = static_cast<int64_t>(rows_.size() / hidden_);
      const float* src = x + token * h;
      rows_.insert(rows_.end(), src, src + h);
    }
    pairs_.push_back({static_cast<uint32_t>(work[i].expert), static_cast<uint32_t>(row)});
    chunk_index_.push_back(i);
  }
  return flush();
}

}  // namespace tandem
