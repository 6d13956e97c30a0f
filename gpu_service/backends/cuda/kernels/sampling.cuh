// Token selection on the GPU from logits (rows × vocab f32), with the CPU Sampler's semantics
// (common/model/sampler.h): greedy argmax with ties to the lower id, or candidates ordered by
// logit (descending, ties to the lower id), cut to top_k, softmax at the temperature (f64),
// cut by min_p and top_p, and the token at uniform·total on the cumulative distribution.
// The uniform random number is given per row (the engine draws it from the request's generator).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_SAMPLING_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_SAMPLING_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

struct SamplingRowParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  double uniform = 0.0;      // in [0, 1)
};

// tokens[r] = argmax of row r (ties: the lower id). One block per row.
cudaError_t LaunchArgmax(const float* logits, int rows, int vocab, int32_t* tokens, cudaStream_t stream);

// Scratch for LaunchSample, all device memory, sized by SampleScratchBytes (the plan).
struct SampleScratch {
  void* temp = nullptr;  // the sort's temporary storage
  size_t temp_bytes = 0;
  float* sorted_logits = nullptr;  // rows × vocab
  int32_t* ids = nullptr;          // rows × vocab
  int32_t* sorted_ids = nullptr;   // rows × vocab
  int32_t* offsets = nullptr;      // rows + 1
};

// Bytes of the sort's temporary storage for rows × vocab (cudaError_t from the query).
cudaError_t SampleSortTempBytes(int rows, int vocab, size_t* bytes);

// tokens[r] for each row with params[r] (device array of rows entries). One segmented radix sort
// of the logits, then one block per row walks its sorted candidates.
cudaError_t LaunchSample(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                         const SampleScratch& scratch, int32_t* tokens, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_SAMPLING_CUH_
