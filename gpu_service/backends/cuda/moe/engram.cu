#include "gpu_service/backends/cuda/moe/engram.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// Sum over the block, in f64, in the same order in every thread.
__device__ double BlockSum(double v, double* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }

// One block per (position, stream).
__global__ void __launch_bounds__(kThreads) EngramGateKernel(const float* kv, const float* v, const float* H,
                                                             const float* key_norm, const float* query_norm,
                                                             const float* conv_norm, int S, int h, float eps,
                                                             float* u, float* ubar) {
  __shared__ double scratch[kThreads / 32];
  const int t = blockIdx.x / S, s = blockIdx.x % S;
  const int64_t width = static_cast<int64_t>(S) * h;
  const int64_t off = t * width + static_cast<int64_t>(s) * h;
  const float* kvs = kv + off;
  const float* hs = H + off;
  const float* vt = v + static_cast<int64_t>(t) * h;
  double sk = 0.0, sq = 0.0;
  for (int j = threadIdx.x; j < h; j += kThreads) {
    sk += static_cast<double>(kvs[j]) * kvs[j];
    sq += static_cast<double>(hs[j]) * hs[j];
  }
  sk = BlockSum(sk, scratch);
  sq = BlockSum(sq, scratch);
  const float scale_k = static_cast<float>(1.0 / sqrt(sk / h + eps));
  const float scale_q = static_cast<float>(1.0 / sqrt(sq / h + eps));
  double dot = 0.0;
  for (int j = threadIdx.x; j < h; j += kThreads) {
    const float a = key_norm[s * h + j] * (kvs[j] * scale_k);
    const float b = query_norm[s * h + j] * (hs[j] * scale_q);
    dot += static_cast<double>(a) * b;
  }
  dot = BlockSum(dot, scratch);
  const double g = static_cast<double>(static_cast<float>(dot)) * (1.0 / sqrt(static_cast<double>(h)));
  const double root = copysign(sqrt(fmax(fabs(g), 1e-6)), g);
  const float alpha = SigmoidF(static_cast<float>(root));
  double su = 0.0;
  for (int j = threadIdx.x; j < h; j += kThreads) {
    const float uj = alpha * vt[j];
    u[off + j] = uj;
    su += static_cast<double>(uj) * uj;
  }
  su = BlockSum(su, scratch);
  const float scale_u = static_cast<float>(1.0 / sqrt(su / h + eps));
  for (int j = threadIdx.x; j < h; j += kThreads) {
    ubar[off + j] = conv_norm[s * h + j] * ((alpha * vt[j]) * scale_u);
  }
}

__global__ void EngramConvKernel(const float* window, const float* taps, const float* u, int n, int width, int ck,
                                 int dilation, float* H) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(n) * width) return;
  const int64_t t = i / width, c = i % width;
  const int64_t hist = static_cast<int64_t>(ck - 1) * dilation;
  double sum = 0.0;
  for (int q = 0; q < ck; ++q) {
    const int64_t row = hist + t - static_cast<int64_t>(ck - 1 - q) * dilation;
    sum += static_cast<double>(taps[c * ck + q]) * window[row * width + c];
  }
  const float conv = static_cast<float>(sum);
  H[i] += u[i] + conv * SigmoidF(conv);
}

}  // namespace

cudaError_t LaunchEngramGate(const float* kv, const float* v, const float* H, const float* key_norm,
                             const float* query_norm, const float* conv_norm, int n, int S, int h, float eps, float* u,
                             float* ubar, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (S <= 0 || h <= 0) return cudaErrorInvalidValue;
  EngramGateKernel<<<n * S, kThreads, 0, stream>>>(kv, v, H, key_norm, query_norm, conv_norm, S, h, eps, u, ubar);
  return cudaGetLastError();
}

cudaError_t LaunchEngramConvInject(const float* window, const float* taps, const float* u, int n, int width, int ck,
                                   int dilation, float* H, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * width;
  if (total <= 0) return cudaSuccess;
  if (ck < 1 || dilation < 1) return cudaErrorInvalidValue;
  EngramConvKernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      window, taps, u, n, width, ck, dilation, H);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
