// The stamp buffer of a probe armed in stream order (the decode step's stamped kernels, captured
// before their buffer exists: dense_matvec_probe.h, gdn_decode_out_probe.h,
// moe/expert_decode_fused_probe.h, kernels/attention_probe.h). Each probe keeps one ArmedStampRows
// (in constant or global memory) and one slot counter in its own .cu file; a stamped block takes
// the next slot with an atomic on the counter (TakeArmedRow) and writes its row when the slot is
// below capacity.
// KnownNow orders a stamp after the loads a value waits for. Include from .cu files only.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_ARMED_STAMPS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_ARMED_STAMPS_CUH_

#include <cuda_runtime.h>

namespace tandem::cuda {

struct ArmedStampRows {
  unsigned long long* stamps;  // nullptr: disarmed
  unsigned capacity;           // rows
};

// Arms (stamps not null: `capacity` rows, zeroed by the caller) or disarms (nullptr) the probe
// whose rows and counter are the device symbols `rows` and `count`: the counter reset, then the
// rows, both in stream order.
template <typename Rows, typename Count>
cudaError_t ArmStampRows(const Rows& rows, const Count& count, unsigned long long* stamps, unsigned capacity,
                         cudaStream_t stream) {
  const ArmedStampRows config{stamps, stamps != nullptr ? capacity : 0u};
  static constexpr unsigned kZero = 0;
  if (const cudaError_t e = cudaMemcpyToSymbolAsync(count, &kZero, sizeof(kZero), 0, cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return e;
  }
  return cudaMemcpyToSymbolAsync(rows, &config, sizeof(config), 0, cudaMemcpyHostToDevice, stream);
}

// The next row (`words` u64) of the buffer `armed` for the calling thread: one atomic on `count`,
// the probe's slot counter; nullptr while disarmed or once the buffer is full.
__device__ __forceinline__ unsigned long long* TakeArmedRow(const ArmedStampRows& armed, unsigned* count, int words) {
  if (armed.stamps == nullptr) return nullptr;
  const unsigned slot = atomicAdd(count, 1u);
  return slot < armed.capacity ? armed.stamps + static_cast<unsigned long long>(slot) * words : nullptr;
}

// Whether `dep` is not one arbitrary constant, i.e. true but for one value in 2^32 (whose stamp is
// then lost, nothing else): a stamp taken under `if (KnownNow(dep))` is ordered after the loads
// `dep` waits for, since the timer read cannot be hoisted above a branch that depends on them.
__device__ __forceinline__ bool KnownNow(unsigned dep) { return dep != 0x9E3779B9u; }
__device__ __forceinline__ bool KnownNow(float dep) { return KnownNow(__float_as_uint(dep)); }

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_ARMED_STAMPS_CUH_
