// Validates one request against the channel's capacities and the worker's model, before the
// worker touches any memory the request points at.
//
// The request lives in memory the client can still write. The validator works on a snapshot: the
// caller copies the RequestHeader, then (once pair_count is known to fit) the pairs, and
// validates and computes with the copies only.
#ifndef TANDEM_HOST_EXPERT_WORKER_CHANNEL_REQUEST_VALIDATOR_H_
#define TANDEM_HOST_EXPERT_WORKER_CHANNEL_REQUEST_VALIDATOR_H_

#include <span>
#include <string>

#include "common/offload/channel_layout.h"
#include "host_expert_worker/channel/expert_row_computer.h"

namespace tandem {

struct RequestVerdict {
  ReplyStatus status = ReplyStatus::kOk;
  std::string message;  // names the bad field (and the pair index) when status != kOk
};

// Checks everything in the header except the pairs: version, fingerprint, flags, layer, counts,
// and the output range (output_offset + pair_count rows must lie inside the outputs region).
RequestVerdict ValidateRequestHeader(const RequestHeader& request, const ChannelView& channel,
                                     const ExpertModelShape& shape);

// Checks each pair: expert inside the worker's held range, row < activation_row_count.
RequestVerdict ValidateRequestPairs(std::span<const ExpertRowPair> pairs,
                                    uint32_t activation_row_count, const ExpertModelShape& shape);

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_CHANNEL_REQUEST_VALIDATOR_H_
