// dense_matvec_probe.h: the stamped instantiation of the streaming matvec (matvec_stream.cuh,
// kProbe = true) at one activation row for Q8_0x8 and F32, its probe state, and the benchmarks'
// producer kernel. Test and benchmark use only: the backend launches the stamped norm-in product only
// where a benchmark set ProbeDecodeStep.
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"

#include <type_traits>

#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec_norm_in.cuh"
#include "gpu_service/backends/cuda/matvec_stream.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
namespace {

// The streaming format of w when LaunchDenseMatVec (kAuto, n = 1) streams it and the probe has an
// instantiation for it: Q8_0x8 (which streams at n = 1 at every size) and F32.
template <class Fn>
cudaError_t WithStreamFormat(const DeviceMatrix& w, Fn&& fn) {
  if (fastmv::ForceGeneric()) return cudaErrorNotSupported;
  if (w.type == kTypeQ8_0x8) {
    if (!fastmv::StreamTakes<fastmv::FmtQ8_0x8>(w.data, w.cols, w.rows, w.row_bytes)) return cudaErrorNotSupported;
    return fn(fastmv::FmtQ8_0x8{});
  }
  if (w.type == kTypeF32) {
    if (!fastmv::StreamTakes<fastmv::FmtF32>(w.data, w.cols, w.rows, w.row_bytes)) return cudaErrorNotSupported;
    return fn(fastmv::FmtF32{});
  }
  return cudaErrorNotSupported;
}

// LaunchStreamDense's arguments at n = 1.
fastmv::StreamArgs OneRowArgs(const DeviceMatrix& w, const float* x, float* y) {
  fastmv::StreamArgs a;
  a.w = static_cast<const uint8_t*>(w.data);
  a.row_bytes = w.row_bytes;
  a.cols = static_cast<int>(w.cols);
  a.out_rows = static_cast<int>(w.rows);
  a.x = x;
  a.x_stride = w.cols;
  a.n = 1;
  a.y = y;
  a.y_stride = w.rows;
  return a;
}

__global__ void StreamProbeProducerKernel(const float* src, float* x, int count, unsigned spin_ns,
                                          unsigned long long* span) {
  __shared__ unsigned long long start;
  PdlWaitForPrevious();
  PdlAllowNext();  // the product's blocks may become resident (and issue their weights) from here
  if (threadIdx.x == 0) {
    start = GlobalTimerNs();
    while (GlobalTimerNs() - start < spin_ns) {
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < count;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    x[i] = src[i];
  }
  __syncthreads();
  if (threadIdx.x == 0 && span != nullptr) {
    span[2 * blockIdx.x] = start;
    span[2 * blockIdx.x + 1] = GlobalTimerNs();
  }
}

}  // namespace

cudaError_t SetStreamMatVecProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(fastmv::g_stream_probe_config, fastmv::g_stream_probe_count, stamps, capacity, stream);
}

cudaError_t StreamMatVecProbeGrid(const DeviceMatrix& w, StreamProbeGrid* grid) {
  return WithStreamFormat(w, [&](auto fmt) {
    using F = decltype(fmt);
    const fastmv::StreamArgs a = OneRowArgs(w, nullptr, nullptr);
    const fastmv::StreamSplit split = fastmv::StreamLaunchSplit<F, 1>(a, 1, fastmv::StreamTuning{});
    const int rpb = fastmv::kWarps / split.wpr * (32 / fastmv::LanesPerRow<F>(a.cols)) * fastmv::kStreamSlots<F, 1>;
    grid->blocks = split.blocks;
    grid->wpr = split.wpr;
    grid->groups = (a.out_rows + rpb - 1) / rpb;
    return cudaSuccess;
  });
}

cudaError_t LaunchDenseMatVecProbed(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream) {
  return WithStreamFormat(w, [&](auto fmt) {
    using F = decltype(fmt);
    return fastmv::LaunchStream<F, 1, true>(OneRowArgs(w, x, y), 1, fastmv::StreamTuning{}, stream);
  });
}

cudaError_t LaunchDenseMatVecNormInProbed(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream) {
  if (!NormInLaunchOk(w, in, y)) return cudaErrorInvalidValue;
  return fastmv::LaunchStreamNormIn<fastmv::FmtQ8_0x8, true>(NormInStreamArgs(w, in, y), stream);
}

cudaError_t LaunchStreamProbeProducer(const float* src, float* x, int count, int blocks, unsigned spin_ns,
                                      unsigned long long* span, cudaStream_t stream) {
  if (count < 0 || blocks < 1) return cudaErrorInvalidValue;
  return LaunchPdl(StreamProbeProducerKernel, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, src, x, count,
                   spin_ns, span);
}

}  // namespace tandem::cuda
