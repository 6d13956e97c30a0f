#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"

#include <atomic>
#include <cstdlib>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec_norm_in.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"
#include "gpu_service/backends/cuda/matvec_core.cuh"
#include "gpu_service/backends/cuda/matvec_q6k_head.cuh"
#include "gpu_service/backends/cuda/matvec_q6k_staged.cuh"
#include "gpu_service/backends/cuda/matvec_stream.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda {
static_assert(kMatVecHeadVariants == fastmv::kQ6HeadVariants, "dense_matvec.cuh names the head kernel's variants");
namespace {

constexpr int kWarpsPerBlock = 8;

// The generic kernel (F32, F16, BF16, and the quantized types when the fast kernel of
// matvec_core.cuh cannot take the shape): one warp per output row; lane l takes the row's 32-element chunks l, l+32, ... and dots each
// dequantized chunk with kRows activation rows (rows >= n are skipped). Two chunks are loaded per
// iteration so that each lane has two independent weight loads in flight.
template <uint32_t kType, int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
DenseMatVecKernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t chunks, const float* x,
                  int64_t x_stride, int n, float* y, int64_t y_stride) {
  PdlWaitForPrevious();  // pdl.cuh: nothing of the step is read or written before
  PdlAllowNext();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const uint8_t* row = w + r * row_bytes;
  float acc[kRows];
#pragma unroll
  for (int t = 0; t < kRows; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < chunks; c += 64) {
    float v0[32], v1[32];
    const bool second = c + 32 < chunks;
    DequantChunk<kType>(row, c, v0);
    if (second) DequantChunk<kType>(row, c + 32, v1);
#pragma unroll
    for (int t = 0; t < kRows; ++t) {
      if (t < n) {
        const float4* xa = reinterpret_cast<const float4*>(x + t * x_stride + c * 32);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 a = __ldg(xa + i);
          sum = fmaf(v0[4 * i], a.x, sum);
          sum = fmaf(v0[4 * i + 1], a.y, sum);
          sum = fmaf(v0[4 * i + 2], a.z, sum);
          sum = fmaf(v0[4 * i + 3], a.w, sum);
        }
        if (second) {
          const float4* xb = xa + 8 * 32;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float4 a = __ldg(xb + i);
            sum = fmaf(v1[4 * i], a.x, sum);
            sum = fmaf(v1[4 * i + 1], a.y, sum);
            sum = fmaf(v1[4 * i + 2], a.z, sum);
            sum = fmaf(v1[4 * i + 3], a.w, sum);
          }
        }
        acc[t] += sum;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    float s = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (lane == 0 && t < n) y[t * y_stride + r] = s;
  }
}

template <uint32_t kType, int kRows>
cudaError_t Launch(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y,
                   int64_t y_stride, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return LaunchPdl(DenseMatVecKernel<kType, kRows>, blocks, kWarpsPerBlock * 32, 0, stream,
      static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols / 32, x, x_stride, n, y,
      y_stride);
}

// Activation rows are rounded up to 1, 2, 4 or 8 (rows beyond n cost nothing but registers).
template <uint32_t kType>
cudaError_t LaunchType(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y,
                       int64_t y_stride, cudaStream_t stream) {
  if (n == 1) return Launch<kType, 1>(w, x, x_stride, n, y, y_stride, stream);
  if (n == 2) return Launch<kType, 2>(w, x, x_stride, n, y, y_stride, stream);
  if (n <= 4) return Launch<kType, 4>(w, x, x_stride, n, y, y_stride, stream);
  return Launch<kType, 8>(w, x, x_stride, n, y, y_stride, stream);
}

// Quantized types, the previous dispatch: matvec_core.cuh's fast kernel when the matrix has the
// natural row stride and one activation row fits its shared memory, else the generic kernel.
template <uint32_t kType>
cudaError_t LaunchQuant(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y, int64_t y_stride,
                        cudaStream_t stream) {
  using F = typename fastmv::FormatOf<kType>::Type;
  const int64_t natural = w.cols / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  if (w.row_bytes == natural && w.cols <= (1 << 20) && w.rows < (int64_t{1} << 31) &&
      fastmv::SharedBytesFor<F>(1, static_cast<int>(w.cols)) <= fastmv::kMaxFastShared) {
    return fastmv::LaunchFastDense<F>(static_cast<const uint8_t*>(w.data), static_cast<int>(w.cols),
                                      static_cast<int>(w.rows), x, x_stride, n, y, y_stride, stream);
  }
  return LaunchType<kType>(w, x, x_stride, n, y, y_stride, stream);
}

// Matrices of at least this many bytes stream for many waves; there the previous fast kernel
// measured 2-9 % faster than the streaming one for the quantized types (H200, 2026-11-29:
// 2048 x 151936 at 175-331 MB; tests/gpu/NOTES.md), the streaming one 1.1-2x faster at 0.6-18 MB.
constexpr int64_t kPreviousKernelMinBytes = int64_t{64} << 20;

// The streaming kernel when it takes the matrix, else the previous dispatch; large quantized
// matrices take the previous fast kernel when its activation bucket for n fits the streaming
// kernel's shared-memory cap (so that it keeps several blocks per SM).
template <uint32_t kType>
cudaError_t LaunchAuto(const DeviceMatrix& w, const float* x, int64_t x_stride, int n, float* y, int64_t y_stride,
                       const MatVecOptions& o, cudaStream_t stream) {
  using F = typename fastmv::StreamFormatOf<kType>::Type;
  if constexpr (kType == kTypeQ6_K) {
    // The staged kernel (16-byte copies of whole rows into shared memory): the LM head measured
    // faster there than on the previous kernel (tests/gpu/NOTES.md); smaller Q6_K matrices only
    // when asked for (kStaged).
    const bool large = w.row_bytes * w.rows >= kPreviousKernelMinBytes && o.warps_per_row == 0 &&
                       o.kernel == MatVecKernel::kAuto;
    // One activation row of 2048 columns (the batch-1 head): the head kernel, which sums in the
    // staged kernel's order (same bits) with the activations in registers.
    if ((large || o.kernel == MatVecKernel::kQ6Head) &&
        fastmv::Q6HeadTakes(w.data, w.cols, w.rows, w.row_bytes, n)) {
      return fastmv::LaunchQ6Head(static_cast<const uint8_t*>(w.data), w.row_bytes, static_cast<int>(w.rows), x, y,
                                  o.variant, o.blocks_per_sm, o.y_at, o.int16_x, stream);
    }
    const bool staged = large || o.kernel == MatVecKernel::kStaged || o.kernel == MatVecKernel::kQ6Head;
    if (staged && fastmv::Q6StagedTakes(w.data, w.cols, w.rows, w.row_bytes)) {
      return fastmv::LaunchQ6Staged(static_cast<const uint8_t*>(w.data), w.row_bytes, static_cast<int>(w.cols),
                                    static_cast<int>(w.rows), x, x_stride, n, y, y_stride, o.blocks_per_sm, stream);
    }
  }
  bool stream_kernel = fastmv::StreamTakes<F>(w.data, w.cols, w.rows, w.row_bytes);
  if constexpr (kType != kTypeF32) {
    const int64_t natural = w.cols / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
    const int bucket = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
    // Q8_0x8 streams at every size where that was measured faster (H200, 2026-12-01, 2048 x 151936:
    // n = 1 94.7 against 101.0 us, n = 8 291 against 326 us); n = 2..4 are not measured yet.
    const bool x8_streams = kType == kTypeQ8_0x8 && (n == 1 || n > 4);
    if (stream_kernel && !x8_streams && o.kernel != MatVecKernel::kStream && o.warps_per_row == 0 &&
        o.blocks_per_sm == 0 && w.row_bytes == natural && w.row_bytes * w.rows >= kPreviousKernelMinBytes &&
        fastmv::SharedBytesFor<F>(bucket, static_cast<int>(w.cols)) <= fastmv::kMaxStreamShared) {
      stream_kernel = false;
    }
  }
  if (stream_kernel) {
    const fastmv::StreamTuning tuning{o.warps_per_row, o.blocks_per_sm};
    return fastmv::LaunchStreamDense<F>(static_cast<const uint8_t*>(w.data), w.row_bytes, static_cast<int>(w.cols),
                                        static_cast<int>(w.rows), x, x_stride, n, y, y_stride, tuning, stream);
  }
  if constexpr (kType == kTypeF32) {
    return LaunchType<kType>(w, x, x_stride, n, y, y_stride, stream);
  } else {
    return LaunchQuant<kType>(w, x, x_stride, n, y, y_stride, stream);
  }
}

}  // namespace

cudaError_t LaunchDenseMatVec(const DeviceMatrix& w, const float* x, int64_t x_stride, int n,
                              float* y, int64_t y_stride, cudaStream_t stream) {
  return LaunchDenseMatVec(w, x, x_stride, n, y, y_stride, MatVecOptions{}, stream);
}

cudaError_t LaunchDenseMatVec(const DeviceMatrix& w, const float* x, int64_t x_stride, int n,
                              float* y, int64_t y_stride, const MatVecOptions& o, cudaStream_t stream) {
  if (n < 1 || n > kMatVecMaxRows || w.rows <= 0 || !DenseKernelsSupportType(w.type) ||
      w.cols % RowLengthMultiple(w.type) != 0 || x_stride % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  // Q8_0x8 is read with 16-byte loads by every kernel (its reason to exist): refuse a matrix
  // that is not 16-byte aligned rather than fault.
  if (w.type == kTypeQ8_0x8 &&
      (reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || w.row_bytes % 16 != 0 || w.row_bytes < Q8_0x8RowBytes(w.cols))) {
    return cudaErrorInvalidValue;
  }
  const int wpr = o.warps_per_row;
  if ((wpr != 0 && wpr != 1 && wpr != 2 && wpr != 4 && wpr != 8) || o.blocks_per_sm < 0 || o.variant < 0 ||
      o.variant >= fastmv::kQ6HeadVariants) {
    return cudaErrorInvalidValue;
  }
  if ((o.y_at != nullptr || o.int16_x) && (o.kernel != MatVecKernel::kQ6Head || !DenseMatVecQ6HeadTakes(w, n))) {
    return cudaErrorInvalidValue;
  }
  MatVecKernel kernel = o.kernel;
  if (kernel == MatVecKernel::kAuto && fastmv::ForceGeneric()) kernel = MatVecKernel::kGeneric;
  if (kernel == MatVecKernel::kAuto || kernel == MatVecKernel::kStream || kernel == MatVecKernel::kStaged ||
      kernel == MatVecKernel::kQ6Head) {
    // F16 and BF16 have no streaming format: the generic kernel below.
    using StreamedTypes = WeightTypes<kTypeF32, kTypeQ8_0, kTypeQ4_K, kTypeQ5_K, kTypeQ6_K, kTypeQ8_0x8>;
    if (StreamedTypes::Contains(w.type)) {
      return DispatchOnType(w.type, StreamedTypes{}, cudaErrorInvalidValue, [&](auto t) {
        return LaunchAuto<decltype(t)::value>(w, x, x_stride, n, y, y_stride, o, stream);
      });
    }
  }
  const bool previous = kernel != MatVecKernel::kGeneric;
  return DispatchOnType(w.type, DenseWeightTypes{}, cudaErrorInvalidValue, [&](auto t) {
    constexpr uint32_t kType = decltype(t)::value;
    // The quantized types have the previous fast kernel (matvec_core.cuh); the float types only
    // the generic one.
    if constexpr (kType == kTypeF32 || kType == kTypeF16 || kType == kTypeBF16) {
      return LaunchType<kType>(w, x, x_stride, n, y, y_stride, stream);
    } else {
      return previous ? LaunchQuant<kType>(w, x, x_stride, n, y, y_stride, stream)
                      : LaunchType<kType>(w, x, x_stride, n, y, y_stride, stream);
    }
  });
}

bool DenseMatVecQ6HeadTakes(const DeviceMatrix& w, int n) {
  return w.type == kTypeQ6_K && fastmv::Q6HeadTakes(w.data, w.cols, w.rows, w.row_bytes, n);
}

int DenseMatVecF32WarpsPerRow(const DeviceMatrix& w) {
  // LaunchDenseMatVec's kAuto route for F32: the streaming kernel where it takes w, else generic.
  if (w.type != kTypeF32 || w.rows <= 0 || w.cols % RowLengthMultiple(w.type) != 0 || fastmv::ForceGeneric() ||
      !fastmv::StreamTakes<fastmv::FmtF32>(w.data, w.cols, w.rows, w.row_bytes)) {
    return 0;
  }
  return fastmv::StreamOneRowWarpsPerRow<fastmv::FmtF32>(static_cast<int>(w.cols), static_cast<int>(w.rows));
}

namespace {
ProcessSwitch g_mixer_norm_launch{[] { return EnvSwitch("TANDEM_MIXER_NORM_LAUNCH"); }};
ProcessSwitch g_head_int16{[] { return EnvSwitchDefaultOn("TANDEM_HEAD_INT16"); }};
ProcessSwitch g_norm_in_lean{[] { return EnvSwitchDefaultOn("TANDEM_NORM_IN_LEAN"); }};
std::atomic<uint64_t> g_norm_in_lean_launches{0};
}  // namespace

bool MixerNormLaunch() { return g_mixer_norm_launch.on(); }
void SetMixerNormLaunch(bool on) { g_mixer_norm_launch.set(on); }

bool HeadInt16() { return g_head_int16.on(); }
void SetHeadInt16(bool on) { g_head_int16.set(on); }

bool DenseMatVecNormInTakes(const DeviceMatrix& w) {
  using F = fastmv::FmtQ8_0x8;
  if (w.type != kTypeQ8_0x8 || w.data == nullptr || fastmv::ForceGeneric() ||
      !fastmv::StreamTakes<F>(w.data, w.cols, w.rows, w.row_bytes) || w.row_bytes < Q8_0x8RowBytes(w.cols)) {
    return false;
  }
  return norm_row::RegSplitFor(w.cols / 4).vec > 0 &&
         fastmv::StreamNormInSharedBytes<F>(static_cast<int>(w.cols)) <= fastmv::kMaxStreamShared;
}

fastmv::StreamArgs NormInStreamArgs(const DeviceMatrix& w, const MatVecNormIn& in, float* y) {
  const norm_row::RegSplit split = norm_row::RegSplitFor(w.cols / 4);
  fastmv::StreamArgs a;
  a.w = static_cast<const uint8_t*>(w.data);
  a.row_bytes = w.row_bytes;
  a.cols = static_cast<int>(w.cols);
  a.out_rows = static_cast<int>(w.rows);
  a.n = 1;
  a.y = y;
  a.y_stride = w.rows;
  a.norm.H = in.H;
  a.norm.y = in.y;
  a.norm.shared = in.sh.shared;
  a.norm.gate_logit = in.sh.gate_logit;
  a.norm.gamma = in.gamma;
  a.norm.eps = in.eps;
  a.norm.vec = split.vec;
  a.norm.threads = split.threads;
  a.norm.h_early = in.h_written_earlier && !OldNormEarlyH();  // TANDEM_OLD_NORM_EARLY_H as the norm's
  if (in.polled.on) {
    a.polled = true;
    a.first_row = static_cast<int>(in.polled.first_row);
  }
  return a;
}

bool NormInLaunchOk(const DeviceMatrix& w, const MatVecNormIn& in, const float* y) {
  const RowsPolled& r = in.polled;
  const bool polled_ok = !r.on || (r.first_row >= 0 && r.first_row < w.rows);
  return DenseMatVecNormInTakes(w) && in.H != nullptr && in.gamma != nullptr && y != nullptr &&
         (in.sh.shared == nullptr || in.y != nullptr) && polled_ok;
}

cudaError_t LaunchDenseMatVecNormIn(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream) {
  if (!NormInLaunchOk(w, in, y)) return cudaErrorInvalidValue;
  if (NormInLean() && w.cols == kNormInLeanCols) {
    g_norm_in_lean_launches.fetch_add(1, std::memory_order_relaxed);
    return fastmv::LaunchStreamNormIn<fastmv::FmtQ8_0x8, false, kNormInLeanCols>(NormInStreamArgs(w, in, y), stream);
  }
  return fastmv::LaunchStreamNormIn<fastmv::FmtQ8_0x8>(NormInStreamArgs(w, in, y), stream);
}

bool NormInLean() { return g_norm_in_lean.on(); }
void SetNormInLean(bool on) { g_norm_in_lean.set(on); }
uint64_t NormInLeanLaunches() { return g_norm_in_lean_launches.load(std::memory_order_relaxed); }

}  // namespace tandem::cuda
