#include "gpu_service/offload/multi_worker_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {

std::vector<ExpertRange> SplitExpertRanges(uint32_t expert_count, uint32_t parts) {
  std::vector<ExpertRange> ranges;
  for (uint32_t k = 0; k < parts; ++k) {
    ranges.push_back({static_cast<uint32_t>(uint64_t{k} * expert_count / parts),
                      static_cast<uint32_t>(uint64_t{k + 1} * expert_count / parts)});
  }
  return ranges;
}

absl::StatusOr<std::unique_ptr<MultiWorkerClient>> MultiWorkerClient::Create(
    std::vector<WorkerShare> shares) {
  if (shares.empty()) return absl::InvalidArgumentError("no worker shares");
  const ChannelCapacities& caps = shares[0].client.capacities;
  uint32_t next = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    const ExpertRange& r = shares[i].experts;
    const ChannelCapacities& c = shares[i].client.capacities;
    if (r.begin != next || r.end <= r.begin) {
      return absl::InvalidArgumentError(absl::StrCat("share ", i, " holds experts [", r.begin,
                                                     ", ", r.end, "); expected to start at ",
                                                     next, " and be non-empty"));
    }
    if (c.max_pairs != caps.max_pairs || c.max_activation_rows != caps.max_activation_rows ||
        c.hidden_size != caps.hidden_size || c.max_output_rows != caps.max_output_rows ||
        c.layer_count != caps.layer_count || c.expert_count != caps.expert_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("share ", i, " has different channel capacities than share 0"));
    }
    next = r.end;
  }
  if (next != caps.expert_count) {
    return absl::InvalidArgumentError(absl::StrCat("shares cover experts [0, ", next,
                                                   ") of expert_count ", caps.expert_count));
  }
  auto multi = std::unique_ptr<MultiWorkerClient>(new MultiWorkerClient());
  multi->hidden_size_ = caps.hidden_size;
  multi->owner_.resize(caps.expert_count);
  multi->local_row_.assign(caps.max_activation_rows, -1);
  for (size_t i = 0; i < shares.size(); ++i) {
    absl::StatusOr<std::unique_ptr<OffloadClient>> client =
        OffloadClient::Create(shares[i].client);
    if (!client.ok()) return client.status();
    Worker w;
    w.experts = shares[i].experts;
    w.client = *std::move(client);
    for (uint32_t e = w.experts.begin; e < w.experts.end; ++e) {
      multi->owner_[e] = static_cast<uint32_t>(i);
    }
    multi->workers_.push_back(std::move(w));
  }
  return multi;
}

absl::Status MultiWorkerClient::WaitUntilReady(absl::Time deadline) {
  for (Worker& w : workers_) {
    if (absl::Status s = w.client->WaitUntilReady(deadline); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<OffloadReply> MultiWorkerClient::Call(const OffloadRequest& request,
                                                     std::span<float> outputs,
                                                     absl::Time deadline) {
  const size_t h = hidden_size_;
  if (request.activations.size() % h != 0) {
    return absl::InvalidArgumentError(absl::StrCat("request activations hold ",
                                                   request.activations.size(),
                                                   " floats, not a multiple of hidden_size ", h));
  }
  const size_t rows = request.activations.size() / h;
  if (rows > local_row_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("request has ", rows,
                                                   " activation rows; channels hold ",
                                                   local_row_.size()));
  }
  if (outputs.size() != request.pairs.size() * h) {
    return absl::InvalidArgumentError(absl::StrCat("outputs hold ", outputs.size(),
                                                   " floats; the request needs ",
                                                   request.pairs.size() * h));
  }
  // Split by owner (checking the indices this client itself uses to split).
  for (Worker& w : workers_) {
    w.pairs.clear();
    w.original_index.clear();
    w.sent = false;
  }
  for (size_t i = 0; i < request.pairs.size(); ++i) {
    const ExpertRowPair& p = request.pairs[i];
    if (p.expert >= owner_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("pair ", i, ": expert ", p.expert,
                                                     " >= expert_count ", owner_.size()));
    }
    if (p.row >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("pair ", i, ": row ", p.row, " >= activation rows ", rows));
    }
    Worker& w = workers_[owner_[p.expert]];
    w.pairs.push_back(p);
    w.original_index.push_back(static_cast<uint32_t>(i));
  }
  // Each worker gets only the rows its pairs reference, renumbered densely.
  absl::Status first_error;
  uint64_t sent_bytes = 0;
  for (Worker& w : workers_) {
    if (w.pairs.empty()) continue;
    w.activations.clear();
    uint32_t local_rows = 0;
    for (ExpertRowPair& p : w.pairs) {
      if (local_row_[p.row] < 0) {
        local_row_[p.row] = static_cast<int32_t>(local_rows++);
        const float* src = request.activations.data() + size_t{p.row} * h;
        w.activations.insert(w.activations.end(), src, src + h);
      }
      p.row = static_cast<uint32_t>(local_row_[p.row]);
    }
    for (size_t i = 0; i < w.pairs.size(); ++i) {  // reset the map for the next worker
      local_row_[request.pairs[w.original_index[i]].row] = -1;
    }
    OffloadRequest part{request.layer, w.pairs, w.activations, request.exact};
    sent_bytes += w.activations.size() * sizeof(float);
    if (absl::Status s = w.client->Send(part); !s.ok()) {
      first_error = s;
      break;
    }
    w.sent = true;
  }
  // Wait for every request sent, even after an error, so no channel is left with one in flight.
  OffloadReply merged;
  merged.pair_count = static_cast<uint32_t>(request.pairs.size());
  merged.activation_bytes = sent_bytes;
  for (Worker& w : workers_) {
    if (!w.sent) continue;
    absl::StatusOr<OffloadReply> reply = w.client->Wait(deadline);
    if (!reply.ok()) {
      if (first_error.ok()) first_error = reply.status();
      continue;
    }
    for (size_t i = 0; i < w.original_index.size(); ++i) {
      std::memcpy(outputs.data() + size_t{w.original_index[i]} * h, reply->outputs.data() + i * h,
                  h * sizeof(float));
    }
    merged.worker_compute_ns = std::max(merged.worker_compute_ns, reply->worker_compute_ns);
  }
  if (!first_error.ok()) return first_error;
  return merged;
}

}  // namespace tandem
