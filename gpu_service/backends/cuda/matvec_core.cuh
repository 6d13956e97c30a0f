// The fast decode matrix-vector core: y = W·x for 1..8 f32 activation rows, W in Q8_0, Q4_K,
// Q5_K or Q6_K read in its ggml block layout, or in Q8_0x8 (Q8_0 regrouped on upload,
// device_matrix.h), f32 products and f32 accumulation.
// Dense launches of moe/matvec.cu (LaunchFastDense) run it; kernels/dense_matvec.cu runs it for
// quantized matrices of >= 64 MB and as MatVecKernel::kPrevious, and otherwise the streaming
// kernel of matvec_stream.cuh (which reuses the formats of matvec_formats.cuh). Its expert
// unit modes (Args::units, kFused) are correct (tests/gpu_moe ran them) but measured slower than
// the generic expert kernel on the decode shapes, so moe/matvec_impl.cuh does not dispatch them
// yet (moe/PERF_NOTES.md says why and what to change). Only .cu files include this header.
//
// Why it is shaped this way (decode is bound by weight bytes; see tests/gpu/NOTES.md):
// - A row is cut into "pieces" (8, 16 or 32 elements, per format) that a lane decodes from a few
//   loads of its own; consecutive lanes take consecutive pieces, so every load instruction of a
//   warp touches one contiguous stretch of the row (coalesced), whatever the block size.
// - A warp walks kS weight rows at once: every piece issues kS rows' loads before decoding, and
//   the activations it reads from shared memory serve all kS rows (the activation traffic,
//   not the weights, bounded the generic kernels). Q8_0 and Q6_K also load the next pieces
//   before decoding the current ones; every block issues its first pieces before staging x.
// - Small matrices: `wpr` warps split each row (partial sums meet in shared memory), so that
//   the grid still has a few blocks per SM.
// - The weight formats (pieces, the quant-to-float trick, the activation swizzle, 2-byte-aligned
//   blocks) are in matvec_formats.cuh.
// Results differ from DequantizeRow-then-dot only by f32 rounding (sums regrouped per run).
// DotRows also compiles for the host, so that a host program can check it without a GPU.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_CORE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_CORE_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/matvec_formats.cuh"
#include "gpu_service/backends/cuda/matvec_stream_plan.h"
#include "gpu_service/backends/cuda/moe/expert_unit.h"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::fastmv {

// Weight-row slots per warp sub-group for kN activation rows (registers: kS·kN accumulators and
// kS pieces of raw bytes; Q5_K's 48-byte pieces allow two).
template <class F, int kN>
inline constexpr int kSlots = kN == 1 ? F::kMaxSlots : (kN == 2 && F::kMaxSlots >= 4 && !F::kXSum) ? 4 : 2;

// Lanes per row: 32, or fewer for rows of fewer than 32 pieces (the warp then takes 32 / lpr
// row groups side by side).
template <class F>
__host__ __device__ inline int LanesPerRow(int cols) {
  const int pieces = cols / F::kPieceElems;
  int lpr = 32;
  while (lpr > pieces) lpr >>= 1;
  return lpr;
}

// Blocks per SM the register budget is sized for (__launch_bounds__): small raw pieces (Q8_0,
// Q6_K) and one or two activation rows leave room for more resident warps, which is what keeps
// enough bytes in flight.
template <class F, int kN>
inline constexpr int kMinBlocks = kN <= 2 ? F::kMinBlocks : 2;

// Shared memory of one block: kN activation rows, Σx per 16 columns for Q4_K/Q5_K, and the
// cross-warp partial sums of a split row (kWarps · 32/lpr · kS · kN floats).
template <class F, int kN>
inline size_t SharedBytes(int cols) {
  const size_t x = static_cast<size_t>(kN) * cols * sizeof(float) * (F::kXSum ? 17 : 16) / 16;
  return x + static_cast<size_t>(kWarps) * (32 / LanesPerRow<F>(cols)) * kSlots<F, kN> * kN * sizeof(float);
}

// Output rows one block covers per step of its row loop when `wpr` warps split each row.
template <class F, int kN, bool kFused>
__host__ __device__ inline int RowsPerBlock(int cols, int wpr) {
  return kWarps / wpr * (32 / LanesPerRow<F>(cols)) * (kFused ? kSlots<F, kN> / 2 : kSlots<F, kN>);
}

// What a launch computes. Dense (units == nullptr): y[t] = W·x[t] for t < n, x row t at
// x + t·x_stride, y row t at y + t·y_stride; blockIdx.y picks activation rows kN·y.. .
// Units: blockIdx.y is the unit; kFused: out[first + r] = SiLU(gate·x[input_row[r]]) ⊙
// up·x[input_row[r]], else out[first + r] = down·in[first + r] (rows of cols floats).
// wpr (1, 2, 4 or 8): warps that split each row's pieces (small matrices: more blocks, fewer
// pieces per lane); their partial sums meet in shared memory.
struct Args {
  const uint8_t* w = nullptr;
  const ExpertUnit* units = nullptr;
  const int* device_num_units = nullptr;
  int cols = 0, out_rows = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int n = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  int wpr = 1;
};

namespace {  // internal linkage: both CUDA libraries instantiate these kernels

template <class F, int kS>
__host__ __device__ __forceinline__ void LoadPieces(const uint8_t* const* rows, int p, typename F::Raw (&raw)[kS]) {
TANDEM_MV_UNROLL
  for (int s = 0; s < kS; ++s) F::Load(rows[s], p, raw[s]);
}

// acc[s][t] += the piece's part of row s · x_t.
template <class F, int kS, int kN>
__host__ __device__ __forceinline__ void DotPiece(const typename F::Raw (&raw)[kS], int p, const float4* xs4,
                                                  int quads, const float* xsum, int sums, float (&acc)[kS][kN]) {
TANDEM_MV_UNROLL
  for (int run = 0; run < F::kRuns; ++run) {
    const int col = F::RunCol(p, run);
    float part[kS][kN];
TANDEM_MV_UNROLL
    for (int s = 0; s < kS; ++s) {
TANDEM_MV_UNROLL
      for (int t = 0; t < kN; ++t) part[s][t] = 0.0f;
    }
TANDEM_MV_UNROLL
    for (int i = 0; i < F::kRunLen / 4; ++i) {
      float4 xv[kN];
      const int slot = F::Swz(col / 4 + i);
TANDEM_MV_UNROLL
      for (int t = 0; t < kN; ++t) xv[t] = xs4[t * quads + slot];
TANDEM_MV_UNROLL
      for (int s = 0; s < kS; ++s) {
        const float4 q = BytesToFloat4<F::kBias>(F::Word(raw[s], p, run, i));
TANDEM_MV_UNROLL
        for (int t = 0; t < kN; ++t) {
          part[s][t] = FmaQuad(q, xv[t], part[s][t]);
        }
      }
    }
TANDEM_MV_UNROLL
    for (int s = 0; s < kS; ++s) {
      float scale, offset;
      F::RunScale(raw[s], p, run, scale, offset);
TANDEM_MV_UNROLL
      for (int t = 0; t < kN; ++t) {
        acc[s][t] = fmaf(scale, part[s][t], acc[s][t]);
        if constexpr (F::kXSum) acc[s][t] = fmaf(-offset, xsum[t * sums + col / 16], acc[s][t]);
      }
    }
  }
}

// acc[s][t] += Σ over pieces p0, p0 + step, ... < pieces of rows[s] · x_t. `first` holds the
// pieces of p0 already loaded (the caller issues them early). kPrefetch formats load the next
// pieces before decoding the current ones.
template <class F, int kS, int kN>
__host__ __device__ __forceinline__ void DotRows(const uint8_t* const* rows, int pieces, int p0, int step,
                                                 const typename F::Raw (&first)[kS], const float4* xs4, int quads,
                                                 const float* xsum, int sums, float (&acc)[kS][kN]) {
  if (p0 >= pieces) return;
  if constexpr (F::kPrefetch) {
    typename F::Raw cur[kS];
TANDEM_MV_UNROLL
    for (int s = 0; s < kS; ++s) cur[s] = first[s];
    for (int p = p0; p < pieces; p += step) {
      typename F::Raw next[kS];
      if (p + step < pieces) LoadPieces<F, kS>(rows, p + step, next);
      DotPiece<F, kS, kN>(cur, p, xs4, quads, xsum, sums, acc);
TANDEM_MV_UNROLL
      for (int s = 0; s < kS; ++s) cur[s] = next[s];
    }
  } else {
    DotPiece<F, kS, kN>(first, p0, xs4, quads, xsum, sums, acc);
    for (int p = p0 + step; p < pieces; p += step) {
      typename F::Raw raw[kS];
      LoadPieces<F, kS>(rows, p, raw);
      DotPiece<F, kS, kN>(raw, p, xs4, quads, xsum, sums, acc);
    }
  }
}

template <class F, int kN, bool kFused>
__global__ void __launch_bounds__(kThreads, (kMinBlocks<F, kN>)) FastMatVecKernel(const Args a) {
  extern __shared__ float4 smem4[];
  // Units (and their count) are written by the step's planner: wait before reading them (pdl.cuh).
  if (a.units != nullptr) PdlWaitForPrevious();
  if (a.units != nullptr && a.device_num_units != nullptr && static_cast<int>(blockIdx.y) >= __ldg(a.device_num_units)) {
    return;
  }
  constexpr int kS = kSlots<F, kN>;
  constexpr int kRows = kFused ? kS / 2 : kS;
  const int cols = a.cols, quads = cols / 4, sums = cols / 16;
  const int pieces = cols / F::kPieceElems;
  const int lpr = LanesPerRow<F>(cols), subs = 32 / lpr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / lpr, sl = lane & (lpr - 1);
  const int wpr = a.wpr, team = warp / wpr, member = warp - team * wpr;
  const int rows_per_block = kWarps / wpr * subs * kRows;
  const int groups = (a.out_rows + rows_per_block - 1) / rows_per_block;
  const int p0 = member * lpr + sl, step = lpr * wpr;
  const int64_t row_bytes = F::RowBytes(cols);
  float4* xs4 = smem4;
  float* xsum = reinterpret_cast<float*>(smem4 + kN * quads);
  float* red = xsum + (F::kXSum ? kN * sums : 0);

  const uint8_t* w0;
  const uint8_t* w1 = nullptr;
  int rows_used;
  float* out;
  int64_t out_stride;
  const ExpertUnit* u = a.units != nullptr ? a.units + blockIdx.y : nullptr;
  if (u == nullptr) {
    const int t0 = blockIdx.y * kN;
    rows_used = min(kN, a.n - t0);
    w0 = a.w;
    out = a.y + t0 * a.y_stride;
    out_stride = a.y_stride;
  } else {
    rows_used = min(kN, u->rows);
    w0 = static_cast<const uint8_t*>(kFused ? u->gate : u->down);
    if (kFused) w1 = static_cast<const uint8_t*>(u->up);
    out = a.y + static_cast<int64_t>(u->first_slot) * a.out_rows;
    out_stride = a.out_rows;
  }
  auto row_ptrs = [&](int g, const uint8_t* (&rows)[kS]) {
    const int row0 = g * rows_per_block + (team * subs + sub) * kRows;
TANDEM_MV_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = min(row0 + r, a.out_rows - 1);  // clamped: loads stay inside the matrix
      rows[r] = w0 + row * row_bytes;
      if constexpr (kFused) rows[kRows + r] = w1 + row * row_bytes;
    }
    return row0;
  };

  // The first group's first pieces go out before the activations are staged (their latencies
  // overlap).
  int g = blockIdx.x;
  const uint8_t* rows[kS];
  typename F::Raw first[kS];
  int row0 = row_ptrs(g < groups ? g : 0, rows);
  if (g < groups && row0 < a.out_rows && p0 < pieces) LoadPieces<F, kS>(rows, p0, first);
  // Dense: weights only so far; the activations are the previous kernel's output (pdl.cuh).
  PdlWaitForPrevious();
  PdlAllowNext();

  // Activations (rows >= rows_used read as zeros), swizzled, then Σx per 16 columns.
  for (int idx = threadIdx.x; idx < kN * quads; idx += kThreads) {
    const int t = idx / quads, q = idx - t * quads;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < rows_used) {
      const float* src;
      if (u == nullptr) {
        src = a.x + (static_cast<int64_t>(blockIdx.y) * kN + t) * a.x_stride;
      } else if (kFused) {
        src = a.x + static_cast<int64_t>(u->input_row[t]) * cols;
      } else {
        src = a.x + static_cast<int64_t>(u->first_slot + t) * cols;
      }
      v = __ldg(reinterpret_cast<const float4*>(src) + q);
    }
    xs4[t * quads + F::Swz(q)] = v;
  }
  if constexpr (F::kXSum) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kN * sums; idx += kThreads) {
      const int t = idx / sums, gi = idx - t * sums;
      float s = 0.0f;
TANDEM_MV_UNROLL
      for (int k = 0; k < 4; ++k) {
        const float4 v = xs4[t * quads + F::Swz(4 * gi + k)];
        s += (v.x + v.y) + (v.z + v.w);
      }
      xsum[t * sums + gi] = s;
    }
  }
  __syncthreads();

  for (; g < groups; g += gridDim.x) {
    if (g != static_cast<int>(blockIdx.x)) {
      row0 = row_ptrs(g, rows);
      if (row0 < a.out_rows && p0 < pieces) LoadPieces<F, kS>(rows, p0, first);
    }
    float acc[kS][kN];
TANDEM_MV_UNROLL
    for (int s = 0; s < kS; ++s) {
TANDEM_MV_UNROLL
      for (int t = 0; t < kN; ++t) acc[s][t] = 0.0f;
    }
    if (row0 < a.out_rows) DotRows<F, kS, kN>(rows, pieces, p0, step, first, xs4, quads, xsum, sums, acc);
TANDEM_MV_UNROLL
    for (int s = 0; s < kS; ++s) {
TANDEM_MV_UNROLL
      for (int t = 0; t < kN; ++t) {
        for (int off = lpr / 2; off > 0; off >>= 1) acc[s][t] += __shfl_xor_sync(0xFFFFFFFFu, acc[s][t], off);
      }
    }
    if (wpr > 1) {  // the team's warps add their partial sums in member order (deterministic)
      if (sl == 0) {
TANDEM_MV_UNROLL
        for (int s = 0; s < kS; ++s) {
TANDEM_MV_UNROLL
          for (int t = 0; t < kN; ++t) red[((warp * subs + sub) * kS + s) * kN + t] = acc[s][t];
        }
      }
      __syncthreads();
      if (member == 0 && sl == 0) {
        for (int m = 1; m < wpr; ++m) {
TANDEM_MV_UNROLL
          for (int s = 0; s < kS; ++s) {
TANDEM_MV_UNROLL
            for (int t = 0; t < kN; ++t) acc[s][t] += red[(((warp + m) * subs + sub) * kS + s) * kN + t];
          }
        }
      }
      __syncthreads();
    }
    if (member == 0 && sl == 0) {
TANDEM_MV_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = row0 + r;
        if (row >= a.out_rows) break;
TANDEM_MV_UNROLL
        for (int t = 0; t < kN; ++t) {
          if (t >= rows_used) break;
          float v = acc[r][t];
          if constexpr (kFused) v = v * (1.0f / (1.0f + expf(-v))) * acc[kRows + r][t];
          out[t * out_stride + row] = v;
        }
      }
    }
  }
}

}  // namespace

// Warps per row for a launch of `blocks_per_wpr1` blocks (at wpr 1): split rows until the grid
// has about four blocks per SM, as long as every warp keeps at least one piece per lane.
template <class F>
inline int ChooseWarpsPerRow(int cols, int64_t blocks_at_wpr1, int sms) {
  const int pieces = cols / F::kPieceElems, lpr = LanesPerRow<F>(cols);
  int wpr = 1;
  while (wpr < kWarps && blocks_at_wpr1 * wpr < 4ll * sms && pieces >= lpr * wpr * 2) wpr *= 2;
  return wpr;
}

// Launches the fast kernel for kN activation rows per block: grid.x blocks walk the row groups
// (grid_x_cap > 0 bounds them), grid.y = dense activation-row chunks or units.
template <class F, int kN, bool kFused>
cudaError_t LaunchFast(Args a, unsigned grid_y, int grid_x_cap, int sms, cudaStream_t stream) {
  auto kernel = FastMatVecKernel<F, kN, kFused>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  if (attr != cudaSuccess) return attr;
  const int64_t groups1 = (a.out_rows + RowsPerBlock<F, kN, kFused>(a.cols, 1) - 1) / RowsPerBlock<F, kN, kFused>(a.cols, 1);
  a.wpr = ChooseWarpsPerRow<F>(a.cols, groups1 * grid_y, sms);
  const int rpb = RowsPerBlock<F, kN, kFused>(a.cols, a.wpr);
  const int groups = (a.out_rows + rpb - 1) / rpb;
  const unsigned gx = static_cast<unsigned>(grid_x_cap > 0 && groups > grid_x_cap ? grid_x_cap : groups);
  return LaunchPdl(kernel, dim3(gx, grid_y), kThreads, SharedBytes<F, kN>(a.cols), stream, a);
}

// True when the environment switch TANDEM_MATVEC_GENERIC is on (env_switch.h): every launcher then takes its
// generic kernel (an A/B switch for the benchmarks; read once per process).
inline bool ForceGeneric() {
  static const bool force = EnvSwitch("TANDEM_MATVEC_GENERIC");
  return force;
}

// Streaming multiprocessors of the current device (queried once).
inline int DeviceSmCount() {
  static const int count = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 132;
    }
    return sms;
  }();
  return count;
}

inline constexpr size_t kMaxFastShared = 160 * 1024;

// Shared memory of a launch with activation-row bucket n_bucket (1, 2, 4, 8).
template <class F>
inline size_t SharedBytesFor(int n_bucket, int cols) {
  return ForRowBucket(n_bucket, [cols](auto rows) { return SharedBytes<F, rows.value>(cols); });
}

// Dense y = W·x through the fast kernel: the activation-row bucket is the smallest of 1, 2, 4, 8
// holding n whose shared memory fits; more rows than a bucket run as grid.y chunks.
// cudaErrorInvalidValue when even one row does not fit.
template <class F>
cudaError_t LaunchFastDense(const uint8_t* w, int cols, int rows, const float* x, int64_t x_stride, int n, float* y,
                            int64_t y_stride, cudaStream_t stream) {
  const int bucket = RowBucket(n, kMaxFastShared, [cols](int b) { return SharedBytesFor<F>(b, cols); });
  if (SharedBytesFor<F>(bucket, cols) > kMaxFastShared) return cudaErrorInvalidValue;
  Args a;
  a.w = w;
  a.cols = cols;
  a.out_rows = rows;
  a.x = x;
  a.x_stride = x_stride;
  a.n = n;
  a.y = y;
  a.y_stride = y_stride;
  const unsigned gy = static_cast<unsigned>((n + bucket - 1) / bucket);
  const int sms = DeviceSmCount();
  // Large matrices: a few waves of blocks that each walk many row groups (one activation load).
  const int cap = sms * 8 / static_cast<int>(gy > 8 ? 8 : gy);
  return ForRowBucket(bucket, [&](auto rows) { return LaunchFast<F, rows.value, false>(a, gy, cap, sms, stream); });
}

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_CORE_CUH_
