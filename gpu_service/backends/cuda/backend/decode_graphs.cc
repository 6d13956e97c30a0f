#include "gpu_service/backends/cuda/backend/decode_graphs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"

namespace tandem::cuda {
namespace {

// Owns a captured (not yet instantiated) graph.
class Graph {
 public:
  ~Graph() {
    if (g_ != nullptr) cudaGraphDestroy(g_);
  }
  cudaGraph_t* out() { return &g_; }
  cudaGraph_t get() const { return g_; }

 private:
  cudaGraph_t g_ = nullptr;
};

}  // namespace

absl::Status DecodeGraphs::Launch(const std::vector<int32_t>& key, cudaStream_t stream,
                                  absl::FunctionRef<absl::Status()> enqueue) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status enqueued = enqueue();
    Graph graph;
    const cudaError_t ended = cudaStreamEndCapture(stream, graph.out());
    if (!enqueued.ok()) {
      cudaGetLastError();  // a failed capture leaves a non-sticky error behind
      return enqueued;
    }
    if (ended != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat("decode step capture: ", cudaGetErrorString(ended)));
    }
    cudaGraphExec_t exec = nullptr;
    if (const cudaError_t err = cudaGraphInstantiate(&exec, graph.get(), 0); err != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat("decode step graph instantiation: ", cudaGetErrorString(err)));
    }
    if (static_cast<int>(entries_.size()) >= capacity_) {
      auto oldest = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
        return a.second.last_use < b.second.last_use;
      });
      entries_.erase(oldest);
    }
    it = entries_.emplace(key, Entry{GraphExec(exec), 0}).first;
    ++captures_;
  } else {
    ++replays_;
  }
  it->second.last_use = ++clock_;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.exec.get(), stream));
  return absl::OkStatus();
}

}  // namespace tandem::cuda
