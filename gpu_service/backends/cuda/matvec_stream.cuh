// The streaming decode matrix-vector kernel: y = W·x for 1..8 f32 activation rows, W in Q8_0,
// Q4_K, Q5_K, Q6_K (the ggml block layouts, decoded by the formats of matvec_core.cuh), Q8_0x8
// (Q8_0 regrouped on upload: 16-byte quant loads) or F32,
// any row stride the format's alignment allows; f32 products and f32 accumulation. Dense launches
// of kernels/dense_matvec.cu take it; matvec_core.cuh's FastMatVecKernel (the previous kernel)
// stays for the MoE launchers and as the benchmarks' "before". Only .cu files include this header.
//
// Why it is shaped this way (batch-1 decode of 1-18 MB matrices is latency-bound: a launch must
// keep several MB of loads in flight from its first cycle and never wait on anything else):
// - Each lane keeps kD pieces of each of its kS rows in flight (a ring of raw pieces): piece
//   p + kD·step is loaded before piece p is decoded, and a warp's first pieces go out before
//   the activations are staged, so the staging's L2 latency hides under the DRAM latency.
// - A block walks row groups g, g + gridDim.x, ... and loads the next group's first pieces
//   before it reduces and writes the current one: no DRAM round trip between groups.
// - The grid is one wave (resident blocks per SM from the kernel's registers and shared memory,
//   times the SM count) or fewer blocks; `wpr` warps split each row (partial sums meet in shared
//   memory, added in warp order: deterministic) when that shortens the busiest lane's chain of
//   memory latencies (ChooseStreamSplit's cost model, matvec_stream_plan.h), so a 2048-row
//   matrix still starts thousands of warps.
// - Activations sit in shared memory (matvec_core.cuh's swizzle), capped at kMaxStreamShared per
//   block so that three blocks fit on an SM: more activation rows than fit run as grid.y chunks
//   of the same resident grid, which read the same weight rows at about the same time (the
//   second read hits L2).
// - The norm-in form (kNormIn, one activation row; matvec_stream_norm_in.cuh) forms the block input
//   in shared memory from the residual row instead of reading it: the norm's launch saved.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"
#include "gpu_service/backends/cuda/matvec_core.cuh"
#include "gpu_service/backends/cuda/matvec_stream_norm_in.cuh"
#include "gpu_service/backends/cuda/matvec_stream_plan.h"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem::cuda::fastmv {

// F32: piece = 8 floats (two 16-byte loads); the "run" needs no scale.
struct FmtF32 {
  static constexpr int kPieceElems = 8, kRuns = 1, kRunLen = 8, kBias = 0;
  static constexpr bool kXSum = false;
  struct Raw {
    uint4 v0, v1;
  };
  __host__ __device__ static int64_t RowBytes(int cols) { return static_cast<int64_t>(cols) * 4; }
  __host__ __device__ static void Load(const uint8_t* row, int p, Raw& r) {
    r.v0 = Ld128(row + 32 * static_cast<int64_t>(p));
    r.v1 = Ld128(row + 32 * static_cast<int64_t>(p) + 16);
  }
  __host__ __device__ static int RunCol(int p, int) { return 8 * p; }
  __device__ static float4 Quad(const Raw& r, int i) {
    const uint4 v = i == 0 ? r.v0 : r.v1;
    return make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
  }
  __host__ __device__ static int Swz(int q) { return FmtQ8_0::Swz(q); }
};

template <class F>
inline constexpr bool kPlain = std::is_same_v<F, FmtF32>;

template <uint32_t kType>
struct StreamFormatOf {
  using Type = typename FormatOf<kType>::Type;
};
template <> struct StreamFormatOf<kTypeF32> { using Type = FmtF32; };

// Row slots (kS) and ring depth (kD) per format and activation-row bucket: kD·kS raw pieces live
// in registers next to kS·kN accumulators, within the budget of kStreamMinBlocks blocks per SM.
template <class F, int kN>
inline constexpr int kStreamSlots = (std::is_same_v<F, FmtQ8_0> || std::is_same_v<F, FmtQ8_0x8>) ? (kN <= 2 ? 4 : 2)
                                    : std::is_same_v<F, FmtQ6_K> ? (kN == 1 ? 4 : 2)
                                                                 : 2;  // Q4_K, Q5_K, F32: 32-48 byte pieces
// Q8_0x8 keeps 16-byte pieces: at kN = 1, 4 rows x 3 deep = 192 bytes in flight per lane, in the
// 128 registers of two blocks per SM (three blocks' 80 registers spilled).
template <class F, int kN>
inline constexpr int kStreamDepth = ((std::is_same_v<F, FmtQ4_K> || std::is_same_v<F, FmtQ8_0x8>) && kN == 1) ? 3 : 2;
template <class F, int kN>
inline constexpr int kStreamMinBlocks = (std::is_same_v<F, FmtQ8_0> && kN <= 2) ? 3 : 2;

// Shared memory cap per block (activation rows + Σx + the split-row partial sums): three blocks
// per SM of 228 KB.
inline constexpr size_t kMaxStreamShared = 72 * 1024;

template <class F, int kN>
__host__ __device__ inline size_t StreamSharedBytes(int cols) {
  const size_t x = static_cast<size_t>(kN) * cols * sizeof(float) * (F::kXSum ? 17 : 16) / 16;
  return x + static_cast<size_t>(kWarps) * (32 / LanesPerRow<F>(cols)) * kStreamSlots<F, kN> * kN * sizeof(float);
}

struct StreamArgs {
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0;
  int cols = 0, out_rows = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int n = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  int wpr = 1;
  StreamNormIn norm;  // read by the kNormIn kernel alone
  // The kNormIn kernel's polled rows (dense_matvec.cuh RowsPolled): the groups walked from the one
  // holding first_row, each row stored with a device-scope relaxed store.
  bool polled = false;
  int first_row = 0;
};

// The norm-in form's shared memory: its area (H, γ, y and the shared term, cols floats each) starts
// at StreamNormInOffset, after the kernel's own (StreamSharedBytes at one activation row).
template <class F>
__host__ __device__ inline size_t StreamNormInOffset(int cols) {
  return (StreamSharedBytes<F, 1>(cols) + 15) / 16 * 16;
}
template <class F>
inline size_t StreamNormInSharedBytes(int cols) {
  return StreamNormInOffset<F>(cols) + 4 * static_cast<size_t>(cols) * sizeof(float);
}

namespace {  // internal linkage, as in matvec_core.cuh

// acc[s][t] += the piece's part of row s · x_t (matvec_core.cuh's DotPiece plus plain F32).
template <class F, int kS, int kN>
__device__ __forceinline__ void StreamDotPiece(const typename F::Raw (&raw)[kS], int p, const float4* xs4, int quads,
                                               const float* xsum, int sums, float (&acc)[kS][kN]) {
#pragma unroll
  for (int run = 0; run < F::kRuns; ++run) {
    const int col = F::RunCol(p, run);
    float part[kS][kN];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int t = 0; t < kN; ++t) part[s][t] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < F::kRunLen / 4; ++i) {
      float4 xv[kN];
      const int slot = F::Swz(col / 4 + i);
#pragma unroll
      for (int t = 0; t < kN; ++t) xv[t] = xs4[t * quads + slot];
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        float4 q;
        if constexpr (kPlain<F>) {
          q = F::Quad(raw[s], i);
        } else {
          q = BytesToFloat4<F::kBias>(F::Word(raw[s], p, run, i));
        }
#pragma unroll
        for (int t = 0; t < kN; ++t) {
          part[s][t] = FmaQuad(q, xv[t], part[s][t]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      if constexpr (kPlain<F>) {
#pragma unroll
        for (int t = 0; t < kN; ++t) acc[s][t] += part[s][t];
      } else {
        float scale, offset;
        F::RunScale(raw[s], p, run, scale, offset);
#pragma unroll
        for (int t = 0; t < kN; ++t) {
          acc[s][t] = fmaf(scale, part[s][t], acc[s][t]);
          if constexpr (F::kXSum) acc[s][t] = fmaf(-offset, xsum[t * sums + col / 16], acc[s][t]);
        }
      }
    }
  }
}

// Loads ring[j] = pieces p0 + j·step (those < pieces) of the kS rows.
template <class F, int kS, int kD>
__device__ __forceinline__ void IssueRing(const uint8_t* const* rows, int pieces, int p0, int step,
                                          typename F::Raw (&ring)[kD][kS]) {
#pragma unroll
  for (int j = 0; j < kD; ++j) {
    if (p0 + j * step < pieces) LoadPieces<F, kS>(rows, p0 + j * step, ring[j]);
  }
}

// acc += Σ over pieces p0, p0 + step, ... < pieces of rows · x, ring holding the first kD pieces
// on entry; each slot of the ring is refilled with the piece kD steps ahead before its piece is
// decoded.
template <class F, int kS, int kN, int kD>
__device__ __forceinline__ void StreamRows(const uint8_t* const* rows, int pieces, int p0, int step,
                                           typename F::Raw (&ring)[kD][kS], const float4* xs4, int quads,
                                           const float* xsum, int sums, float (&acc)[kS][kN]) {
  for (int base = p0; base < pieces; base += kD * step) {
#pragma unroll
    for (int j = 0; j < kD; ++j) {
      const int p = base + j * step;
      if (p < pieces) {
        typename F::Raw cur[kS];
#pragma unroll
        for (int s = 0; s < kS; ++s) cur[s] = ring[j][s];
        if (p + kD * step < pieces) LoadPieces<F, kS>(rows, p + kD * step, ring[j]);
        StreamDotPiece<F, kS, kN>(cur, p, xs4, quads, xsum, sums, acc);
      }
    }
  }
}

// dense_matvec_probe.h's state and stamps: read only by the kProbe instantiation (set by
// SetStreamMatVecProbe in kernels/dense_matvec_probe.cu, the one file that launches it). The
// buffer and capacity sit in constant memory: read at a block's exit, they hit the SM's constant
// cache (a global load there cost the block a round trip before it could complete).
__constant__ ArmedStampRows g_stream_probe_config;
__device__ unsigned g_stream_probe_count;

// Thread 0 keeps the block's stamps in shared memory and takes its slot with an atomic issued at
// entry whose answer is first needed at exit, when it copies them out: the probe adds no global
// round trip to the block's path (an atomic answered before the first weight loads held warp 0's
// loads back by its latency).
template <bool kProbe>
struct StreamProbe {
  unsigned slot = 0;
  __device__ static unsigned long long* Shared() {
    __shared__ unsigned long long stamps[kStreamProbeStamps];
    return stamps;
  }
  __device__ StreamProbe() {
    if constexpr (kProbe) {
      if (threadIdx.x == 0) {
        Shared()[kStreamProbeEntry] = GlobalTimerNs();
        slot = atomicAdd(&g_stream_probe_count, 1u);
      }
    }
  }
  __device__ void Stamp(int phase) const {
    if constexpr (kProbe) {
      if (threadIdx.x == 0) Shared()[phase] = GlobalTimerNs();
    }
  }
  // The exit stamp, then the block's row of stamps, SM id and block index (slots past the
  // capacity, or no buffer: nothing).
  __device__ void Finish() const {
    if constexpr (kProbe) {
      if (threadIdx.x == 0) {
        const unsigned long long* s = Shared();
        const unsigned long long exit = GlobalTimerNs();
        unsigned long long* stamps = g_stream_probe_config.stamps;
        if (stamps != nullptr && slot < g_stream_probe_config.capacity) {
          unsigned long long* row = stamps + static_cast<unsigned long long>(slot) * kStreamProbeWords;
          for (int p = 0; p < kStreamProbeExit; ++p) row[p] = s[p];
          row[kStreamProbeExit] = exit;
          const unsigned smid = SmId();
          row[kStreamProbeSm] = smid;
          row[kStreamProbeBlock] = blockIdx.x + blockIdx.y * gridDim.x;
        }
      }
    }
  }
};

// The norm-in form's polled rows (StreamArgs::polled): a row's value by one device-scope relaxed
// store (no fence: a reader polls the value itself).
__device__ __forceinline__ void StoreRowRelaxed(float* p, float v) {
  asm volatile("st.relaxed.gpu.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

// kProbe: the stamped instantiation of dense_matvec_probe.h (every probe line sits under
// `if constexpr`: the production instantiations compile as without it).
// kNormIn: the norm-in form (StreamNormIn; one activation row).
// kCols (the norm-in form only; 0: a.cols): a.cols compiled in as a constant, so that the loops
// over the row's pieces and the norm's quads have fixed counts (dense_matvec.cuh NormInLean).
template <class F, int kN, bool kProbe = false, bool kNormIn = false, int kCols = 0>
__global__ void __launch_bounds__(kThreads, (kStreamMinBlocks<F, kN>)) StreamMatVecKernel(const StreamArgs a) {
  static_assert(!kNormIn || kN == 1, "the norm-in form forms one activation row");
  static_assert(kCols == 0 || kNormIn, "a constant width only for the norm-in form");
  [[maybe_unused]] const StreamProbe<kProbe> probe;  // thread 0: the entry stamp, its slot
  extern __shared__ float4 smem4[];
  constexpr int kS = kStreamSlots<F, kN>;
  constexpr int kD = kStreamDepth<F, kN>;
  const int cols = kCols > 0 ? kCols : a.cols, quads = cols / 4, sums = cols / 16;
  const int pieces = cols / F::kPieceElems;
  const int lpr = LanesPerRow<F>(cols), subs = 32 / lpr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / lpr, sl = lane & (lpr - 1);
  const int wpr = a.wpr, team = warp / wpr, member = warp - team * wpr;
  const int rows_per_block = kWarps / wpr * subs * kS;
  const int groups = (a.out_rows + rows_per_block - 1) / rows_per_block;
  const int p0 = member * lpr + sl, step = lpr * wpr;
  float4* xs4 = smem4;
  float* xsum = reinterpret_cast<float*>(smem4 + kN * quads);
  float* red = xsum + (F::kXSum ? kN * sums : 0);
  const int t0 = static_cast<int>(blockIdx.y) * kN;
  const int rows_used = min(kN, a.n - t0);

  // With polled rows the walk starts at the group holding first_row (the kernel after reads the
  // rows past it first); the groups' rows and sums are the same either way.
  int shift = 0;
  if constexpr (kNormIn) shift = a.polled ? a.first_row / rows_per_block : 0;
  const uint8_t* rows[kS];
  auto row_ptrs = [&](int g) {
    const int row0 = (g + shift < groups ? g + shift : g + shift - groups) * rows_per_block + (team * subs + sub) * kS;
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int64_t row = min(row0 + s, a.out_rows - 1);  // clamped: loads stay inside the matrix
      rows[s] = a.w + row * a.row_bytes;
    }
    return row0;
  };

  // The first group's first pieces go out before the activations are staged.
  int g = blockIdx.x;
  typename F::Raw ring[kD][kS];
  int row0 = row_ptrs(g < groups ? g : 0);
  if (g < groups) IssueRing<F, kS, kD>(rows, pieces, p0, step, ring);
  if constexpr (kProbe) probe.Stamp(kStreamProbeRingIssued);
  // The norm-in form's area after the kernel's own shared memory (StreamNormInOffset).
  [[maybe_unused]] float4* norm_area = smem4 + StreamNormInOffset<F>(cols) / sizeof(float4);
  if constexpr (kNormIn) NormInEarlyCopies(a.norm, cols, norm_area);
  // Weights only so far: the activations are the previous kernel's output (pdl.cuh).
  PdlWaitForPrevious();
  if constexpr (kProbe) probe.Stamp(kStreamProbeAfterWait);
  PdlAllowNext();

  // Activations (rows >= rows_used read as zeros), swizzled, then Σx per 16 columns.
  if constexpr (kNormIn) {
    NormInStage<F>(a.norm, cols, norm_area, xs4);
  } else {
    for (int idx = threadIdx.x; idx < kN * quads; idx += kThreads) {
      const int t = idx / quads, q = idx - t * quads;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < rows_used) {
        v = __ldg(reinterpret_cast<const float4*>(a.x + static_cast<int64_t>(t0 + t) * a.x_stride) + q);
      }
      xs4[t * quads + F::Swz(q)] = v;
    }
  }
  if constexpr (F::kXSum) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kN * sums; idx += kThreads) {
      const int t = idx / sums, gi = idx - t * sums;
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = xs4[t * quads + F::Swz(4 * gi + k)];
        s += (v.x + v.y) + (v.z + v.w);
      }
      xsum[t * sums + gi] = s;
    }
  }
  __syncthreads();
  if constexpr (kProbe) probe.Stamp(kStreamProbeStaged);

  float* out = a.y + static_cast<int64_t>(t0) * a.y_stride;
  while (g < groups) {
    float acc[kS][kN];
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int t = 0; t < kN; ++t) acc[s][t] = 0.0f;
    }
    StreamRows<F, kS, kN, kD>(rows, pieces, p0, step, ring, xs4, quads, xsum, sums, acc);
    if constexpr (kProbe) {
      if (g == static_cast<int>(blockIdx.x)) probe.Stamp(kStreamProbeFirstGroup);
      if (g + static_cast<int>(gridDim.x) >= groups) probe.Stamp(kStreamProbeLastGroup);
    }
    // The next group's loads go out before this group's reduction.
    const int done_row0 = row0;
    g += gridDim.x;
    if (g < groups) {
      row0 = row_ptrs(g);
      IssueRing<F, kS, kD>(rows, pieces, p0, step, ring);
    }
#pragma unroll
    for (int s = 0; s < kS; ++s) {
#pragma unroll
      for (int t = 0; t < kN; ++t) {
        for (int off = lpr / 2; off > 0; off >>= 1) acc[s][t] += __shfl_xor_sync(0xFFFFFFFFu, acc[s][t], off);
      }
    }
    if (wpr > 1) {  // the team's warps add their partial sums in member order (deterministic)
      if (sl == 0) {
#pragma unroll
        for (int s = 0; s < kS; ++s) {
#pragma unroll
          for (int t = 0; t < kN; ++t) red[((warp * subs + sub) * kS + s) * kN + t] = acc[s][t];
        }
      }
      __syncthreads();
      if (member == 0 && sl == 0) {
        for (int m = 1; m < wpr; ++m) {
#pragma unroll
          for (int s = 0; s < kS; ++s) {
#pragma unroll
            for (int t = 0; t < kN; ++t) acc[s][t] += red[(((warp + m) * subs + sub) * kS + s) * kN + t];
          }
        }
      }
      __syncthreads();
    }
    if constexpr (kProbe) {
      if (g >= groups) probe.Stamp(kStreamProbeLastWrite);
    }
    if (member == 0 && sl == 0) {
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const int row = done_row0 + s;
        if (row >= a.out_rows) break;
#pragma unroll
        for (int t = 0; t < kN; ++t) {
          if (t >= rows_used) break;
          if constexpr (kNormIn) {
            if (a.polled) {
              StoreRowRelaxed(out + t * a.y_stride + row, acc[s][t]);
              continue;
            }
          }
          out[t * a.y_stride + row] = acc[s][t];
        }
      }
    }
  }
  if constexpr (kProbe) probe.Finish();
}

}  // namespace

// Shared memory per SM of the current device (queried once).
inline int DeviceSmemPerSm() {
  static const int bytes = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
      return 228 * 1024;
    }
    return v;
  }();
  return bytes;
}

// The split and grid LaunchStream gives a launch of a.cols × a.out_rows with grid_y activation-row
// chunks (a one-wave grid from the kernel's registers and shared memory). Separate from the launch
// so that a caller can ask which split a shape gets (StreamOneRowWarpsPerRow).
template <class F, int kN>
StreamSplit StreamLaunchSplit(const StreamArgs& a, unsigned grid_y, const StreamTuning& tuning) {
  static const int regs = [] {
    cudaFuncAttributes fa{};
    return cudaFuncGetAttributes(&fa, StreamMatVecKernel<F, kN>) == cudaSuccess ? fa.numRegs : 64;
  }();
  const size_t smem = StreamSharedBytes<F, kN>(a.cols);
  const int sms = DeviceSmCount();
  const int per_sm = ResidentBlocks(regs, smem, DeviceSmemPerSm());
  // grid.y chunks share one wave.
  const int gy = static_cast<int>(grid_y);
  int capacity = (sms * per_sm + gy - 1) / gy;
  const int lpr = LanesPerRow<F>(a.cols);
  const int rpb1 = kWarps * (32 / lpr) * kStreamSlots<F, kN>;
  const int forced_blocks = tuning.blocks_per_sm > 0 ? (sms * tuning.blocks_per_sm + gy - 1) / gy : 0;
  constexpr bool kQ8x8One = std::is_same_v<F, FmtQ8_0x8> && kN == 1;  // ChooseStreamSplit's `sms`
  return ChooseStreamSplit(a.cols / F::kPieceElems, lpr, kStreamDepth<F, kN> + (kQ8x8One ? 1 : 0), rpb1, a.out_rows,
                           capacity, tuning.warps_per_row, forced_blocks, kQ8x8One ? sms : 0);
}

// kProbe: dense_matvec_probe.h's stamped kernel, with the split and grid of the production one.
template <class F, int kN, bool kProbe = false>
cudaError_t LaunchStream(StreamArgs a, unsigned grid_y, const StreamTuning& tuning, cudaStream_t stream) {
  auto kernel = StreamMatVecKernel<F, kN, kProbe>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxStreamShared));
  if (attr != cudaSuccess) return attr;
  const size_t smem = StreamSharedBytes<F, kN>(a.cols);
  const StreamSplit split = StreamLaunchSplit<F, kN>(a, grid_y, tuning);
  a.wpr = split.wpr;
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(split.blocks), grid_y), kThreads, smem, stream, a);
}

// The norm-in form (kNormIn) of a one-activation-row launch (kProbe: its stamped instantiation,
// dense_matvec_probe.h), with the split and grid of the plain
// launch (its rows' sums in the same order: the same bits as the plain product over x formed by
// the norm kernel). The caller checks that the plain kernel takes the matrix (StreamTakes), the
// norm's split (StreamNormIn::vec, threads) and StreamNormInSharedBytes <= kMaxStreamShared, and
// a.cols == kCols where kCols is not 0 (the kernel's constant width).
template <class F, bool kProbe = false, int kCols = 0>
cudaError_t LaunchStreamNormIn(StreamArgs a, cudaStream_t stream) {
  auto kernel = StreamMatVecKernel<F, 1, kProbe, true, kCols>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxStreamShared));
  if (attr != cudaSuccess) return attr;
  const size_t smem = StreamNormInSharedBytes<F>(a.cols);
  const StreamSplit split = StreamLaunchSplit<F, 1>(a, 1, StreamTuning{});
  a.wpr = split.wpr;
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(split.blocks), 1), kThreads, smem, stream, a);
}

template <class F>
inline size_t StreamSharedBytesFor(int n_bucket, int cols) {
  return ForRowBucket(n_bucket, [cols](auto rows) { return StreamSharedBytes<F, rows.value>(cols); });
}

// True when the streaming kernel takes this matrix: the format's row alignment holds for the
// data pointer and the row stride, rows are at least the natural length, and one activation row
// fits kMaxStreamShared.
template <class F>
inline bool StreamTakes(const void* w, int64_t cols, int64_t rows, int64_t row_bytes) {
  const int64_t align = (std::is_same_v<F, FmtQ8_0> || std::is_same_v<F, FmtQ6_K>) ? 2 : 16;
  if (cols <= 0 || cols > (1 << 20) || rows <= 0 || rows >= (int64_t{1} << 31)) return false;
  if (cols % (4 * F::kPieceElems) != 0) return false;  // whole swizzle groups (Q8_0/F32: 32 columns)
  if (std::is_same_v<F, FmtQ8_0x8> && cols % 256 != 0) return false;  // whole super-blocks
  if (reinterpret_cast<uintptr_t>(w) % align != 0 || row_bytes % align != 0) return false;
  if (row_bytes < F::RowBytes(static_cast<int>(cols))) return false;
  return StreamSharedBytesFor<F>(1, static_cast<int>(cols)) <= kMaxStreamShared;
}

// Dense y = W·x through the streaming kernel (StreamTakes must hold): the activation-row bucket
// is the smallest of 1, 2, 4, 8 holding n whose shared memory fits kMaxStreamShared; more rows
// run as grid.y chunks.
template <class F>
cudaError_t LaunchStreamDense(const uint8_t* w, int64_t row_bytes, int cols, int rows, const float* x,
                              int64_t x_stride, int n, float* y, int64_t y_stride, const StreamTuning& tuning,
                              cudaStream_t stream) {
  const int bucket = RowBucket(n, kMaxStreamShared, [cols](int b) { return StreamSharedBytesFor<F>(b, cols); });
  StreamArgs a;
  a.w = w;
  a.row_bytes = row_bytes;
  a.cols = cols;
  a.out_rows = rows;
  a.x = x;
  a.x_stride = x_stride;
  a.n = n;
  a.y = y;
  a.y_stride = y_stride;
  const unsigned gy = static_cast<unsigned>((n + bucket - 1) / bucket);
  return ForRowBucket(bucket, [&](auto rows) { return LaunchStream<F, rows.value>(a, gy, tuning, stream); });
}

// The warps per row LaunchStreamDense with no overrides gives a one-activation-row product of a
// cols × rows matrix (StreamTakes must hold). The split depends on the row count (ChooseStreamSplit),
// and a row's sum order on the split: a taller view forced to this split sums the first rows as the
// shorter matrix's own launch does.
template <class F>
int StreamOneRowWarpsPerRow(int cols, int rows) {
  StreamArgs a;
  a.cols = cols;
  a.out_rows = rows;
  a.n = 1;
  return StreamLaunchSplit<F, 1>(a, 1, StreamTuning{}).wpr;
}

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_CUH_
