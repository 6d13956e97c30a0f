#include "gpu_service/backends/cuda/kernels/gdn.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_delta_rule.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_gates.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// One thread per channel walks the tokens in order, so the history update needs no other thread.
// With rows (decode of several sequences, one token each): grid.y is the token, whose history is at
// history + rows[t]·row_stride and its qkv row at qkv + t·qkv_stride.
__global__ void GdnConvKernel(const float* qkv, float* history, const float* taps, int64_t n,
                              int c_dim, int kk, float* out, const int32_t* rows, int64_t row_stride,
                              int64_t qkv_stride) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= c_dim) return;
  if (rows != nullptr) {
    const int64_t t = blockIdx.y;
    history += rows[t] * row_stride;
    qkv += t * qkv_stride;
    out += t * c_dim;
  }
  float win[kGdnMaxConvKernel];  // win[q] = input at token t − (kk−1−q)
  float w[kGdnMaxConvKernel];
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    w[q] = q < kk ? taps[static_cast<int64_t>(c) * kk + q] : 0.0f;
    win[q] = q < kk - 1 ? history[static_cast<int64_t>(q) * c_dim + c] : 0.0f;
  }
  for (int64_t t = 0; t < n; ++t) {
    const float x = qkv[t * c_dim + c];
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kGdnMaxConvKernel; ++q) {
      if (q < kk - 1) sum = fmaf(w[q], win[q], sum);
    }
    sum = fmaf(w[kk - 1], x, sum);
    out[t * c_dim + c] = SiluF(sum);
    // Shift the window by one token.
#pragma unroll
    for (int q = 0; q + 1 < kGdnMaxConvKernel; ++q) {
      if (q + 1 < kk - 1) win[q] = win[q + 1];
    }
    if (kk > 1) {
#pragma unroll
      for (int q = 0; q < kGdnMaxConvKernel; ++q) {
        if (q == kk - 2) win[q] = x;
      }
    }
  }
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    if (q < kk - 1) history[static_cast<int64_t>(q) * c_dim + c] = win[q];
  }
}

// Prefill: thread (channel, token) computes one output from the inputs it needs (the history for
// positions before the chunk), in the same order of operations as GdnConvKernel, so that both give
// the same bits. The history is updated afterwards by GdnConvShiftKernel.
__global__ void GdnConvTokensKernel(const float* qkv, int64_t qkv_stride, const float* history, const float* taps,
                                    int64_t n, int c_dim, int kk, float* out) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (c >= c_dim) return;
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kGdnMaxConvKernel; ++q) {
    if (q < kk - 1) {
      const int64_t j = t - (kk - 1) + q;  // input position; < 0 is in the history
      const float v = j >= 0 ? qkv[j * qkv_stride + c] : history[(kk - 1 + j) * c_dim + c];
      sum = fmaf(taps[static_cast<int64_t>(c) * kk + q], v, sum);
    }
  }
  sum = fmaf(taps[static_cast<int64_t>(c) * kk + kk - 1], qkv[t * qkv_stride + c], sum);
  out[t * c_dim + c] = SiluF(sum);
}

// history ← the last kk−1 inputs of (history, qkv[0..n)), oldest first. Ascending q reads slots
// above q before they are overwritten.
__global__ void GdnConvShiftKernel(const float* qkv, int64_t qkv_stride, float* history, int64_t n, int c_dim, int kk) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= c_dim) return;
  for (int q = 0; q < kk - 1; ++q) {
    const int64_t j = q + n;  // index into (history, qkv) of the input that becomes history[q]
    history[static_cast<int64_t>(q) * c_dim + c] =
        j < kk - 1 ? history[j * c_dim + c] : qkv[(j - (kk - 1)) * qkv_stride + c];
  }
}

__device__ void GdnGates(const float* ba, int64_t ba_stride, const float* ssm_a, const float* dt_bias, int64_t t, int nk,
                         int nv, float* g, float* beta) {
  for (int vh = threadIdx.x; vh < nv; vh += blockDim.x) {
    GdnGate(ba, ba_stride, ssm_a, dt_bias, t, vh, nv / nk, nv, g, beta);
  }
}

// Block per (token, q or k head): L2 normalisation in place; the block of y = 2nk computes the
// token's gates (one launch for both: decode runs this once per layer and token).
__global__ void GdnNormQkKernel(float* conv_out, int c_dim, int nk, int dk, float q_scale, const float* ba,
                                int64_t ba_stride, const float* ssm_a, const float* dt_bias, int nv, float* g,
                                float* beta) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y;  // 0..nk−1: q heads, nk..2nk−1: k heads, 2nk: the gates
  if (head == 2 * nk) {
    GdnGates(ba, ba_stride, ssm_a, dt_bias, t, nk, nv, g, beta);
    return;
  }
  float* x = conv_out + t * c_dim + static_cast<int64_t>(head) * dk;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += x[i] * x[i];
  ss = BlockSum(ss, scratch);
  float scale = rsqrtf(ss + 1e-6f);
  if (head < nk) scale *= q_scale;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) x[i] *= scale;
}

// Grid (nv, dv / 32), block (32, kWarps): lane j of every warp owns state column S[·][col] of its
// value head; warp w keeps rows [w·kDk/kWarps, (w+1)·kDk/kWarps) of that column in registers for
// all n tokens, and the two dot products over the key dimension (k·S and q·S) are summed across the
// warps through shared memory in a fixed order (deterministic). Why split the rows: with one warp
// per column block (kWarps = 1) a batch-1 decode step ran 128 warps on 132 SMs, each with 128
// dependent-latency loads of its state, ~6.6 us for 2 MiB; eight warps per block put every state
// load of the layer in flight at once.
template <int kDk, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
GdnRecurrentKernel(const float* conv_out, const float* g, const float* beta, int64_t n, int c_dim,
                   int nk, int nv, int dv, float* state, float* o, const int32_t* rows, int64_t row_stride) {
  static_assert(kDk % kWarps == 0, "the key dimension splits evenly across the warps");
  constexpr int kRows = kDk / kWarps;
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  __shared__ float qs[kDk], ks[kDk];
  __shared__ float kv_part[kWarps][32], out_part[kWarps][32];
  if (rows != nullptr) {  // grid.z is the token of its own sequence (decode of several sequences)
    const int64_t t = blockIdx.z;
    state += rows[t] * row_stride;
    conv_out += t * c_dim;
    g += t * nv;
    beta += t * nv;
    o += t * nv * dv;
  }
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int vh = blockIdx.x;
  const int col = blockIdx.y * 32 + lane;
  const int group = vh / (nv / nk);
  const int i0 = warp * kRows;
  float* S = state + (static_cast<int64_t>(vh) * kDk + i0) * dv + col;
  float s[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) s[i] = S[static_cast<int64_t>(i) * dv];
  for (int64_t t = 0; t < n; ++t) {
    const float* row = conv_out + t * c_dim;
    __syncthreads();  // the previous token's reads of qs/ks are done
    for (int i = warp * 32 + lane; i < kDk; i += 32 * kWarps) {
      qs[i] = row[group * kDk + i];
      ks[i] = row[nk * kDk + group * kDk + i];
    }
    __syncthreads();
    const float decay = expf(g[t * nv + vh]);
    const float b = beta[t * nv + vh];
    const float v = row[2 * nk * kDk + static_cast<int64_t>(vh) * dv + col];
    float out = DeltaRuleColumnStep<kRows, kWarps>(s, qs + i0, ks + i0, decay, b, v, kv_part, warp, lane);
    out_part[warp][lane] = out;
    __syncthreads();
    if (warp == 0) {
      out = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) out += out_part[w][lane];
      o[t * nv * dv + static_cast<int64_t>(vh) * dv + col] = out;
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) S[static_cast<int64_t>(i) * dv] = s[i];
}

// Block per (token, value head); z's token rows z_stride apart.
__global__ void GdnGatedNormKernel(const float* o, const float* z, int64_t z_stride, int nv, const float* norm,
                                   float eps, int dv, float* out) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dv;  // (t·nv + vh)·dv
  const float* zr = z + static_cast<int64_t>(blockIdx.x / nv) * z_stride + static_cast<int64_t>(blockIdx.x % nv) * dv;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += o[base + i] * o[base + i];
  ss = BlockSum(ss, scratch);
  const float scale = rsqrtf(ss / static_cast<float>(dv) + eps);
  for (int i = threadIdx.x; i < dv; i += blockDim.x) {
    out[base + i] = norm[i] * (o[base + i] * scale) * SiluF(zr[i]);
  }
}

}  // namespace

cudaError_t LaunchGdnConvGeneral(const float* qkv, float* history, const float* taps, int64_t n,
                                 const GdnShape& d, float* out, cudaStream_t stream, int64_t qkv_stride) {
  if (n <= 0) return cudaSuccess;
  if (d.kk < 1 || d.kk > kGdnMaxConvKernel) return cudaErrorInvalidValue;
  const int c_dim = d.c_dim();
  if (qkv_stride == 0) qkv_stride = c_dim;
  if (qkv_stride < c_dim) return cudaErrorInvalidValue;
  if (n == 1) {  // one row: its stride does not matter
    return LaunchPdl(GdnConvKernel, (c_dim + 127) / 128, 128, 0, stream, qkv, history, taps, n, c_dim, d.kk, out,
                     nullptr, 0, int64_t{c_dim});
  }
  // Several tokens: every output in parallel (one thread walking the tokens in order was latency-
  // bound: ~8 ms per layer at 8192 tokens), then the history.
  if (n > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((c_dim + 127) / 128), static_cast<unsigned>(n));
  if (cudaError_t e =
          LaunchPdl(GdnConvTokensKernel, grid, 128, 0, stream, qkv, qkv_stride, history, taps, n, c_dim, d.kk, out);
      e != cudaSuccess) {
    return e;
  }
  return LaunchPdl(GdnConvShiftKernel, (c_dim + 127) / 128, 128, 0, stream, qkv, qkv_stride, history, n, c_dim, d.kk);
}

cudaError_t LaunchGdnConvDecode(const float* qkv, float* history, int64_t row_stride, const int32_t* rows,
                                const float* taps, int64_t n, const GdnShape& d, float* out, cudaStream_t stream,
                                int64_t qkv_stride) {
  if (n <= 0) return cudaSuccess;
  const int c_dim = d.c_dim();
  if (qkv_stride == 0) qkv_stride = c_dim;
  if (d.kk < 1 || d.kk > kGdnMaxConvKernel || rows == nullptr || n > 65535 || qkv_stride < c_dim) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((c_dim + 127) / 128), static_cast<unsigned>(n));
  return LaunchPdl(GdnConvKernel, grid, 128, 0, stream, qkv, history, taps, 1, c_dim, d.kk, out, rows, row_stride,
                   qkv_stride);
}

cudaError_t LaunchGdnPrepareGeneral(float* conv_out, const float* ba, const float* ssm_a,
                                    const float* dt_bias, int64_t n, const GdnShape& d, float* g,
                                    float* beta, cudaStream_t stream, int64_t ba_stride) {
  if (n <= 0) return cudaSuccess;
  if (ba_stride == 0) ba_stride = 2 * static_cast<int64_t>(d.nv);
  if (d.nk <= 0 || d.nv % d.nk != 0 || n > 0x7FFFFFFF || ba_stride < 2 * d.nv) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(2 * d.nk + 1));
  return LaunchPdl(GdnNormQkKernel, grid, 128, 0, stream, conv_out, d.c_dim(), d.nk, d.dk, rsqrtf(static_cast<float>(d.dk)), ba,
                   ba_stride, ssm_a, dt_bias, d.nv, g, beta);
}

namespace {

// Eight warps a block: the split that keeps every state load of a layer in flight (kernel comment).
constexpr int kRecurrentWarps = 8;

cudaError_t LaunchRecurrent(const float* conv_out, const float* g, const float* beta, int64_t n, const GdnShape& d,
                            float* state, float* o, const int32_t* rows, int64_t row_stride, dim3 grid,
                            cudaStream_t stream) {
  const dim3 block(32, kRecurrentWarps);
  if (d.dk == 128) {
    return LaunchPdl(GdnRecurrentKernel<128, kRecurrentWarps>, grid, block, 0, stream, conv_out, g, beta, n, d.c_dim(),
                     d.nk, d.nv, d.dv, state, o, rows, row_stride);
  }
  if (d.dk == 64) {
    return LaunchPdl(GdnRecurrentKernel<64, kRecurrentWarps>, grid, block, 0, stream, conv_out, g, beta, n, d.c_dim(),
                     d.nk, d.nv, d.dv, state, o, rows, row_stride);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchGdnRecurrent(const float* conv_out, const float* g, const float* beta, int64_t n,
                               const GdnShape& d, float* state, float* o, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (d.dv % 32 != 0 || d.nk <= 0 || d.nv % d.nk != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(d.nv), static_cast<unsigned>(d.dv / 32));
  return LaunchRecurrent(conv_out, g, beta, n, d, state, o, nullptr, 0, grid, stream);
}

cudaError_t LaunchGdnRecurrentDecode(const float* conv_out, const float* g, const float* beta, int64_t n,
                                     const GdnShape& d, float* state, int64_t row_stride, const int32_t* rows,
                                     float* o, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (d.dv % 32 != 0 || d.nk <= 0 || d.nv % d.nk != 0 || rows == nullptr || n > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(d.nv), static_cast<unsigned>(d.dv / 32), static_cast<unsigned>(n));
  return LaunchRecurrent(conv_out, g, beta, 1, d, state, o, rows, row_stride, grid, stream);
}

cudaError_t LaunchGdnGatedNormGeneral(const float* o, const float* z, const float* norm, float eps,
                                      int64_t n, const GdnShape& d, float* out, cudaStream_t stream, int64_t z_stride) {
  if (n <= 0) return cudaSuccess;
  const int64_t vw = static_cast<int64_t>(d.nv) * d.dv;
  if (z_stride == 0) z_stride = vw;
  if (z_stride < vw || d.nv <= 0) return cudaErrorInvalidValue;
  return LaunchPdl(GdnGatedNormKernel, static_cast<unsigned>(n * d.nv), 128, 0, stream, o, z, z_stride, d.nv, norm, eps,
                   d.dv, out);
}

}  // namespace tandem::cuda
