#include "gpu_service/backends/cuda/moe/indexer.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ double BlockSum(double v, double* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

// y (di, shared memory) = RoPE_pos(gamma ⊙ ρ(x)); x may be in shared memory. Ends with a barrier.
__device__ void NormRope(const float* x, const float* gamma, int di, int rot, double theta, float eps, int64_t pos,
                         float* y, double* scratch) {
  double ss = 0.0;
  for (int i = threadIdx.x; i < di; i += kThreads) ss += static_cast<double>(x[i]) * x[i];
  ss = BlockSum(ss, scratch);
  const float scale = static_cast<float>(1.0 / sqrt(ss / di + eps));
  for (int i = threadIdx.x; i < di; i += kThreads) y[i] = gamma[i] * (x[i] * scale);
  __syncthreads();
  const int half = rot / 2;
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const double angle = static_cast<double>(pos) * pow(theta, -2.0 * i / static_cast<double>(rot));
    const double c = cos(angle), s = sin(angle);
    const double a = y[i], b = y[i + half];
    y[i] = static_cast<float>(a * c - b * s);
    y[i + half] = static_cast<float>(a * s + b * c);
  }
  __syncthreads();
}

// One block per (token, head j <= ih); j == ih copies the raw index key.
__global__ void __launch_bounds__(kThreads) PrepareKernel(const float* iqk, const float* q_norm, int ih, int di, int rot,
                                                          double theta, float eps, int64_t start_pos, float* iq,
                                                          float* index_keys) {
  extern __shared__ float y[];
  __shared__ double scratch[kWarps];
  const int t = blockIdx.x / (ih + 1), j = blockIdx.x % (ih + 1);
  const int64_t row = static_cast<int64_t>(t) * (static_cast<int64_t>(ih) * di + di);
  const float* src = iqk + row + static_cast<int64_t>(j) * di;
  if (j == ih) {
    float* dst = index_keys + (start_pos + t) * di;
    for (int i = threadIdx.x; i < di; i += kThreads) dst[i] = src[i];
    return;
  }
  NormRope(src, q_norm, di, rot, theta, eps, start_pos + t, y, scratch);
  float* dst = iq + (static_cast<int64_t>(t) * ih + j) * di;
  for (int i = threadIdx.x; i < di; i += kThreads) dst[i] = y[i];
}

__global__ void __launch_bounds__(kThreads) BlockKeyKernel(const float* index_keys, const float* k_norm,
                                                           int64_t first_block, int cr, int di, int rot, double theta,
                                                           float eps, float* block_keys) {
  extern __shared__ float mean[];  // di, then di for the result
  __shared__ double scratch[kWarps];
  const int64_t b = first_block + blockIdx.x;
  for (int i = threadIdx.x; i < di; i += kThreads) {
    double s = 0.0;
    for (int64_t p = b * cr; p < (b + 1) * cr; ++p) s += index_keys[p * di + i];
    mean[i] = static_cast<float>(s / cr);
  }
  __syncthreads();
  float* y = mean + di;
  NormRope(mean, k_norm, di, rot, theta, eps, b * cr, y, scratch);
  for (int i = threadIdx.x; i < di; i += kThreads) block_keys[b * di + i] = y[i];
}

// grid (n, ceil(max_nb / kWarps)): one warp per (token, block).
__global__ void __launch_bounds__(kThreads) ScoresKernel(const float* iq, const float* block_keys, int ih, int di,
                                                         int64_t start_pos, int cr, float* scores, int stride) {
  const int t = blockIdx.x;
  const int64_t nb = (start_pos + t) / cr;
  const int64_t b = static_cast<int64_t>(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (b >= nb) return;
  const int lane = threadIdx.x & 31;
  const float* kb = block_keys + b * di;
  double total = 0.0;
  for (int j = 0; j < ih; ++j) {
    const float* q = iq + (static_cast<int64_t>(t) * ih + j) * di;
    double d = 0.0;
    for (int i = lane; i < di; i += 32) d += static_cast<double>(q[i]) * kb[i];
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xFFFFFFFFu, d, off);
    total += fmaxf(0.0f, static_cast<float>(d));
  }
  if (lane == 0) scores[static_cast<int64_t>(t) * stride + b] = static_cast<float>(total * (1.0 / sqrt(static_cast<double>(di))));
}

// Order-preserving key of a score: a larger score gives a larger key; −0 counts as +0.
__device__ __forceinline__ uint32_t ScoreKey(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum over the block's threads (one value each), in shared memory.
__device__ int BlockExclusiveScan(int v, int* buf, int* total) {
  buf[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int i = 0; i < kThreads; ++i) {
      const int x = buf[i];
      buf[i] = run;
      run += x;
    }
    buf[kThreads] = run;
  }
  __syncthreads();
  const int out = buf[threadIdx.x];
  *total = buf[kThreads];
  __syncthreads();
  return out;
}

// One block per token. Radix selection of the keep-th largest key, then ties broken by block order,
// then compaction in ascending block order. Thread i owns the contiguous candidates
// [i·chunk, (i+1)·chunk).
__global__ void __launch_bounds__(kThreads) SelectKernel(const float* scores, int stride, int64_t start_pos, int cr,
                                                         int keep, int32_t* blocks, int32_t* counts) {
  __shared__ int hist[256];
  __shared__ int buf[kThreads + 1];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining;
  const int t = blockIdx.x;
  const int64_t p = start_pos + t;
  const int nb = static_cast<int>(p / cr);
  int32_t* out = blocks + static_cast<int64_t>(t) * (keep + 1);
  const float* row = scores + static_cast<int64_t>(t) * stride;
  if (nb <= keep) {
    for (int b = threadIdx.x; b <= nb; b += kThreads) out[b] = b;
    if (threadIdx.x == 0) counts[t] = nb + 1;
    return;
  }
  const int chunk = (nb + kThreads - 1) / kThreads;
  const int lo = min(nb, static_cast<int>(threadIdx.x) * chunk), hi = min(nb, lo + chunk);
  uint32_t prefix = 0, mask = 0;
  int remaining = keep;  // how many still to take among keys matching prefix under mask
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int b = lo; b < hi; ++b) {
      const uint32_t k = ScoreKey(row[b]);
      if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, d = 255;
      for (; d > 0; --d) {
        if (above + hist[d] >= remaining) break;
        above += hist[d];
      }
      s_prefix = prefix | (static_cast<uint32_t>(d) << shift);
      s_remaining = remaining - above;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
    __syncthreads();
  }
  // prefix is the keep-th largest key; take every larger key and the first `remaining` equal ones.
  int equal = 0;
  for (int b = lo; b < hi; ++b) equal += ScoreKey(row[b]) == prefix;
  int total = 0;
  int eq_rank = BlockExclusiveScan(equal, buf, &total);
  int selected = 0;
  for (int b = lo; b < hi; ++b) {
    const uint32_t k = ScoreKey(row[b]);
    if (k > prefix || (k == prefix && eq_rank++ < remaining)) ++selected;
  }
  int pos = BlockExclusiveScan(selected, buf, &total);
  eq_rank = BlockExclusiveScan(equal, buf, &total);
  for (int b = lo; b < hi; ++b) {
    const uint32_t k = ScoreKey(row[b]);
    if (k > prefix || (k == prefix && eq_rank++ < remaining)) out[pos++] = b;
  }
  if (threadIdx.x == 0) {
    out[keep] = nb;
    counts[t] = keep + 1;
  }
}

}  // namespace

cudaError_t LaunchIndexerPrepare(const float* iqk, const float* q_norm, int n, int ih, int di, int rot, double theta,
                                 float eps, int64_t start_pos, float* iq, float* index_keys, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (ih < 1 || di < 1 || rot < 0 || rot > di || rot % 2 != 0) return cudaErrorInvalidValue;
  PrepareKernel<<<n * (ih + 1), kThreads, di * sizeof(float), stream>>>(iqk, q_norm, ih, di, rot, theta, eps, start_pos,
                                                                       iq, index_keys);
  return cudaGetLastError();
}

cudaError_t LaunchIndexerBlockKeys(const float* index_keys, const float* k_norm, int64_t first_block, int count, int cr,
                                   int di, int rot, double theta, float eps, float* block_keys, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (cr < 1 || di < 1 || rot < 0 || rot > di || rot % 2 != 0) return cudaErrorInvalidValue;
  BlockKeyKernel<<<count, kThreads, 2 * di * sizeof(float), stream>>>(index_keys, k_norm, first_block, cr, di, rot,
                                                                     theta, eps, block_keys);
  return cudaGetLastError();
}

cudaError_t LaunchIndexerScores(const float* iq, const float* block_keys, int n, int ih, int di, int64_t start_pos,
                                int cr, float* scores, int stride, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (cr < 1) return cudaErrorInvalidValue;
  const int64_t max_nb = (start_pos + n - 1) / cr;
  if (max_nb > stride) return cudaErrorInvalidValue;
  if (max_nb == 0) return cudaSuccess;
  ScoresKernel<<<dim3(n, static_cast<unsigned>((max_nb + kWarps - 1) / kWarps)), kThreads, 0, stream>>>(
      iq, block_keys, ih, di, start_pos, cr, scores, stride);
  return cudaGetLastError();
}

cudaError_t LaunchIndexerSelect(const float* scores, int stride, int n, int64_t start_pos, int cr, int keep,
                                int32_t* blocks, int32_t* counts, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (cr < 1 || keep < 0) return cudaErrorInvalidValue;
  SelectKernel<<<n, kThreads, 0, stream>>>(scores, stride, start_pos, cr, keep, blocks, counts);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
