#include "common/offload/shared_segment.h"

#include <fcntl.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "absl/strings/str_cat.h"

namespace tandem {

namespace bip = boost::interprocess;

struct SharedSegment::Mapping {
  bip::shared_memory_object object;
  bip::mapped_region region;
};

namespace {
constexpr absl::string_view kNamePrefix = "/tandem-";
constexpr size_t kNameHexDigits = 32;
}  // namespace

absl::StatusOr<std::string> RandomSegmentName() {
  unsigned char random[kNameHexDigits / 2];
  size_t got = 0;
  while (got < sizeof(random)) {
    const ssize_t n = getrandom(random + got, sizeof(random) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  std::string name(kNamePrefix);
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char b : random) {
    name.push_back(kHex[b >> 4]);
    name.push_back(kHex[b & 15]);
  }
  return name;
}

bool IsValidSegmentName(absl::string_view name) {
  if (name.size() != kNamePrefix.size() + kNameHexDigits) return false;
  if (name.substr(0, kNamePrefix.size()) != kNamePrefix) return false;
  for (char c : name.substr(kNamePrefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

SharedSegment::SharedSegment(std::string name, std::unique_ptr<Mapping> mapping, bool owner)
    : name_(std::move(name)),
      mapping_(std::move(mapping)),
      owner_(owner),
      data_(mapping_->region.get_address()),
      size_(mapping_->region.get_size()) {}

SharedSegment::~SharedSegment() {
  mapping_.reset();  // unmap and close before removing the name
  if (owner_) bip::shared_memory_object::remove(name_.c_str());
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("shared segment size is 0");
  absl::StatusOr<std::string> name = RandomSegmentName();
  if (!name.ok()) return name.status();
  auto mapping = std::make_unique<Mapping>();
  try {
    mapping->object = bip::shared_memory_object(bip::create_only, name->c_str(), bip::read_write,
                                                bip::permissions(0600));
  } catch (const bip::interprocess_exception& e) {
    return absl::InternalError(absl::StrCat("creating shared segment ", *name, ": ", e.what()));
  }
  // From here the name exists: remove it on every error path.
  auto fail = [&](absl::string_view what) {
    mapping.reset();
    bip::shared_memory_object::remove(name->c_str());
    return absl::InternalError(absl::StrCat("shared segment ", *name, ": ", what));
  };
  try {
    mapping->object.truncate(static_cast<bip::offset_t>(bytes));
  } catch (const bip::interprocess_exception& e) {
    return fail(absl::StrCat("resizing to ", bytes, " bytes: ", e.what()));
  }
  const int fd = mapping->object.get_mapping_handle().handle;
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    return fail(absl::StrCat("reserving ", bytes, " bytes (is /dev/shm full?): ",
                             std::strerror(rc)));
  }
  try {
    mapping->region = bip::mapped_region(mapping->object, bip::read_write, 0, bytes);
  } catch (const bip::interprocess_exception& e) {
    return fail(absl::StrCat("mapping: ", e.what()));
  }
  return std::unique_ptr<SharedSegment>(
      new SharedSegment(*std::move(name), std::move(mapping), /*owner=*/true));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Open(const std::string& name) {
  if (!IsValidSegmentName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "channel name '", name, "' is not of the form ", kNamePrefix, "<32 hex digits>"));
  }
  auto mapping = std::make_unique<Mapping>();
  try {
    mapping->object = bip::shared_memory_object(bip::open_only, name.c_str(), bip::read_write);
    mapping->region = bip::mapped_region(mapping->object, bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return absl::NotFoundError(absl::StrCat("opening shared segment ", name, ": ", e.what()));
  }
  return std::unique_ptr<SharedSegment>(
      new SharedSegment(name, std::move(mapping), /*owner=*/false));
}

}  // namespace tandem
