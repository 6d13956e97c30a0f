// RAII owners of device and pinned host memory, and of streams and events. Device memory is taken
// in a few large allocations at start (DeviceArena) and handed out without cudaMalloc in a step.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_BUFFER_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/cuda_check.h"

namespace tandem::cuda {

// One allocation made by `Allocator` and released by `Deleter` on destruction (cudaMalloc /
// cudaFree for device memory, cudaMallocHost / cudaFreeHost for pinned host memory).
template <cudaError_t (*Allocator)(void**, size_t), cudaError_t (*Deleter)(void*)>
class CudaAllocation {
 public:
  CudaAllocation() = default;
  static absl::StatusOr<CudaAllocation> Allocate(size_t bytes) {
    CudaAllocation b;
    if (bytes > 0) TANDEM_CUDA_RETURN_IF_ERROR(Allocator(&b.ptr_, bytes));
    b.bytes_ = bytes;
    return b;
  }
  CudaAllocation(CudaAllocation&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  CudaAllocation& operator=(CudaAllocation&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;
  ~CudaAllocation() {
    if (ptr_ != nullptr) Deleter(ptr_);  // nothing useful to do with an error in a destructor
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

namespace internal {
inline cudaError_t DeviceMalloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline cudaError_t DeviceFree(void* p) { return cudaFree(p); }
inline cudaError_t PinnedMalloc(void** p, size_t n) { return cudaMallocHost(p, n); }
inline cudaError_t PinnedFree(void* p) { return cudaFreeHost(p); }
}  // namespace internal

// Device memory (cudaMalloc).
using DeviceBuffer = CudaAllocation<internal::DeviceMalloc, internal::DeviceFree>;
// Page-locked host memory (cudaMallocHost), for staging copies.
using PinnedBuffer = CudaAllocation<internal::PinnedMalloc, internal::PinnedFree>;

// A bump allocator over one DeviceBuffer: reserve everything at start, hand out aligned slices.
class DeviceArena {
 public:
  static absl::StatusOr<DeviceArena> Create(size_t bytes) {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(bytes);
    if (!b.ok()) return b.status();
    DeviceArena a;
    a.buffer_ = *std::move(b);
    return a;
  }
  // A 256-byte-aligned slice; ResourceExhausted when the arena is full.
  absl::StatusOr<void*> Take(size_t bytes) {
    const size_t start = (used_ + 255) / 256 * 256;
    if (start + bytes > buffer_.bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat("device arena: ", bytes, " bytes requested, ",
                                                       buffer_.bytes() - start, " left"));
    }
    used_ = start + bytes;
    return static_cast<char*>(buffer_.get()) + start;
  }
  size_t used() const { return used_; }
  size_t capacity() const { return buffer_.bytes(); }

 private:
  DeviceBuffer buffer_;
  size_t used_ = 0;
};

class Stream {
 public:
  static absl::StatusOr<Stream> Create() {
    Stream s;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
    return s;
  }
  Stream() = default;
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(stream_, o.stream_);
    return *this;
  }
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  static absl::StatusOr<Event> Create(bool timing = true) {
    Event e;
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  Event() = default;
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Lets a second stream start from the current point of a first one and rejoins it, the same way
// when the streams run and when they are captured into a CUDA graph (events recorded and waited on).
class StreamFork {
 public:
  static absl::StatusOr<StreamFork> Create() {
    StreamFork f;
    absl::StatusOr<Event> fork = Event::Create(/*timing=*/false), join = Event::Create(/*timing=*/false),
                          mark = Event::Create(/*timing=*/false);
    if (!fork.ok()) return fork.status();
    if (!join.ok()) return join.status();
    if (!mark.ok()) return mark.status();
    f.fork_ = *std::move(fork);
    f.join_ = *std::move(join);
    f.mark_ = *std::move(mark);
    return f;
  }
  // `side` runs what is enqueued on it next after everything enqueued on `main` so far.
  absl::Status Fork(cudaStream_t main, cudaStream_t side) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_.get(), main));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side, fork_.get(), 0));
    return absl::OkStatus();
  }
  // `main` runs what is enqueued on it next after everything enqueued on `side` so far.
  absl::Status Join(cudaStream_t main, cudaStream_t side) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_.get(), side));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, join_.get(), 0));
    return absl::OkStatus();
  }
  // A join on part of the side work: Mark notes what is enqueued on `side` so far, and WaitForMark
  // makes `main` run what is enqueued on it next after that (not after what `side` got since).
  absl::Status Mark(cudaStream_t side) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(mark_.get(), side));
    return absl::OkStatus();
  }
  absl::Status WaitForMark(cudaStream_t main) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, mark_.get(), 0));
    return absl::OkStatus();
  }

 private:
  Event fork_, join_, mark_;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_BUFFER_H_
