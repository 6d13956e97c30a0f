// The per-token preparation of gated attention (attention.cuh): q and k per-head RMS norm with
// partial NeoX RoPE and the K/V append into the paged cache, as two kernels (LaunchQueryNormRope,
// LaunchKvAppend) or as one launch over both (LaunchQkvNormRopeAppend: the decode path, one launch
// fewer on the attention layer's critical path). Every block computes one head of one token with
// the same device code in either form, so both give the same bits.
#include <cmath>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// y = RoPE_pos(gamma ⊙ ρ(x)) for one head of hd values, one thread per value (blockDim.x == hd).
// The rotation is computed in f64 like the CPU reference. `pair` is hd floats of shared memory.
__device__ float NormRopeValue(float x, const float* gamma, float eps, int hd, int rot,
                               const double* inv_freq, int64_t pos, float* pair, float* scratch) {
  const int i = threadIdx.x;
  const float ss = BlockSum(x * x, scratch);
  const float y = gamma[i] * (x * rsqrtf(ss / static_cast<float>(hd) + eps));
  pair[i] = y;
  __syncthreads();
  const int half = rot / 2;
  if (i >= rot) return y;
  const int f = i < half ? i : i - half;
  double s, c;
  sincos(static_cast<double>(pos) * inv_freq[f], &s, &c);
  if (i < half) return static_cast<float>(static_cast<double>(y) * c - static_cast<double>(pair[i + half]) * s);
  return static_cast<float>(static_cast<double>(pair[i - half]) * s + static_cast<double>(y) * c);
}

// qg's token rows are qg_stride floats apart (at least nh·2hd).
__global__ void QueryNormRopeKernel(const float* qg, int64_t qg_stride, int nh, int hd, int rot, float eps,
                                    const float* q_norm, const double* inv_freq,
                                    const int32_t* token_pos, float* q_out) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const float x = qg[t * qg_stride + static_cast<int64_t>(h) * 2 * hd + threadIdx.x];
  const float y = NormRopeValue(x, q_norm, eps, hd, rot, inv_freq, token_pos[t], pair, scratch);
  q_out[(t * nh + h) * hd + threadIdx.x] = y;
}

__device__ __forceinline__ int64_t CacheOffset(const PagedKv& c, int32_t seq, int64_t pos, int kvw) {
  const int32_t page = c.page_table[static_cast<int64_t>(seq) * c.max_pages + pos / kKvPageSize];
  return (static_cast<int64_t>(page) * kKvPageSize + pos % kKvPageSize) * kvw;
}

// k's and v's token rows are kv_stride floats apart (the cache's: kvh·hd).
__global__ void KvAppendKernel(const float* k, const float* v, int64_t kv_stride, int kvh, int hd, int rot, float eps,
                               const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                               const int32_t* token_pos, PagedKv cache) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y;
  const int kvw = kvh * hd;
  const int64_t src = t * kv_stride + static_cast<int64_t>(g) * hd + threadIdx.x;
  const int64_t pos = token_pos[t];
  const float y = NormRopeValue(k[src], k_norm, eps, hd, rot, inv_freq, pos, pair, scratch);
  const int64_t dst = CacheOffset(cache, token_seq[t], pos, kvw) + static_cast<int64_t>(g) * hd + threadIdx.x;
  cache.k[dst] = y;
  cache.v[dst] = v[src];
}

// QueryNormRopeKernel and KvAppendKernel in one grid: block (t, y) is query head y of token t for
// y < nh, else kv head y - nh (its key normed, roped and stored with its value). The per-head code
// (NormRopeValue, the indexing) is the two kernels' own, so the outputs are bit-identical to
// theirs. Row strides: floats from one token's row to the next in qg (q and gate per head), k and
// v, so that they may be parts of one stacked product's rows.
__global__ void QkvNormRopeAppendKernel(const float* qg, int64_t qg_stride, const float* k, int64_t k_stride,
                                        const float* v, int64_t v_stride, int nh, int kvh, int hd, int rot,
                                        float eps, const float* q_norm, const float* k_norm,
                                        const double* inv_freq, const int32_t* token_seq,
                                        const int32_t* token_pos, float* q_out, PagedKv cache) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  if (static_cast<int>(blockIdx.y) < nh) {  // block-uniform: NormRopeValue's barriers stay whole
    const int h = blockIdx.y;
    const float x = qg[t * qg_stride + static_cast<int64_t>(h) * 2 * hd + threadIdx.x];
    const float y = NormRopeValue(x, q_norm, eps, hd, rot, inv_freq, token_pos[t], pair, scratch);
    q_out[(t * nh + h) * hd + threadIdx.x] = y;
    return;
  }
  const int g = static_cast<int>(blockIdx.y) - nh;
  const int kvw = kvh * hd;
  const int64_t col = static_cast<int64_t>(g) * hd + threadIdx.x;
  const int64_t pos = token_pos[t];
  const float y = NormRopeValue(k[t * k_stride + col], k_norm, eps, hd, rot, inv_freq, pos, pair, scratch);
  const int64_t dst = CacheOffset(cache, token_seq[t], pos, kvw) + col;
  cache.k[dst] = y;
  cache.v[dst] = v[t * v_stride + col];
}

bool NormRopeShapeOk(const AttnShape& d) {
  return d.hd > 0 && d.hd <= 1024 && d.hd % 32 == 0 && d.rot >= 0 && d.rot % 2 == 0 && d.rot <= d.hd;
}

}  // namespace

std::vector<double> RopeInvFrequencies(double theta, int rot) {
  std::vector<double> f(static_cast<size_t>(rot / 2));
  for (int i = 0; i < rot / 2; ++i) f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
  return f;
}

cudaError_t LaunchQueryNormRope(const float* qg, int64_t n, const AttnShape& d, const float* q_norm,
                                const double* inv_freq, const int32_t* token_pos, float* q_out,
                                cudaStream_t stream, int64_t qg_stride) {
  if (n <= 0) return cudaSuccess;
  if (qg_stride == 0) qg_stride = static_cast<int64_t>(d.nh) * 2 * d.hd;
  if (!NormRopeShapeOk(d) || qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.nh));
  return LaunchPdl(QueryNormRopeKernel, grid, d.hd, d.hd * sizeof(float), stream, qg, qg_stride, d.nh, d.hd, d.rot,
                   d.eps, q_norm, inv_freq, token_pos, q_out);
}

cudaError_t LaunchKvAppend(const float* k, const float* v, int64_t n, const AttnShape& d,
                           const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                           const int32_t* token_pos, const PagedKv& cache, cudaStream_t stream, int64_t kv_stride) {
  if (n <= 0) return cudaSuccess;
  if (kv_stride == 0) kv_stride = d.kv_width();
  if (!NormRopeShapeOk(d) || kv_stride < d.kv_width()) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.kvh));
  return LaunchPdl(KvAppendKernel, grid, d.hd, d.hd * sizeof(float), stream, k, v, kv_stride, d.kvh, d.hd, d.rot, d.eps,
                   k_norm, inv_freq, token_seq, token_pos, cache);
}

cudaError_t LaunchQkvNormRopeAppend(const QkvRows& rows, int64_t n, const AttnShape& d, const float* q_norm,
                                    const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                                    const int32_t* token_pos, float* q_out, const PagedKv& cache,
                                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t qg_stride = rows.qg_stride == 0 ? static_cast<int64_t>(d.nh) * 2 * d.hd : rows.qg_stride;
  const int64_t k_stride = rows.k_stride == 0 ? d.kv_width() : rows.k_stride;
  const int64_t v_stride = rows.v_stride == 0 ? d.kv_width() : rows.v_stride;
  if (!NormRopeShapeOk(d) || d.nh <= 0 || d.kvh <= 0 || qg_stride < static_cast<int64_t>(d.nh) * 2 * d.hd ||
      k_stride < d.kv_width() || v_stride < d.kv_width()) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.nh + d.kvh));
  return LaunchPdl(QkvNormRopeAppendKernel, grid, d.hd, d.hd * sizeof(float), stream, rows.qg, qg_stride, rows.k,
                   k_stride, rows.v, v_stride, d.nh, d.kvh, d.hd, d.rot, d.eps, q_norm, k_norm, inv_freq, token_seq,
                   token_pos, q_out, cache);
}

}  // namespace tandem::cuda
