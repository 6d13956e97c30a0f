#include "gpu_service/backends/cuda/backend/sparse_attention.cuh"

namespace tandem::cuda {
namespace {

constexpr int kPageSize = 64;  // kernels/attention.cuh's kKvPageSize
constexpr int kMaxPerLane = 8;  // hd <= 256

__global__ void SparseAttentionKernel(SparseAttnArgs a) {
  const int64_t t = blockIdx.x / a.nh;
  const int head = blockIdx.x % a.nh;
  const int lane = threadIdx.x;
  const int per_lane = a.hd / 32;
  const int g = head / (a.nh / a.kvh);
  const int kvw = a.kvh * a.hd;
  const float* q = a.q + (t * a.nh + head) * a.hd;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  for (int i = 0; i < per_lane; ++i) {
    qv[i] = q[lane + 32 * i];
    acc[i] = 0.0f;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(a.hd));
  const int64_t p = a.token_pos[t];
  const int32_t* table = a.page_table + static_cast<int64_t>(a.token_seq[t]) * a.max_pages;
  float running_max = -INFINITY, denom = 0.0f;
  const int count = a.counts[t];
  for (int bi = 0; bi < count; ++bi) {
    const int64_t b = a.blocks[t * a.max_selected + bi];
    const int64_t first = b * a.cr;
    const int64_t last = min(first + a.cr, p + 1);
    for (int64_t j = first; j < last; ++j) {
      const int64_t off = (static_cast<int64_t>(table[j / kPageSize]) * kPageSize + j % kPageSize) * kvw +
                          static_cast<int64_t>(g) * a.hd;
      const float* k = a.k_cache + off;
      float dot = 0.0f;
      for (int i = 0; i < per_lane; ++i) dot += qv[i] * k[lane + 32 * i];
      for (int s = 16; s > 0; s >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, s);
      const float score = dot * scale;
      const float new_max = fmaxf(running_max, score);
      const float rescale = expf(running_max - new_max);  // 0 on the first position
      const float w = expf(score - new_max);
      denom = denom * rescale + w;
      const float* v = a.v_cache + off;
      for (int i = 0; i < per_lane; ++i) acc[i] = acc[i] * rescale + w * v[lane + 32 * i];
      running_max = new_max;
    }
  }
  const float* gate = a.qg + (t * a.nh + head) * 2 * a.hd + a.hd;
  float* o = a.o + (t * a.nh + head) * a.hd;
  for (int i = 0; i < per_lane; ++i) {
    const int e = lane + 32 * i;
    const float gv = gate[e];
    o[e] = (acc[i] / denom) * (1.0f / (1.0f + expf(-gv)));
  }
}

}  // namespace

cudaError_t LaunchSparseAttention(const SparseAttnArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return cudaSuccess;
  if (a.hd % 32 != 0 || a.hd > 32 * kMaxPerLane || a.kvh <= 0 || a.nh % a.kvh != 0 || a.cr <= 0 ||
      a.max_selected <= 0) {
    return cudaErrorInvalidValue;
  }
  SparseAttentionKernel<<<static_cast<unsigned>(a.n * a.nh), 32, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
