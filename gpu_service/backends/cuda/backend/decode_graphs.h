// CUDA graphs of the backend's decode steps (issue: "the decode step captured as a CUDA graph
// where its shape allows").
//
// A decode step of B sequences launches the same ~20 kernels per layer every time; what changes
// between steps (tokens, positions, page tables) lives in device memory that the step uploads
// before the graph runs. What the kernels take as launch arguments (the backend's key: the token
// count and which rows want logits) selects the graph: one graph per key, captured the first time
// the key is seen and replayed after, the least recently used dropped beyond capacity.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DECODE_GRAPHS_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DECODE_GRAPHS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace tandem::cuda {

// Owns one instantiated graph.
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  GraphExec(GraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    std::swap(exec_, o.exec_);
    return *this;
  }
  ~GraphExec() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  }
  cudaGraphExec_t get() const { return exec_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

class DecodeGraphs {
 public:
  explicit DecodeGraphs(int capacity) : capacity_(capacity) {}

  // Launches on `stream` the graph of `key`; when there is none, captures what enqueue() puts on
  // the stream (nothing runs during the capture), instantiates it and launches it. enqueue must not
  // wait on the host. Errors: enqueue's own (the capture is discarded), or Unavailable when CUDA
  // refused to capture or instantiate the work; then nothing was launched and the caller may run
  // enqueue() without a graph.
  absl::Status Launch(const std::vector<int32_t>& key, cudaStream_t stream, absl::FunctionRef<absl::Status()> enqueue);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  struct Entry {
    GraphExec exec;
    uint64_t last_use = 0;
  };
  int capacity_;
  uint64_t clock_ = 0;
  int64_t captures_ = 0, replays_ = 0;
  std::map<std::vector<int32_t>, Entry> entries_;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DECODE_GRAPHS_H_
