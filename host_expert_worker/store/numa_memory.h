// Host memory bound to one NUMA node, through libnuma: an anonymous mapping whose policy is
// MPOL_BIND to the node (pages come from that node or the allocation fails, never silently from
// another), with transparent huge pages requested so that streaming 40+ GB of experts does not
// thrash the TLB. Pages are placed when first written; write them from threads pinned to the
// node's CPUs.
#ifndef TANDEM_HOST_EXPERT_WORKER_STORE_NUMA_MEMORY_H_
#define TANDEM_HOST_EXPERT_WORKER_STORE_NUMA_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

inline constexpr int kNoNumaNode = -1;

// OK when `node` is kNoNumaNode or a node of this machine with memory; otherwise
// InvalidArgument, e.g. "NUMA node 3 does not exist (this machine has nodes 0-1)", or
// FailedPrecondition when libnuma reports no NUMA support and a node was asked for.
absl::Status CheckNumaNode(int node);

// The CPUs of `node` that this process may run on (CheckNumaNode first).
absl::StatusOr<std::vector<int>> NumaNodeCpus(int node);

// The node CPU `cpu` belongs to (-1 when libnuma cannot tell).
int NumaNodeOfCpu(int cpu);

class NumaRegion {
 public:
  // `bytes` (> 0) of zero pages bound to `node` (kNoNumaNode: the default policy).
  static absl::StatusOr<std::unique_ptr<NumaRegion>> Allocate(size_t bytes, int node);
  ~NumaRegion();
  NumaRegion(const NumaRegion&) = delete;
  NumaRegion& operator=(const NumaRegion&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int node() const { return node_; }

 private:
  NumaRegion(uint8_t* data, size_t size, int node) : data_(data), size_(size), node_(node) {}
  uint8_t* data_;
  size_t size_;
  int node_;
};

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_STORE_NUMA_MEMORY_H_
