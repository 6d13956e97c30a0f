#include "gpu_service/backends/cuda/kernels/gdn_decode.cuh"

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

constexpr int kMaxThreads = 256;

// One channel's conv inputs in registers: its taps, its kk−1 history entries and the new input.
// Loading every channel's window before any history is written lets the loads of a thread's
// channels (and its state column) be in flight together: the writes would otherwise order them.
struct ConvWindow {
  float w[kGdnMaxConvKernel];
  float win[kGdnMaxConvKernel];
  float x;
};

__device__ __forceinline__ void LoadWindow(const float* qkv, const float* history, const float* taps, int c,
                                           int c_dim, int kk, ConvWindow& cw) {
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    cw.w[q] = q < kk ? taps[static_cast<int64_t>(c) * kk + q] : 0.0f;
    cw.win[q] = q < kk - 1 ? history[static_cast<int64_t>(q) * c_dim + c] : 0.0f;
  }
  cw.x = qkv[c];
}

// SiLU(conv) of the channel for the new token, and its history shifted by that token: gdn.cu's
// GdnConvKernel for n = 1, the same operations in the same order (the same bits).
__device__ __forceinline__ float ConvStep(const ConvWindow& cw, float* history, int c, int c_dim, int kk) {
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    if (q < kk - 1) sum = fmaf(cw.w[q], cw.win[q], sum);
  }
  float last = 0.0f;
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    if (q == kk - 1) last = cw.w[q];
  }
  sum = fmaf(last, cw.x, sum);
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    if (q < kk - 1) history[static_cast<int64_t>(q) * c_dim + c] = q + 1 < kk - 1 ? cw.win[q + 1] : cw.x;
  }
  return SiluF(sum);
}

template <int kDk>
// At most kMaxThreads threads: each keeps a kDk-float state column in registers.
__global__ void __launch_bounds__(kMaxThreads) GdnDecodeFusedKernel(GdnDecodeArgs a) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  __shared__ float qs[kDk], ks[kDk];
  __shared__ float gate_g[32], gate_beta[32];
  __shared__ float scratch[32];
  const GdnShape& d = a.shape;
  const int c_dim = 2 * d.nk * d.dk + d.nv * d.dv;  // GdnShape::c_dim, which is host-only
  const int r = d.nv / d.nk, dv = d.dv;
  const int group = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int tid = threadIdx.x;
  const int64_t row = a.rows[t];
  float* history = a.history + row * a.row_stride;
  const float* qkv = a.qkv + t * c_dim;

  const int head_local = tid / dv, col = tid - head_local * dv;
  const int vh = group * r + head_local;
  // The thread's state column first: the largest read, independent of everything before step 4.
  float* S = a.state + row * a.row_stride + static_cast<int64_t>(vh) * kDk * dv + col;
  float s[kDk];
#pragma unroll
  for (int i = 0; i < kDk; ++i) s[i] = S[static_cast<int64_t>(i) * dv];

  // 1. Conv of the group's q and k channels (this block alone) and of each thread's v channel.
  const int qc = group * kDk + tid, kc = d.nk * kDk + group * kDk + tid, vc = 2 * d.nk * kDk + vh * dv + col;
  ConvWindow qw, kw, vw;
  if (tid < kDk) {
    LoadWindow(qkv, history, a.taps, qc, c_dim, d.kk, qw);
    LoadWindow(qkv, history, a.taps, kc, c_dim, d.kk, kw);
  }
  LoadWindow(qkv, history, a.taps, vc, c_dim, d.kk, vw);
  float q_raw = 0.0f, k_raw = 0.0f;
  if (tid < kDk) {
    q_raw = ConvStep(qw, history, qc, c_dim, d.kk);
    k_raw = ConvStep(kw, history, kc, c_dim, d.kk);
  }
  const float v = ConvStep(vw, history, vc, c_dim, d.kk);

  // 2. L2 norms of q (also scaled by 1/√dk) and k, as gdn.cu's GdnNormQkKernel.
  const float q_ss = BlockSum(q_raw * q_raw, scratch);
  const float k_ss = BlockSum(k_raw * k_raw, scratch);
  if (tid < kDk) {
    qs[tid] = q_raw * (rsqrtf(q_ss + 1e-6f) * rsqrtf(static_cast<float>(kDk)));
    ks[tid] = k_raw * rsqrtf(k_ss + 1e-6f);
  }
  // 3. The gates of the group's value heads (gdn.cu's GdnGates).
  if (tid < r) {
    const float* ba_row = a.ba + t * 2 * d.nv + static_cast<int64_t>(group) * 2 * r;
    const int h = group * r + tid;
    gate_beta[tid] = SigmoidF(ba_row[tid]);
    const float x = ba_row[r + tid] + a.dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    gate_g[tid] = a.ssm_a[h] * sp;
  }
  __syncthreads();

  // 4. The delta rule on this thread's state column (gdn.cu's GdnRecurrentKernel for one token).
  const float decay = expf(gate_g[head_local]);
  const float b = gate_beta[head_local];
  float kv = 0.0f;
#pragma unroll
  for (int i = 0; i < kDk; ++i) {
    s[i] *= decay;
    kv = fmaf(ks[i], s[i], kv);
  }
  const float delta = b * (v - kv);
  float o = 0.0f;
#pragma unroll
  for (int i = 0; i < kDk; ++i) {
    s[i] = fmaf(ks[i], delta, s[i]);
    o = fmaf(qs[i], s[i], o);
  }
#pragma unroll
  for (int i = 0; i < kDk; ++i) S[static_cast<int64_t>(i) * dv] = s[i];

  // 5. Gated RMS norm over the value head's dv outputs: its warps' partial sums in warp order.
  const float part = WarpSum(o * o);
  const int warp = tid >> 5, warps_per_head = dv >> 5;
  __syncthreads();  // scratch was read by the norms above
  if ((tid & 31) == 0) scratch[warp] = part;
  __syncthreads();
  float ss = 0.0f;
  for (int w = 0; w < warps_per_head; ++w) ss += scratch[head_local * warps_per_head + w];
  const float scale = rsqrtf(ss / static_cast<float>(dv) + a.eps);
  const int64_t at = t * d.nv * dv + static_cast<int64_t>(vh) * dv + col;
  a.out[at] = a.norm[col] * (o * scale) * SiluF(a.z[at]);
}

}  // namespace

bool GdnDecodeFusedSupports(const GdnShape& d) {
  if (d.nk <= 0 || d.nv % d.nk != 0 || d.dv <= 0 || d.dv % 32 != 0) return false;
  const int threads = d.nv / d.nk * d.dv;
  return (d.dk == 64 || d.dk == 128) && threads <= kMaxThreads && d.dk <= threads && d.nv / d.nk <= 32 && d.kk >= 1 &&
         d.kk <= kGdnMaxConvKernel;
}

cudaError_t LaunchGdnDecodeFused(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (!GdnDecodeFusedSupports(a.shape) || a.n < 1 || a.n > 65535 || a.rows == nullptr || a.qkv == nullptr ||
      a.z == nullptr || a.ba == nullptr || a.taps == nullptr || a.ssm_a == nullptr || a.dt_bias == nullptr ||
      a.norm == nullptr || a.history == nullptr || a.state == nullptr || a.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(a.shape.nk), static_cast<unsigned>(a.n));
  const unsigned threads = static_cast<unsigned>(a.shape.nv / a.shape.nk * a.shape.dv);
  if (a.shape.dk == 128) return LaunchPdl(GdnDecodeFusedKernel<128>, grid, threads, 0, stream, a);
  return LaunchPdl(GdnDecodeFusedKernel<64>, grid, threads, 0, stream, a);
}

}  // namespace tandem::cuda
