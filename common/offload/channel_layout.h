// The offload channel's shared-memory layout: the contract between the GPU service (client) and
// the host expert worker (server). Both processes include this header; nothing else is shared.
//
// One segment holds, in order (every region 64-byte aligned):
//   ChannelHeader   identity (magic, version, fingerprint, capacities, client pid), then one cache
//                   line per doorbell and one for the worker's status, so that the word a side
//                   spins on is never on a line the other side writes for another reason.
//   RequestHeader   one request: version, fingerprint, flags, layer, counts, output offset
//   pairs           ExpertRowPair[max_pairs]
//   activations     float[max_activation_rows][hidden_size]
//   ReplyHeader     status, message, compute time
//   outputs         float[max_output_rows][hidden_size]; a request's output_offset is a byte
//                   offset from the start of this region
//
// One request is in flight at a time. The client writes the request area, then publishes
// request_seq = n (release); the worker reads the request, writes the reply area and publishes
// reply_seq = n. The creator fills the identity fields once, before the name is given to anyone.
// The worker snapshots the capacities at attach and never trusts them again (see ChannelView).
#ifndef TANDEM_COMMON_OFFLOAD_CHANNEL_LAYOUT_H_
#define TANDEM_COMMON_OFFLOAD_CHANNEL_LAYOUT_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

inline constexpr uint64_t kChannelMagic = 0x314C4E4843444E54ull;  // "TNDCHNL1" in memory order
inline constexpr uint32_t kChannelProtocolVersion = 1;
inline constexpr size_t kChannelAlignment = 64;  // a cache line: every region starts on one

// Request flags.
inline constexpr uint32_t kRequestFlagExact = 1u << 0;  // f32 activations in the dot products
                                                        // (default: the worker quantizes to int8)
inline constexpr uint32_t kKnownRequestFlags = kRequestFlagExact;

// Sizes fixed when the segment is created. layer_count and expert_count are the model's; the
// worker refuses a segment whose counts or hidden size differ from its model.
struct ChannelCapacities {
  uint32_t max_pairs = 0;            // (expert, row) pairs per request
  uint32_t max_activation_rows = 0;  // activation rows per request
  uint32_t hidden_size = 0;          // h: floats per activation row and per output row
  uint32_t max_output_rows = 0;      // output rows the reply area holds (>= max_pairs)
  uint32_t layer_count = 0;
  uint32_t expert_count = 0;
};

// Upper bounds that keep every size product far from overflowing 64 bits.
inline constexpr uint32_t kMaxChannelPairs = 1u << 20;
inline constexpr uint32_t kMaxChannelRows = 1u << 20;
inline constexpr uint32_t kMaxChannelHidden = 1u << 16;

// OK when every capacity is non-zero, within the bounds above, and max_output_rows >= max_pairs;
// otherwise InvalidArgument naming the field.
absl::Status ValidateCapacities(const ChannelCapacities& capacities);

// Byte offsets of the regions, derived only from the capacities (both sides compute them; the
// segment does not carry them, so a client cannot point the worker elsewhere).
struct ChannelLayout {
  uint64_t request_offset = 0;      // RequestHeader
  uint64_t pairs_offset = 0;        // ExpertRowPair[max_pairs]
  uint64_t activations_offset = 0;  // float[max_activation_rows * h]
  uint64_t reply_offset = 0;        // ReplyHeader
  uint64_t outputs_offset = 0;      // float[max_output_rows * h]
  uint64_t outputs_bytes = 0;
  uint64_t segment_bytes = 0;       // total size of the segment
};
absl::StatusOr<ChannelLayout> ComputeChannelLayout(const ChannelCapacities& capacities);

enum class WorkerState : uint32_t {
  kEmpty = 0,      // no worker; one may claim the channel
  kAttaching = 1,  // a worker claimed it and is checking the header
  kReady = 2,      // the worker serves requests
  kRefused = 3,    // the worker refused the segment; worker_message says why
  kExited = 4,     // the worker stopped serving (stop flag, client gone)
};

struct alignas(kChannelAlignment) ChannelHeader {
  // Identity: written once by the creator.
  uint64_t magic;
  uint32_t protocol_version;
  uint32_t header_bytes;  // sizeof(ChannelHeader)
  uint64_t fingerprint;   // ModelFingerprint() of the model the client serves
  ChannelCapacities capacities;
  uint64_t segment_bytes;
  int32_t client_pid;  // the worker exits when this process is gone

  // Request doorbell. Client writes request_seq and stop_requested; the worker writes
  // request_waiters (1 while it sleeps on the futex at request_seq's low 32 bits).
  alignas(kChannelAlignment) uint64_t request_seq;
  uint32_t request_waiters;
  uint32_t stop_requested;  // 1: the worker finishes and exits

  // Reply doorbell. Worker writes reply_seq; the client writes reply_waiters.
  alignas(kChannelAlignment) uint64_t reply_seq;
  uint32_t reply_waiters;

  // Worker status. attach_epoch is bumped by the client each time it resets the channel for a new
  // worker; a worker that sees a different epoch than the one it claimed has been replaced.
  alignas(kChannelAlignment) uint32_t worker_state;  // WorkerState
  int32_t worker_pid;
  uint64_t attach_epoch;
  uint64_t heartbeat;  // bumped every few ms by a live worker

  alignas(kChannelAlignment) char worker_message[256];  // why a worker refused; NUL-terminated
};

struct alignas(kChannelAlignment) RequestHeader {
  uint32_t protocol_version;  // must be kChannelProtocolVersion
  uint32_t flags;             // kRequestFlag*
  uint64_t fingerprint;       // must equal the header's fingerprint
  uint64_t sequence;          // the request_seq this request is published under
  uint32_t layer;
  uint32_t pair_count;
  uint32_t activation_row_count;
  uint32_t reserved;
  uint64_t output_offset;  // bytes from the start of the outputs region; multiple of 64
};

// One unit of work: expert `expert` applied to activation row `row` of the request.
struct ExpertRowPair {
  uint32_t expert;
  uint32_t row;
};

enum class ReplyStatus : uint32_t {
  kOk = 0,
  kBadVersion = 1,
  kBadFingerprint = 2,
  kBadFlags = 3,
  kBadLayer = 4,
  kTooManyPairs = 5,
  kTooManyRows = 6,
  kBadExpert = 7,
  kBadRow = 8,
  kBadOutputOffset = 9,
  kComputeFailed = 10,
};
std::string_view ReplyStatusName(ReplyStatus status);

struct alignas(kChannelAlignment) ReplyHeader {
  uint32_t status;      // ReplyStatus
  uint32_t pair_count;  // output rows written (0 on error)
  uint64_t sequence;    // the request this answers
  uint64_t compute_ns;  // worker time from reading the request to publishing the reply
  char message[232];    // the error, naming the bad field; NUL-terminated
};

static_assert(std::endian::native == std::endian::little,
              "the futex waits on the low 32 bits of a 64-bit sequence word");
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                  std::atomic_ref<uint32_t>::is_always_lock_free,
              "shared-memory doorbells need address-free (lock-free) atomics");
static_assert(sizeof(ReplyHeader) == 256);

// Atomic access to a field of the mapped segment.
inline std::atomic_ref<uint64_t> AtomicWord(uint64_t& word) { return std::atomic_ref(word); }
inline std::atomic_ref<uint32_t> AtomicWord(uint32_t& word) { return std::atomic_ref(word); }
inline std::atomic_ref<int32_t> AtomicWord(int32_t& word) { return std::atomic_ref(word); }

// Typed pointers into a mapped segment. Cheap to copy; does not own the memory.
class ChannelView {
 public:
  ChannelView() = default;

  // Writes the identity fields and zeroes the rest of the header of a fresh segment of `bytes`
  // (which must be at least ComputeChannelLayout(capacities).segment_bytes).
  static absl::StatusOr<ChannelView> Initialize(void* base, uint64_t bytes,
                                                const ChannelCapacities& capacities,
                                                uint64_t fingerprint, int32_t client_pid);

  // Checks magic, version, header size and capacities of an existing segment mapped at `base`
  // (`bytes` long) and snapshots the capacities: the view never reads them from the segment
  // again. FailedPrecondition naming the field on any mismatch.
  static absl::StatusOr<ChannelView> Open(void* base, uint64_t bytes);

  ChannelHeader& header() const { return *static_cast<ChannelHeader*>(base_); }
  RequestHeader& request() const { return *At<RequestHeader>(layout_.request_offset); }
  ExpertRowPair* pairs() const { return At<ExpertRowPair>(layout_.pairs_offset); }
  float* activations() const { return At<float>(layout_.activations_offset); }
  ReplyHeader& reply() const { return *At<ReplyHeader>(layout_.reply_offset); }
  float* outputs() const { return At<float>(layout_.outputs_offset); }

  const ChannelCapacities& capacities() const { return capacities_; }
  const ChannelLayout& layout() const { return layout_; }
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(base_) + offset);
  }

  void* base_ = nullptr;
  ChannelCapacities capacities_;
  ChannelLayout layout_;
  uint64_t fingerprint_ = 0;
};

// Copies `text` into a fixed char buffer, truncating, always NUL-terminated.
void CopyMessage(std::string_view text, char* buffer, size_t buffer_size);

}  // namespace tandem

#endif  // TANDEM_COMMON_OFFLOAD_CHANNEL_LAYOUT_H_
