#include "gpu_service/backends/cuda/kernels/sampling.cuh"

#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"

namespace tandem::cuda {
namespace {

constexpr int kSelectThreads = 256;

__global__ void ArgmaxKernel(const float* logits, int vocab, int32_t* tokens) {
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float v = -INFINITY;
  int idx = 0x7FFFFFFF;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = row[i];
    if (x > v || idx == 0x7FFFFFFF) {  // strictly greater: the first (lowest) index wins ties
      v = x;
      idx = i;
    }
  }
  // (value, index) reduction: larger value, then lower index.
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    const int oi = __shfl_xor_sync(0xFFFFFFFFu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_v[warp] = v;
    best_i[warp] = idx;
  }
  __syncthreads();
  if (warp != 0) return;
  const int warps = blockDim.x >> 5;
  v = lane < warps ? best_v[lane] : -INFINITY;
  idx = lane < warps ? best_i[lane] : 0x7FFFFFFF;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    const int oi = __shfl_xor_sync(0xFFFFFFFFu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  if (lane == 0) tokens[blockIdx.x] = idx;
}

__global__ void IotaKernel(int32_t* ids, int rows, int vocab, int32_t* offsets) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<int64_t>(rows) * vocab) ids[i] = static_cast<int32_t>(i % vocab);
  if (i <= rows) offsets[i] = static_cast<int32_t>(i * vocab);
}

using Scan = cub::BlockScan<double, kSelectThreads>;

// One block per row over the row's sorted candidates (sorted[0] is the largest logit).
// Pass 1: the softmax normaliser over the top-k. Pass 2: the cut by min_p and top_p. Pass 3: the
// token at uniform·total. Each pass scans the probabilities in order, chunk by chunk.
__global__ void __launch_bounds__(kSelectThreads)
SelectKernel(const float* sorted_logits, const int32_t* sorted_ids, int vocab,
             const SamplingRowParams* params, int32_t* tokens) {
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ double scratch[32];
  __shared__ int found_s;
  const SamplingRowParams pr = params[blockIdx.x];
  const float* l = sorted_logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int32_t* ids = sorted_ids + static_cast<int64_t>(blockIdx.x) * vocab;
  if (pr.temperature <= 0.0f) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = ids[0];
    return;
  }
  const int n = (pr.top_k > 0 && pr.top_k < vocab) ? pr.top_k : vocab;
  const double max_logit = l[0];
  const double temp = pr.temperature;
  auto prob = [&](int i) { return i < n ? exp((static_cast<double>(l[i]) - max_logit) / temp) : 0.0; };
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += prob(i);
  sum = BlockSum(sum, scratch);
  // min_p keeps the prefix with p >= min_p·p[0] (p is non-increasing along the sorted order).
  int keep = n;
  if (pr.min_p > 0.0f) {
    const double floor = pr.min_p * (1.0 / sum);
    double cnt = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) cnt += (prob(i) / sum >= floor) ? 1.0 : 0.0;
    keep = max(1, static_cast<int>(BlockSum(cnt, scratch)));
  }
  // top_p: the shortest prefix whose cumulative probability reaches top_p.
  if (threadIdx.x == 0) found_s = keep;
  __syncthreads();
  if (pr.top_p < 1.0f) {
    double carry = 0.0;
    for (int base = 0; base < keep; base += blockDim.x) {
      const int i = base + threadIdx.x;
      const double p = i < keep ? prob(i) / sum : 0.0;
      double cum, chunk;
      Scan(scan_storage).InclusiveSum(p, cum, chunk);
      cum += carry;
      if (i < keep && cum >= pr.top_p) atomicMin(&found_s, i + 1);
      carry += chunk;
      __syncthreads();
      const bool done = found_s < keep;
      __syncthreads();  // every thread has read found_s before the next chunk may lower it
      if (done) break;
    }
    __syncthreads();
  }
  keep = found_s;
  double total = 0.0;
  for (int i = threadIdx.x; i < keep; i += blockDim.x) total += prob(i) / sum;
  total = BlockSum(total, scratch);
  const double u = pr.uniform * total;
  __syncthreads();
  if (threadIdx.x == 0) found_s = keep - 1;
  __syncthreads();
  double carry = 0.0;
  for (int base = 0; base < keep; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const double p = i < keep ? prob(i) / sum : 0.0;
    double cum, chunk;
    Scan(scan_storage).InclusiveSum(p, cum, chunk);
    cum += carry;
    if (i < keep && u < cum) atomicMin(&found_s, i);
    carry += chunk;
    __syncthreads();
    const bool done = found_s < keep - 1;
    __syncthreads();
    if (done) break;
  }
  __syncthreads();
  if (threadIdx.x == 0) tokens[blockIdx.x] = ids[found_s];
}

}  // namespace

cudaError_t LaunchArgmax(const float* logits, int rows, int vocab, int32_t* tokens, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  ArgmaxKernel<<<rows, 1024, 0, stream>>>(logits, vocab, tokens);
  return cudaGetLastError();
}

cudaError_t SampleSortTempBytes(int rows, int vocab, size_t* bytes) {
  *bytes = 0;
  return cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, *bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), rows * vocab, rows,
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr));
}

cudaError_t LaunchSample(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                         const SampleScratch& scratch, int32_t* tokens, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  const int64_t total = static_cast<int64_t>(rows) * vocab;
  IotaKernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(scratch.ids, rows, vocab,
                                                                             scratch.offsets);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  size_t temp_bytes = scratch.temp_bytes;
  // The radix sort is stable: equal logits stay in ascending id order, as the CPU orders them.
  if (cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
          scratch.temp, temp_bytes, logits, scratch.sorted_logits, scratch.ids, scratch.sorted_ids,
          static_cast<int>(total), rows, scratch.offsets, scratch.offsets + 1, 0, 32, stream);
      e != cudaSuccess) {
    return e;
  }
  SelectKernel<<<rows, kSelectThreads, 0, stream>>>(scratch.sorted_logits, scratch.sorted_ids, vocab, params,
                                                    tokens);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
