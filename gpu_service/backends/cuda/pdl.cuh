// Programmatic dependent launch (Hopper, sm_90): a kernel launched through LaunchPdl may start
// while the kernel before it on the stream is still finishing. Its blocks first do what does not
// depend on that kernel (the launch itself, index set-up, the first reads of constant weights),
// then wait in PdlWaitForPrevious until the previous grid has completed and its writes are visible.
// A decode step is a chain of ~900 short dependent kernels, many reading 1-18 MB of weights: each
// boundary costs a launch and a cold start of the memory pipeline, which this overlaps.
//
// The rule for a kernel launched through LaunchPdl (tested by gpu_kernels_test's PdlTest and by
// gpu_backend_test's LaunchOverlapAndL2PrefetchChangeNoLogits):
//   - before PdlWaitForPrevious it reads only data the kernel just before it on the stream does not
//     write: weights and shapes, the step's inputs the host copied before the step (tokens, rows,
//     positions, page tables, attention items), and data that only earlier kernels wrote — earlier
//     steps' KV cache rows, GDN state and conv history, H's rows when the norm's caller knows their
//     writer is two or more launches back (attention_split.cuh, gdn_decode_fused_kernel.cuh,
//     norm_streams.cuh). When a kernel's blocks start, every block of the kernel before has passed
//     its own wait (the next rule: it allows its successor only after its wait), so the kernel two
//     back has completed and its writes are visible. Before the wait it writes nothing in global
//     memory;
//   - every block that reads data the kernel before may write, or writes anything, calls
//     PdlWaitForPrevious first (a block may exit early without it when it has read only what the
//     first rule allows and written nothing, and other blocks of its grid wait), so the grid cannot
//     complete before the one it follows: a later kernel that waits on this one has waited on all
//     before;
//   - PdlAllowNext (after the wait) lets the next kernel's blocks be scheduled early; calling it
//     after the wait keeps at most one kernel waiting ahead of the running one.
// One kernel departs from the first two rules on purpose: the fused GDN kernel with polled rows
// (gdn_decode_fused.cuh GdnDecodeFusedArgs::rows_polled) reads the product before it value by value
// as that product stores them (each value is its own flag: the buffer starts unwritten), and writes
// (state, history, its output row) only what that product neither reads nor writes; it calls
// PdlWaitForPrevious before it exits, so the chain of grids above still holds.
// Both device calls are no-ops when the kernel was launched normally, so a kernel written to the
// rule may be launched either way. With PDL off (SetPdlEnabled(false)), LaunchPdl is a plain
// launch: the A/B switch for benchmarks and the equality test.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_PDL_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_PDL_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "gpu_service/backends/cuda/env_switch.h"

namespace tandem::cuda {

__device__ __forceinline__ void PdlWaitForPrevious() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlAllowNext() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks the copy engine of this SM to bring [p, p + bytes) into L2 without waiting for it: the
// weights a block will read after PdlWaitForPrevious. p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void PrefetchL2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// Process-wide switch (one GPU service per process; the backend sets it from its options). A
// launch policy, not state: kernels are correct either way.
inline std::atomic<bool>& PdlSwitch() {
  static std::atomic<bool> enabled{true};
  return enabled;
}
inline void SetPdlEnabled(bool on) { PdlSwitch().store(on, std::memory_order_relaxed); }
inline bool PdlEnabled() { return PdlSwitch().load(std::memory_order_relaxed); }

// Launches `kernel` on `stream`, with programmatic stream serialization when `pdl` (a plain
// launch otherwise). Returns the launch error (cudaSuccess when the launch was accepted).
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchWithPdl(bool pdl, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Launches `kernel` on `stream`, with programmatic stream serialization when PDL is enabled.
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  return LaunchWithPdl(PdlEnabled(), kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
}

// The kernels of the prefill path that were plain launches until 2026-12-01 (the GDN chunked
// passes, the fp8 and f16 row conversions, the expert prefill kernels, tensor-core attention):
// LaunchPrefillPdl gives them PDL like the rest unless TANDEM_OLD_PREFILL_LAUNCH=1 (read once),
// the A/B switch. A prefill step is not a graph: between two plain launches on a stream the GPU
// idled ~1.3-1.9 us (CUPTI timeline of a 512-token step, H200, 2026-12-01: ~30 us a layer).
inline bool OldPrefillLaunch() {
  static const bool old = EnvSwitch("TANDEM_OLD_PREFILL_LAUNCH");
  return old;
}

template <typename... KernelArgs, typename... Args>
cudaError_t LaunchPrefillPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes,
                             cudaStream_t stream, Args&&... args) {
  return LaunchWithPdl(PdlEnabled() && !OldPrefillLaunch(), kernel, grid, block, shared_bytes, stream,
                       std::forward<Args>(args)...);
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_PDL_CUH_
