#include "gpu_service/backends/cuda/kernels/attention.cuh"

#include <cmath>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"

namespace tandem::cuda {
namespace {

constexpr int kAttnWarps = 8;
constexpr int kKeyTile = 32;

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

__global__ void QueryNormRopeKernel(const float* qg, int nh, int hd, int rot, float eps,
                                    const float* q_norm, const double* inv_freq,
                                    const int32_t* token_pos, float* q_out) {
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const float x = qg[(t * nh + h) * 2 * hd + threadIdx.x];
  const float y = NormRopeValue(x, q_norm, eps, hd, rot, inv_freq, token_pos[t], pair, scratch);
  q_out[(t * nh + h) * hd + threadIdx.x] = y;
}

__device__ __forceinline__ int64_t CacheOffset(const PagedKv& c, int32_t seq, int64_t pos, int kvw) {
  const int32_t page = c.page_table[static_cast<int64_t>(seq) * c.max_pages + pos / kKvPageSize];
  return (static_cast<int64_t>(page) * kKvPageSize + pos % kKvPageSize) * kvw;
}

__global__ void KvAppendKernel(const float* k, const float* v, int kvh, int hd, int rot, float eps,
                               const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                               const int32_t* token_pos, PagedKv cache) {
  extern __shared__ float pair[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y;
  const int kvw = kvh * hd;
  const int64_t src = t * kvw + static_cast<int64_t>(g) * hd + threadIdx.x;
  const int64_t pos = token_pos[t];
  const float y = NormRopeValue(k[src], k_norm, eps, hd, rot, inv_freq, pos, pair, scratch);
  const int64_t dst = CacheOffset(cache, token_seq[t], pos, kvw) + static_cast<int64_t>(g) * hd + threadIdx.x;
  cache.k[dst] = y;
  cache.v[dst] = v[src];
}

// Block per (work item, kv head); warp w owns row w = (token item_first + w / groups, head
// kvhead·groups + w % groups). Key tiles of 32 positions are staged in shared memory and shared by
// the block's rows (all of one sequence); each row keeps a running max, sum and its output
// accumulator (lane l holds dims l, l+32, ...), so no score matrix is ever stored.
template <int kHd>
__global__ void __launch_bounds__(kAttnWarps * 32)
AttentionKernel(const float* q, const float* qg, int nh, int kvh, const int32_t* items,
                const int32_t* token_seq, const int32_t* token_pos, PagedKv cache, float* o) {
  constexpr int kPer = kHd / 32;
  extern __shared__ float smem[];
  float* ks = smem;                              // kKeyTile × (kHd + 1)
  float* vs = ks + kKeyTile * (kHd + 1);         // kKeyTile × kHd
  float* qs = vs + kKeyTile * kHd;               // kAttnWarps × kHd
  __shared__ int64_t max_pos_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = nh / kvh;
  const int kvhead = blockIdx.y;
  const int32_t first = items[2 * blockIdx.x], count = items[2 * blockIdx.x + 1];
  const int32_t seq = token_seq[first];
  const int kvw = kvh * kHd;
  const bool active = warp / groups < count;
  const int64_t t = first + warp / groups;
  const int head = kvhead * groups + warp % groups;
  const int64_t my_pos = active ? token_pos[t] : -1;
  if (threadIdx.x == 0) {
    int64_t m = 0;
    for (int i = 0; i < count; ++i) m = max(m, static_cast<int64_t>(token_pos[first + i]));
    max_pos_s = m;
  }
  const float scale = rsqrtf(static_cast<float>(kHd));
  if (active) {
    for (int i = lane; i < kHd; i += 32) qs[warp * kHd + i] = q[(t * nh + head) * kHd + i] * scale;
  }
  __syncthreads();
  const int64_t max_pos = max_pos_s;
  float m = -INFINITY, l = 0.0f, acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  for (int64_t base = 0; base <= max_pos; base += kKeyTile) {
    // Stage the tile: 4-float vectors, positions past max_pos are never read.
    for (int e = threadIdx.x; e < kKeyTile * kHd / 4; e += blockDim.x) {
      const int j = e / (kHd / 4), d4 = e % (kHd / 4);
      const int64_t p = base + j;
      float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
      if (p <= max_pos) {
        const int64_t off = CacheOffset(cache, seq, p, kvw) + static_cast<int64_t>(kvhead) * kHd + 4 * d4;
        kv = *reinterpret_cast<const float4*>(cache.k + off);
        vv = *reinterpret_cast<const float4*>(cache.v + off);
      }
      float* kr = ks + j * (kHd + 1) + 4 * d4;
      kr[0] = kv.x;
      kr[1] = kv.y;
      kr[2] = kv.z;
      kr[3] = kv.w;
      *reinterpret_cast<float4*>(vs + j * kHd + 4 * d4) = vv;
    }
    __syncthreads();
    if (active) {
      // Lane j scores key base + j.
      const float* kr = ks + lane * (kHd + 1);
      const float* qr = qs + warp * kHd;
      float s = 0.0f;
#pragma unroll 8
      for (int d = 0; d < kHd; ++d) s = fmaf(qr[d], kr[d], s);
      if (base + lane > my_pos) s = -INFINITY;
      const float m_new = fmaxf(m, WarpMax(s));
      const float corr = expf(m - m_new);
      const float p = expf(s - m_new);
      l = l * corr + WarpSum(p);
      m = m_new;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] *= corr;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xFFFFFFFFu, p, j);
        const float* vr = vs + j * kHd + lane;
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[i] = fmaf(pj, vr[32 * i], acc[i]);
      }
    }
    __syncthreads();
  }
  if (!active) return;
  const float inv = 1.0f / l;
  const float* gate = qg + (t * nh + head) * 2 * kHd + kHd;
  float* out = o + (t * nh + head) * kHd;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    out[d] = acc[i] * inv * SigmoidF(gate[d]);
  }
}

template <int kHd>
cudaError_t LaunchAttentionHd(const float* q, const float* qg, const AttnShape& d, const int32_t* items,
                              int num_items, const int32_t* token_seq, const int32_t* token_pos,
                              const PagedKv& cache, float* o, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (kKeyTile * (kHd + 1) + kKeyTile * kHd + kAttnWarps * kHd);
  // Above 48 KiB a kernel needs the opt-in; done once per instantiation (thread-safe static).
  static const cudaError_t attribute = cudaFuncSetAttribute(
      AttentionKernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attribute != cudaSuccess) return attribute;
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(d.kvh));
  AttentionKernel<kHd><<<grid, kAttnWarps * 32, smem, stream>>>(q, qg, d.nh, d.kvh, items, token_seq,
                                                                token_pos, cache, o);
  return cudaGetLastError();
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
                                cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!NormRopeShapeOk(d)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.nh));
  QueryNormRopeKernel<<<grid, d.hd, d.hd * sizeof(float), stream>>>(qg, d.nh, d.hd, d.rot, d.eps, q_norm,
                                                                    inv_freq, token_pos, q_out);
  return cudaGetLastError();
}

cudaError_t LaunchKvAppend(const float* k, const float* v, int64_t n, const AttnShape& d,
                           const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                           const int32_t* token_pos, const PagedKv& cache, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!NormRopeShapeOk(d)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(d.kvh));
  KvAppendKernel<<<grid, d.hd, d.hd * sizeof(float), stream>>>(k, v, d.kvh, d.hd, d.rot, d.eps, k_norm,
                                                               inv_freq, token_seq, token_pos, cache);
  return cudaGetLastError();
}

std::vector<int32_t> PlanAttentionItems(const std::vector<int32_t>& token_seq, int groups) {
  std::vector<int32_t> items;
  if (groups <= 0 || kAttnWarps % groups != 0) return items;
  const int per_item = kAttnWarps / groups;
  const int32_t n = static_cast<int32_t>(token_seq.size());
  for (int32_t t = 0; t < n;) {
    int32_t c = 1;
    while (c < per_item && t + c < n && token_seq[t + c] == token_seq[t]) ++c;
    items.push_back(t);
    items.push_back(c);
    t += c;
  }
  return items;
}

cudaError_t LaunchAttention(const float* q, const float* qg, int64_t n, const AttnShape& d,
                            const int32_t* items, int num_items, const int32_t* token_seq,
                            const int32_t* token_pos, const PagedKv& cache, float* o,
                            cudaStream_t stream) {
  if (n <= 0 || num_items <= 0) return cudaSuccess;
  if (d.kvh <= 0 || d.nh % d.kvh != 0 || kAttnWarps % (d.nh / d.kvh) != 0) return cudaErrorInvalidValue;
  switch (d.hd) {
    case 64: return LaunchAttentionHd<64>(q, qg, d, items, num_items, token_seq, token_pos, cache, o, stream);
    case 128: return LaunchAttentionHd<128>(q, qg, d, items, num_items, token_seq, token_pos, cache, o, stream);
    case 256: return LaunchAttentionHd<256>(q, qg, d, items, num_items, token_seq, token_pos, cache, o, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
