// A POSIX shared-memory segment (Boost.Interprocess underneath), owned by RAII.
//
// The creator makes the segment with mode 0600 (only the same user can open it) under an
// unguessable name (128 random bits from the kernel), so no other user can read activations or
// inject requests, and removes the name when it is destroyed. An opener maps an existing segment
// and never removes it.
#ifndef TANDEM_COMMON_OFFLOAD_SHARED_SEGMENT_H_
#define TANDEM_COMMON_OFFLOAD_SHARED_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

class SharedSegment {
 public:
  // Creates "/tandem-<32 hex digits>" of `bytes` bytes, mode 0600, zero-filled, with its pages
  // reserved up front (posix_fallocate), so a full /dev/shm is an error here instead of a SIGBUS
  // later. The segment's name is removed when the object is destroyed.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(uint64_t bytes);

  // Maps the whole of an existing segment read-write. `name` must be a name Create makes.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Open(const std::string& name);

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  const std::string& name() const { return name_; }
  void* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  struct Mapping;  // Boost objects, kept out of this header
  SharedSegment(std::string name, std::unique_ptr<Mapping> mapping, bool owner);

  std::string name_;
  std::unique_ptr<Mapping> mapping_;
  bool owner_;
  void* data_;
  uint64_t size_;
};

// "/tandem-" followed by 32 lowercase hex digits of kernel randomness.
absl::StatusOr<std::string> RandomSegmentName();

// True for names of the form RandomSegmentName() returns.
bool IsValidSegmentName(absl::string_view name);

}  // namespace tandem

#endif  // TANDEM_COMMON_OFFLOAD_SHARED_SEGMENT_H_
