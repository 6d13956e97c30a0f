#include "host_expert_worker/channel/request_validator.h"

#include <cstddef>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

RequestVerdict Reject(ReplyStatus status, std::string message) {
  return RequestVerdict{status, std::move(message)};
}

}  // namespace

RequestVerdict ValidateRequestHeader(const RequestHeader& request, const ChannelView& channel,
                                     const ExpertModelShape& shape) {
  const ChannelCapacities& caps = channel.capacities();
  if (request.protocol_version != kChannelProtocolVersion) {
    return Reject(ReplyStatus::kBadVersion,
                  absl::StrCat("request protocol_version (byte offset ",
                               offsetof(RequestHeader, protocol_version), ") is ",
                               request.protocol_version, "; the worker speaks ",
                               kChannelProtocolVersion));
  }
  if (request.fingerprint != shape.fingerprint) {
    return Reject(ReplyStatus::kBadFingerprint,
                  absl::StrCat("request fingerprint (byte offset ",
                               offsetof(RequestHeader, fingerprint), ") is ",
                               absl::Hex(request.fingerprint), "; the worker's model is ",
                               absl::Hex(shape.fingerprint)));
  }
  if ((request.flags & ~kKnownRequestFlags) != 0) {
    return Reject(ReplyStatus::kBadFlags,
                  absl::StrCat("request flags ", absl::Hex(request.flags), " has unknown bits ",
                               absl::Hex(request.flags & ~kKnownRequestFlags)));
  }
  if (request.layer >= shape.layer_count) {
    return Reject(ReplyStatus::kBadLayer, absl::StrCat("request layer ", request.layer,
                                                       " >= layer_count ", shape.layer_count));
  }
  if (request.pair_count > caps.max_pairs) {
    return Reject(ReplyStatus::kTooManyPairs,
                  absl::StrCat("request pair_count ", request.pair_count, " > max_pairs ",
                               caps.max_pairs));
  }
  if (request.activation_row_count > caps.max_activation_rows) {
    return Reject(ReplyStatus::kTooManyRows,
                  absl::StrCat("request activation_row_count ", request.activation_row_count,
                               " > max_activation_rows ", caps.max_activation_rows));
  }
  const uint64_t outputs_bytes = channel.layout().outputs_bytes;
  const uint64_t needed = uint64_t{request.pair_count} * caps.hidden_size * sizeof(float);
  if (request.output_offset % kChannelAlignment != 0 || request.output_offset > outputs_bytes ||
      needed > outputs_bytes - request.output_offset) {
    return Reject(ReplyStatus::kBadOutputOffset,
                  absl::StrCat("request output_offset ", request.output_offset, " + ", needed,
                               " output bytes does not fit the ", outputs_bytes,
                               "-byte outputs region (or is not a multiple of ",
                               kChannelAlignment, ")"));
  }
  return {};
}

RequestVerdict ValidateRequestPairs(std::span<const ExpertRowPair> pairs,
                                    uint32_t activation_row_count, const ExpertModelShape& shape) {
  for (size_t i = 0; i < pairs.size(); ++i) {
    const ExpertRowPair& p = pairs[i];
    if (p.expert >= shape.expert_count) {
      return Reject(ReplyStatus::kBadExpert, absl::StrCat("pair ", i, ": expert ", p.expert,
                                                          " >= expert_count ", shape.expert_count));
    }
    if (p.expert < shape.expert_begin || p.expert >= shape.expert_end) {
      return Reject(ReplyStatus::kBadExpert,
                    absl::StrCat("pair ", i, ": expert ", p.expert,
                                 " is not held by this worker (it holds [", shape.expert_begin,
                                 ", ", shape.expert_end, "))"));
    }
    if (p.row >= activation_row_count) {
      return Reject(ReplyStatus::kBadRow, absl::StrCat("pair ", i, ": row ", p.row,
                                                       " >= activation_row_count ",
                                                       activation_row_count));
    }
  }
  return {};
}

}  // namespace tandem
