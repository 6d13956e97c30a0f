// Owns a POSIX file descriptor: closed when the owner goes out of scope, unless released. Header
// only; the standard library and Abseil have no such type.
#ifndef TANDEM_COMMON_UNIQUE_FD_H_
#define TANDEM_COMMON_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace tandem {

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  // Gives up ownership: the caller closes the descriptor.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_UNIQUE_FD_H_
