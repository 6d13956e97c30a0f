// Shared-memory mbarrier pieces (sm_90; device-only header) for kernels that pipeline a cp.async
// ring without block-wide barriers: init, a plain arrive, the arrive that fires when this thread's
// earlier cp.async copies have landed, and the phase-parity wait; and for bulk copies (the tensor
// memory accelerator) that complete a barrier by their bytes. Addresses are shared-memory
// addresses (__cvta_generic_to_shared) of 8-byte aligned uint64_t slots.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MBARRIER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MBARRIER_CUH_

#include <cstdint>

#include "gpu_service/backends/cuda/cluster_barrier.cuh"
#include "gpu_service/backends/cuda/spin_wait.cuh"

namespace tandem::cuda::mbarrier {

// Phase 0 expects `count` arrivals; one thread initializes, and a __syncthreads must follow before
// any other thread uses the barrier. Only while no arrival or wait on it is pending.
__device__ __forceinline__ void Init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival (release: this thread's earlier memory accesses happen before the phase completes).
__device__ __forceinline__ void Arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival, made by the hardware once every cp.async this thread issued before it has landed
// (.noinc: it counts against the count given to Init, so every thread that calls this is one of it).
__device__ __forceinline__ void ArriveOnCpAsync(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` (the phase number & 1) has completed (acquire: the
// accesses the arrivals released, cp.async copies included, are visible to this thread after it).
// Phase k is awaited with parity k & 1 while the barrier is in phase k or k + 1. kClusterScope:
// acquire at cluster scope, for arrivals and complete_tx counts that other blocks of the cluster
// made (StoreAsyncToCluster), so that their stores are visible after it.
template <bool kClusterScope = false>
__device__ __forceinline__ bool TryWaitParity(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  if constexpr (kClusterScope) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
  return done != 0;
}
// No timeout here, unlike WaitParityCluster: the same timer check in this wait (fused GDN kernel's
// input ring and output rows) cost 0.5% of batch-1 decode in every round of an A/B on an H100
// (fifty-second session, docs/PERF.md), and its phases are this block's own copies and arrivals.
template <bool kClusterScope = false>
__device__ __forceinline__ void WaitParity(uint32_t bar, uint32_t parity) {
  while (!TryWaitParity<kClusterScope>(bar, parity)) {
  }
}

// WaitParity<true> for phases that other blocks of the cluster complete (their pushes,
// StoreAsyncToCluster): a byte count that never completes would be a bug, so the wait traps past
// kSpinWaitTimeoutNs (spin_wait.cuh), failing the launch with an error rather than hanging the
// stream. try_wait itself suspends the thread for a while, so the loop does not sleep besides.
// Tested by tests/gpu/mbarrier_wait_test.cu.
__device__ __forceinline__ void WaitParityCluster(uint32_t bar, uint32_t parity) {
  SpinUntil<0>([&] { return TryWaitParity<true>(bar, parity); });
}

// Stores v into block `rank` of this cluster at the shared-memory address its block has for `dst`
// here (the same layout in every block), counting 4 bytes against that block's barrier at `bar`
// (its address here likewise): st.async, whose completion the barrier's phase carries, so neither
// side needs a cluster barrier with release semantics (which the compiler makes a GPU-scope
// MEMBAR: docs/PERF.md, forty-eighth session). The barrier must be initialised in that block and
// the init made visible (InitFence, then a cluster barrier) before the first such store.
__device__ __forceinline__ void StoreAsyncToCluster(uint32_t dst, float v, uint32_t bar, unsigned rank) {
  uint32_t remote_dst, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_dst) : "r"(dst), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_bar) : "r"(bar), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote_dst),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
}

// StoreAsyncToCluster into every block of a cluster of kBlocks blocks (ranks 0 .. kBlocks - 1).
template <int kBlocks>
__device__ __forceinline__ void StoreAsyncToEveryBlock(uint32_t dst, float v, uint32_t bar) {
#pragma unroll
  for (unsigned rank = 0; rank < static_cast<unsigned>(kBlocks); ++rank) StoreAsyncToCluster(dst, v, bar, rank);
}

// After Init, before the barrier is used by bulk copies (the async proxy) or by other blocks of the
// cluster: the init is visible to them.
__device__ __forceinline__ void InitFence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// This thread's earlier shared-memory accesses (generic proxy) ordered before the bulk copies it
// issues next (async proxy) into the same bytes: run it before a copy that overwrites shared memory
// the block wrote or read. Plain sm_90 PTX, unlike wgmma::FenceProxyAsync (the same instruction,
// trapping outside sm_90a with the rest of the wgmma helpers).
__device__ __forceinline__ void FenceProxyAsyncShared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One arrival that also expects `bytes` of bulk copies to complete the phase (complete_tx).
__device__ __forceinline__ void ArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// `bar` initialised for one arrival, the init made visible to the async proxy and the cluster, and
// that arrival made expecting `bytes` of bulk copies or pushes to complete the phase. One thread.
__device__ __forceinline__ void InitExpectingBytes(uint32_t bar, uint32_t bytes) {
  Init(bar, 1);
  InitFence();
  ArriveExpectTx(bar, bytes);
}

// The tensor memory accelerator's bulk copy global -> this block's shared memory (dst a
// shared-memory address): `bytes` (a multiple of 16; both addresses 16-byte aligned) counted
// against `bar`'s expected bytes as they land.
__device__ __forceinline__ void BulkCopyToShared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Every block of the cluster: `bar` (one arrival, thread 0's, expecting `bytes` of other blocks'
// StoreAsyncToCluster pushes) initialised in every block before any block pushes: the init made
// visible to the cluster, then a cluster barrier. Relaxed: the init fence already published it, and
// a release arrive would cost a GPU-scope MEMBAR (cluster_barrier.cuh). Call from every thread;
// `first` true in one thread of the block.
__device__ __forceinline__ void InitForClusterPushes(uint32_t bar, uint32_t bytes, bool first) {
  if (first) InitExpectingBytes(bar, bytes);
  ClusterArriveRelaxed();
  ClusterWait();
}

// One arrival on `bar` expecting `bytes`, then the run [src, src + bytes) into shared memory at dst
// by bulk copies of at most 16 KB (a few copies in flight rather than one long one). One thread.
__device__ __forceinline__ void BulkCopyRunToShared(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  ArriveExpectTx(bar, bytes);
  constexpr uint32_t kChunk = 16 * 1024;
  const uint8_t* from = static_cast<const uint8_t*>(src);
  for (uint32_t off = 0; off < bytes; off += kChunk) {
    BulkCopyToShared(dst + off, from + off, bytes - off < kChunk ? bytes - off : kChunk, bar);
  }
}

}  // namespace tandem::cuda::mbarrier

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MBARRIER_CUH_
