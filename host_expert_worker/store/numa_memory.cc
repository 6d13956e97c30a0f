#include "host_expert_worker/store/numa_memory.h"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status CheckNumaNode(int node) {
  if (node == kNoNumaNode) return absl::OkStatus();
  if (node < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--numa-node ", node, " must be >= 0 (or -1 for none)"));
  }
  if (numa_available() < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--numa-node ", node, ": this machine (or kernel) has no NUMA support; use --numa-node=-1"));
  }
  const int max_node = numa_max_node();
  if (node > max_node || numa_bitmask_isbitset(numa_all_nodes_ptr, node) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node,
                                                   " does not exist (this machine has nodes 0-",
                                                   max_node, ")"));
  }
  long long free_bytes = 0;
  if (numa_node_size64(node, &free_bytes) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node, " has no memory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> NumaNodeCpus(int node) {
  if (absl::Status s = CheckNumaNode(node); !s.ok()) return s;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  std::vector<int> cpus;
  if (node == kNoNumaNode) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    }
    return cpus;
  }
  struct bitmask* mask = numa_allocate_cpumask();
  const int rc = numa_node_to_cpus(node, mask);
  if (rc == 0) {
    for (unsigned c = 0; c < mask->size && c < CPU_SETSIZE; ++c) {
      if (numa_bitmask_isbitset(mask, c) && CPU_ISSET(c, &allowed)) cpus.push_back(static_cast<int>(c));
    }
  }
  numa_free_cpumask(mask);
  if (rc != 0) return absl::InternalError(absl::StrCat("numa_node_to_cpus(", node, ") failed"));
  if (cpus.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NUMA node ", node, " has no CPU this process may run on"));
  }
  return cpus;
}

int NumaNodeOfCpu(int cpu) { return numa_available() < 0 ? -1 : numa_node_of_cpu(cpu); }

absl::StatusOr<std::unique_ptr<NumaRegion>> NumaRegion::Allocate(size_t bytes, int node) {
  if (bytes == 0) return absl::InvalidArgumentError("NumaRegion: zero bytes");
  if (absl::Status s = CheckNumaNode(node); !s.ok()) return s;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes for the experts: ", std::strerror(errno)));
  }
  // Best effort: THP may be disabled; the kernels work either way, a little slower.
  madvise(p, bytes, MADV_HUGEPAGE);
  if (node != kNoNumaNode) {
    // MPOL_BIND: every page of the region comes from `node` when first touched.
    numa_set_strict(1);
    numa_tonode_memory(p, bytes, node);
  }
  return std::unique_ptr<NumaRegion>(new NumaRegion(static_cast<uint8_t*>(p), bytes, node));
}

NumaRegion::~NumaRegion() { munmap(data_, size_); }

}  // namespace tandem
