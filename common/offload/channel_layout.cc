#include "common/offload/channel_layout.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

uint64_t AlignUp(uint64_t value) {
  return (value + kChannelAlignment - 1) / kChannelAlignment * kChannelAlignment;
}

absl::Status CheckRange(const char* field, uint32_t value, uint32_t max) {
  if (value == 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("channel capacity ", field, " = ", value, " is outside [1, ", max, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCapacities(const ChannelCapacities& c) {
  if (absl::Status s = CheckRange("max_pairs", c.max_pairs, kMaxChannelPairs); !s.ok()) return s;
  if (absl::Status s = CheckRange("max_activation_rows", c.max_activation_rows, kMaxChannelRows);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("hidden_size", c.hidden_size, kMaxChannelHidden); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("max_output_rows", c.max_output_rows, kMaxChannelPairs);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("layer_count", c.layer_count, 1u << 16); !s.ok()) return s;
  if (absl::Status s = CheckRange("expert_count", c.expert_count, 1u << 20); !s.ok()) return s;
  if (c.max_output_rows < c.max_pairs) {
    return absl::InvalidArgumentError(absl::StrCat("channel capacity max_output_rows = ",
                                                   c.max_output_rows, " is below max_pairs = ",
                                                   c.max_pairs));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChannelLayout> ComputeChannelLayout(const ChannelCapacities& c) {
  if (absl::Status s = ValidateCapacities(c); !s.ok()) return s;
  const uint64_t row_bytes = uint64_t{c.hidden_size} * sizeof(float);
  ChannelLayout layout;
  layout.request_offset = AlignUp(sizeof(ChannelHeader));
  layout.pairs_offset = AlignUp(layout.request_offset + sizeof(RequestHeader));
  layout.activations_offset =
      AlignUp(layout.pairs_offset + uint64_t{c.max_pairs} * sizeof(ExpertRowPair));
  layout.reply_offset = AlignUp(layout.activations_offset + c.max_activation_rows * row_bytes);
  layout.outputs_offset = AlignUp(layout.reply_offset + sizeof(ReplyHeader));
  layout.outputs_bytes = c.max_output_rows * row_bytes;
  layout.segment_bytes = AlignUp(layout.outputs_offset + layout.outputs_bytes);
  return layout;
}

std::string_view ReplyStatusName(ReplyStatus status) {
  switch (status) {
    case ReplyStatus::kOk: return "ok";
    case ReplyStatus::kBadVersion: return "bad protocol version";
    case ReplyStatus::kBadFingerprint: return "bad model fingerprint";
    case ReplyStatus::kBadFlags: return "bad flags";
    case ReplyStatus::kBadLayer: return "bad layer";
    case ReplyStatus::kTooManyPairs: return "too many pairs";
    case ReplyStatus::kTooManyRows: return "too many activation rows";
    case ReplyStatus::kBadExpert: return "bad expert";
    case ReplyStatus::kBadRow: return "bad row";
    case ReplyStatus::kBadOutputOffset: return "bad output offset";
    case ReplyStatus::kComputeFailed: return "compute failed";
  }
  return "unknown status";
}

void CopyMessage(std::string_view text, char* buffer, size_t buffer_size) {
  if (buffer_size == 0) return;
  const size_t n = std::min(text.size(), buffer_size - 1);
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
}

absl::StatusOr<ChannelView> ChannelView::Initialize(void* base, uint64_t bytes,
                                                    const ChannelCapacities& capacities,
                                                    uint64_t fingerprint, int32_t client_pid) {
  absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(capacities);
  if (!layout.ok()) return layout.status();
  if (bytes < layout->segment_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("segment of ", bytes, " bytes is smaller than ",
                                                   layout->segment_bytes, " the layout needs"));
  }
  auto* header = new (base) ChannelHeader{};
  header->magic = kChannelMagic;
  header->protocol_version = kChannelProtocolVersion;
  header->header_bytes = sizeof(ChannelHeader);
  header->fingerprint = fingerprint;
  header->capacities = capacities;
  header->segment_bytes = layout->segment_bytes;
  header->client_pid = client_pid;
  ChannelView view;
  view.base_ = base;
  view.capacities_ = capacities;
  view.layout_ = *layout;
  view.fingerprint_ = fingerprint;
  std::atomic_thread_fence(std::memory_order_release);
  return view;
}

absl::StatusOr<ChannelView> ChannelView::Open(void* base, uint64_t bytes) {
  if (bytes < sizeof(ChannelHeader)) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment of ", bytes, " bytes is too small for a channel header"));
  }
  // Snapshot the identity once; everything below uses the copy.
  ChannelHeader identity;
  std::memcpy(static_cast<void*>(&identity), base, offsetof(ChannelHeader, request_seq));
  if (identity.magic != kChannelMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment magic (byte offset 0) is ", absl::Hex(identity.magic),
                     ", not a Tandem offload channel"));
  }
  if (identity.protocol_version != kChannelProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "segment protocol_version (byte offset ", offsetof(ChannelHeader, protocol_version),
        ") is ", identity.protocol_version, "; this build speaks ", kChannelProtocolVersion));
  }
  if (identity.header_bytes != sizeof(ChannelHeader)) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment header_bytes is ", identity.header_bytes, "; this build expects ",
                     sizeof(ChannelHeader)));
  }
  absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(identity.capacities);
  if (!layout.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment capacities are invalid: ", layout.status().message()));
  }
  if (layout->segment_bytes > bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment capacities need ", layout->segment_bytes,
                     " bytes but the mapped segment has ", bytes));
  }
  ChannelView view;
  view.base_ = base;
  view.capacities_ = identity.capacities;
  view.layout_ = *layout;
  view.fingerprint_ = identity.fingerprint;
  return view;
}

}  // namespace tandem
