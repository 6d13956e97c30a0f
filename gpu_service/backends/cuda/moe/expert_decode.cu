// The routed-expert decode kernels of expert_decode.cuh: Q4_K units go to the tile kernel of
// expert_decode_q4k.cu (unless ExpertKernelChoice::kDecodePieces, or rows longer than it takes);
// every other type, and those, to the per-piece kernel below.
//
// Work split. A row of `cols` inputs is P = cols / 32 pieces of 32 elements. L lanes share a row
// (L: the largest power of two up to 32 dividing P, halved while a lane would own fewer than
// kDefaultMinPieces pieces), so a warp covers G = 32 / L rows per step and each lane K = P / L
// pieces of its row, loaded kSlots at a time: all raw loads of those pieces (gate and up in the
// fused kernel) are issued before the first decode, which keeps several 16-byte loads per lane in
// flight. A block is kWarps warps; blockIdx.y is the unit, blockIdx.x a tile of warps × steps ×
// G rows. h 2048: 16 lanes per row, 2 rows per step; I 512 (down): 4 lanes per row, 8 rows.
//
// Activation rows are read with __ldg (L1-cached: every warp of a unit reads the same rows) and
// only for r < u.rows, so a 1-row unit costs one row of work whatever the launch's max_rows.
// The kernel template is bucketed by max_rows (1, 2, 4, 8) only to size the accumulators.
#include "gpu_service/backends/cuda/moe/expert_decode.cuh"

#include <atomic>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_q4k.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kThreads = kWarps * 32;

std::atomic<int> g_choice{static_cast<int>(ExpertKernelChoice::kDecode)};
std::atomic<int> g_steps_per_warp{0};
std::atomic<int> g_min_pieces{0};
std::atomic<int> g_tile_warps{0};

__device__ __forceinline__ float Silu(float g) { return g * (1.0f / (1.0f + expf(-g))); }

// One 32-element piece of a row: Load issues the piece's global loads into registers, Decode turns
// them into w[0..31]; w[0..15] multiply x[XLo(p) ..] and w[16..31] multiply x[XLo(p) + kHiOffset ..].
// Generic form: the piece is dequant.cuh's chunk p (elements 32p .. 32p + 31), decoded (and loaded)
// by DequantChunk; the loads of an unrolled group of pieces are still independent, so the compiler
// may issue them together.
template <uint32_t kType>
struct Piece {
  struct Raw {
    const uint8_t* row;
  };
  static constexpr int kHiOffset = 16;
  __device__ static __forceinline__ Raw Load(const uint8_t* row, int /*p*/) { return {row}; }
  __device__ static __forceinline__ void Decode(const Raw& raw, int p, float (&w)[32]) {
    DequantChunk<kType>(raw.row, p, w);
  }
  __device__ static __forceinline__ int XLo(int p) { return 32 * p; }
};

// Q4_K (144-byte super-blocks: f16 d, f16 dmin, 12 scale bytes, 128 qs bytes). Piece p is the 16
// qs bytes at 16 + 16·(p % 8) of super-block p / 8: in group g = (p % 8) / 2 of 32 bytes, half
// k = p % 2. Their low nibbles are elements 64g + 16k + i (sub-block 2g), their high nibbles
// elements 64g + 32 + 16k + i (sub-block 2g + 1). Two 16-byte loads (qs and the block head).
template <>
struct Piece<kTypeQ4_K> {
  struct Raw {
    uint4 q;
    uint4 head;
  };
  static constexpr int kHiOffset = 32;
  __device__ static __forceinline__ Raw Load(const uint8_t* row, int p) {
    const uint8_t* blk = row + (p >> 3) * 144;
    Raw r;
    r.q = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 16 * (p & 7)));
    r.head = __ldg(reinterpret_cast<const uint4*>(blk));
    return r;
  }
  // Exact float of a byte b (< 256) of `word`: 2^23 + b built by a byte permute, minus 2^23.
  __device__ static __forceinline__ float ByteToFloat(uint32_t word, int b) {
    return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540 + b)) - 8388608.0f;
  }
  // Scale and min of sub-block j (ggml get_scale_min_k4) from the head words s0 = scales[0..3],
  // s1 = scales[4..7], s2 = scales[8..11], with shifts instead of byte indexing (no local memory).
  __device__ static __forceinline__ void ScaleMin(int j, uint32_t s0, uint32_t s1, uint32_t s2, uint32_t* sc,
                                                  uint32_t* m) {
    const int sh = 8 * (j & 3);
    if (j < 4) {
      *sc = (s0 >> sh) & 63;
      *m = (s1 >> sh) & 63;
    } else {
      *sc = ((s2 >> sh) & 0xF) | (((s0 >> sh) >> 6 & 3) << 4);
      *m = ((s2 >> sh) >> 4 & 0xF) | (((s1 >> sh) >> 6 & 3) << 4);
    }
  }
  __device__ static __forceinline__ void Decode(const Raw& r, int p, float (&w)[32]) {
    const int g = (p & 7) >> 1;
    uint32_t sc0, m0, sc1, m1;
    ScaleMin(2 * g, r.head.y, r.head.z, r.head.w, &sc0, &m0);
    ScaleMin(2 * g + 1, r.head.y, r.head.z, r.head.w, &sc1, &m1);
    const float d = HalfBits(static_cast<uint16_t>(r.head.x & 0xFFFF));
    const float dmin = HalfBits(static_cast<uint16_t>(r.head.x >> 16));
    const float f0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
    const float f1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
    const uint32_t words[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = words[i] & 0x0F0F0F0Fu;
      const uint32_t hi = (words[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        w[4 * i + b] = f0 * ByteToFloat(lo, b) - o0;
        w[16 + 4 * i + b] = f1 * ByteToFloat(hi, b) - o1;
      }
    }
  }
  __device__ static __forceinline__ int XLo(int p) { return 256 * (p >> 3) + 64 * ((p & 7) >> 1) + 16 * (p & 1); }
};

// acc += w[0..15]·x[lo ..] + w[16..31]·x[lo + kHi ..].
template <int kHi>
__device__ __forceinline__ float Dot32(const float (&w)[32], const float* x, int lo, float acc) {
  const float4* a = reinterpret_cast<const float4*>(x + lo);
  const float4* b = reinterpret_cast<const float4*>(x + lo + kHi);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = __ldg(a + i);
    acc = fmaf(w[4 * i], v.x, acc);
    acc = fmaf(w[4 * i + 1], v.y, acc);
    acc = fmaf(w[4 * i + 2], v.z, acc);
    acc = fmaf(w[4 * i + 3], v.w, acc);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = __ldg(b + i);
    acc = fmaf(w[16 + 4 * i], v.x, acc);
    acc = fmaf(w[16 + 4 * i + 1], v.y, acc);
    acc = fmaf(w[16 + 4 * i + 2], v.z, acc);
    acc = fmaf(w[16 + 4 * i + 3], v.w, acc);
  }
  return acc;
}

// a += wa·x, b += wb·x over the same 32 activations (Dot32's element order).
template <int kHi>
__device__ __forceinline__ void Dot32x2(const float (&wa)[32], const float (&wb)[32], const float* x, int lo,
                                        float& a, float& b) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float4* src = reinterpret_cast<const float4*>(x + lo + half * kHi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 v = __ldg(src + i);
      const int e = 16 * half + 4 * i;
      a = fmaf(wa[e], v.x, a);
      b = fmaf(wb[e], v.x, b);
      a = fmaf(wa[e + 1], v.y, a);
      b = fmaf(wb[e + 1], v.y, b);
      a = fmaf(wa[e + 2], v.z, a);
      b = fmaf(wb[e + 2], v.z, b);
      a = fmaf(wa[e + 3], v.w, a);
      b = fmaf(wb[e + 3], v.w, b);
    }
  }
}

// Pieces per lane loaded at once: the fused kernel loads two matrices per piece.
template <bool kFused>
constexpr int SlotsFor() {
  return kFused ? 2 : 4;
}

template <uint32_t kType, int kR, bool kFused>
__global__ void __launch_bounds__(kThreads) ExpertDecodeKernel(const ExpertUnit* units, int cols, int out_rows,
                                                               int lanes_log2, int steps_per_warp, const float* in,
                                                               float* out, const int* device_num_units) {
  using P = Piece<kType>;
  constexpr int kSlots = SlotsFor<kFused>();
  // The unit list and its count are the previous kernel's output (pdl.cuh's rule).
  PdlWaitForPrevious();
  PdlAllowNext();
  // The unit record is read before the count (both loads in flight at once): units holds
  // num_units records, so the read stays inside it even for a unit that then returns.
  const ExpertUnit* u = units + blockIdx.y;
  const int rows_raw = __ldg(&u->rows);
  const int first = __ldg(&u->first_slot);
  const uint8_t* w0 = static_cast<const uint8_t*>(kFused ? u->gate : u->down);
  const uint8_t* w1 = kFused ? static_cast<const uint8_t*>(u->up) : nullptr;
  if (device_num_units != nullptr && static_cast<int>(blockIdx.y) >= __ldg(device_num_units)) return;
  const int rows = min(rows_raw, kR);
  const float* xr[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int src = r < rows ? (kFused ? __ldg(&u->input_row[r]) : first + r) : 0;
    xr[r] = in + static_cast<int64_t>(src) * cols;
  }
  const int64_t row_bytes = static_cast<int64_t>(cols) / BlockGeometry<kType>::kElems * BlockGeometry<kType>::kBytes;
  const int pieces = cols / 32;
  const int L = 1 << lanes_log2;
  const int K = pieces >> lanes_log2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = lane >> lanes_log2, gl = lane & (L - 1);
  const int G = 32 >> lanes_log2;
  float* out_base = out + static_cast<int64_t>(first) * out_rows;
  const int step0 = (blockIdx.x * kWarps + warp) * steps_per_warp;
  for (int step = step0; step < step0 + steps_per_warp; ++step) {
    const int row = step * G + group;
    if (step * G >= out_rows) break;  // the whole warp is past the last row
    const bool valid = row < out_rows;
    float acc0[kR], acc1[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) acc0[r] = acc1[r] = 0.0f;
    if (valid) {
      const uint8_t* r0 = w0 + row * row_bytes;
      const uint8_t* r1 = kFused ? w1 + row * row_bytes : nullptr;
      for (int k0 = 0; k0 < K; k0 += kSlots) {
        typename P::Raw ra[kSlots], rb[kSlots];
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          if (k0 + j < K) {
            const int p = gl + L * (k0 + j);
            ra[j] = P::Load(r0, p);
            if (kFused) rb[j] = P::Load(r1, p);
          }
        }
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          if (k0 + j < K) {
            const int p = gl + L * (k0 + j);
            const int lo = P::XLo(p);
            if constexpr (kFused && kR == 1) {
              // Gate and up of the same piece multiply the same activations: one read of x.
              float wa[32], wb[32];
              P::Decode(ra[j], p, wa);
              P::Decode(rb[j], p, wb);
#pragma unroll
              for (int r = 0; r < kR; ++r) {
                if (r < rows) Dot32x2<P::kHiOffset>(wa, wb, xr[r], lo, acc0[r], acc1[r]);
              }
            } else {
              // One decoded piece at a time (several activation rows: fewer registers live).
              float w[32];
              P::Decode(ra[j], p, w);
#pragma unroll
              for (int r = 0; r < kR; ++r) {
                if (r < rows) acc0[r] = Dot32<P::kHiOffset>(w, xr[r], lo, acc0[r]);
              }
              if (kFused) {
                P::Decode(rb[j], p, w);
#pragma unroll
                for (int r = 0; r < kR; ++r) {
                  if (r < rows) acc1[r] = Dot32<P::kHiOffset>(w, xr[r], lo, acc1[r]);
                }
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r < rows) {  // rows is uniform over the warp
        for (int off = L >> 1; off > 0; off >>= 1) {
          acc0[r] += __shfl_xor_sync(0xFFFFFFFFu, acc0[r], off);
          if (kFused) acc1[r] += __shfl_xor_sync(0xFFFFFFFFu, acc1[r], off);
        }
      }
    }
    if (gl == 0 && valid) {
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r < rows) out_base[static_cast<int64_t>(r) * out_rows + row] = kFused ? Silu(acc0[r]) * acc1[r] : acc0[r];
      }
    }
  }
}

// log2 of the lanes per row for P pieces (see the file comment).
int LanesLog2(int pieces, int slots) {
  int lg = 0;
  while (lg < 5 && pieces % (2 << lg) == 0) ++lg;
  while (lg > 0 && (pieces >> lg) < slots) --lg;
  return lg;
}

// Steps per warp: 1 while the launch fits about one wave (~32 resident warps per SM on 132 SMs),
// else 2. Measured on the H200 (PERF_NOTES.md, 2026-11-29 sweep): 1 is best at 1 token, 2 at 8 and
// 32 tokens; 4 and 8 were slower everywhere.
int StepsPerWarp(int num_units, int out_rows, int rows_per_step) {
  if (const int forced = g_steps_per_warp.load(std::memory_order_relaxed); forced > 0) return forced;
  constexpr int64_t kOneWaveWarps = 132 * 32;
  const int64_t steps = static_cast<int64_t>(num_units) * ((out_rows + rows_per_step - 1) / rows_per_step);
  return steps <= kOneWaveWarps ? 1 : 2;
}

// Pieces per lane at least (the lane count per row follows): 4 measured faster than 2 for the
// fused kernel at h 2048 (16 lanes per row, 2 rows per warp step: the two row groups share their
// activation reads).
constexpr int kDefaultMinPieces = 4;

template <uint32_t kType, int kR, bool kFused>
cudaError_t LaunchBucket(const ExpertUnit* units, int num_units, int cols, int out_rows, const float* in, float* out,
                         cudaStream_t stream, const int* device_num_units) {
  const int forced_pieces = g_min_pieces.load(std::memory_order_relaxed);
  const int lg = LanesLog2(cols / 32, forced_pieces > 0 ? forced_pieces : kDefaultMinPieces);
  const int G = 32 >> lg;
  const int spw = StepsPerWarp(num_units, out_rows, G);
  const int rows_per_block = kWarps * spw * G;
  const unsigned gx = static_cast<unsigned>((out_rows + rows_per_block - 1) / rows_per_block);
  return LaunchPdl(ExpertDecodeKernel<kType, kR, kFused>, dim3(gx, static_cast<unsigned>(num_units)), dim3(kThreads),
                   0, stream, units, cols, out_rows, lg, spw, in, out, device_num_units);
}

template <uint32_t kType, bool kFused>
cudaError_t LaunchTyped(const ExpertUnit* units, int num_units, int max_rows, int cols, int out_rows, const float* in,
                        float* out, cudaStream_t stream, const int* device_num_units) {
  if (max_rows <= 1) return LaunchBucket<kType, 1, kFused>(units, num_units, cols, out_rows, in, out, stream, device_num_units);
  if (max_rows <= 2) return LaunchBucket<kType, 2, kFused>(units, num_units, cols, out_rows, in, out, stream, device_num_units);
  if (max_rows <= 4) return LaunchBucket<kType, 4, kFused>(units, num_units, cols, out_rows, in, out, stream, device_num_units);
  return LaunchBucket<kType, kMaxUnitRows, kFused>(units, num_units, cols, out_rows, in, out, stream, device_num_units);
}

template <bool kFused>
cudaError_t Launch(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int cols, int out_rows,
                   const float* in, float* out, cudaStream_t stream, const int* device_num_units) {
  if (num_units <= 0) return cudaSuccess;
  if (max_rows < 1 || max_rows > kMaxUnitRows || out_rows < 1 || cols < 1 || !MoeKernelsSupportType(type) ||
      cols % RowLengthMultiple(type) != 0) {
    return cudaErrorInvalidValue;
  }
  if (type == kTypeQ4_K && GetExpertKernelChoice() != ExpertKernelChoice::kDecodePieces && Q4KTilesFit(cols)) {
    return LaunchQ4KTiles(kFused, units, num_units, max_rows, cols, out_rows, in, out, stream, device_num_units,
                          g_steps_per_warp.load(std::memory_order_relaxed), g_tile_warps.load(std::memory_order_relaxed));
  }
  return DispatchOnType(type, MoeWeightTypes{}, cudaErrorInvalidValue, [&](auto t) {
    return LaunchTyped<decltype(t)::value, kFused>(units, num_units, max_rows, cols, out_rows, in, out, stream,
                                                   device_num_units);
  });
}

}  // namespace

cudaError_t LaunchExpertDecodeGateUp(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int h,
                                     int inner, const float* x, float* act, cudaStream_t stream,
                                     const int* device_num_units) {
  return Launch<true>(type, units, num_units, max_rows, h, inner, x, act, stream, device_num_units);
}

cudaError_t LaunchExpertDecodeDown(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int inner,
                                   int h, const float* act, float* partial, cudaStream_t stream,
                                   const int* device_num_units) {
  return Launch<false>(type, units, num_units, max_rows, inner, h, act, partial, stream, device_num_units);
}

void SetExpertDecodeTileWarps(int warps) { g_tile_warps.store(warps == 2 || warps == 4 || warps == 8 ? warps : 0); }

void SetExpertKernelChoice(ExpertKernelChoice choice) { g_choice.store(static_cast<int>(choice)); }

ExpertKernelChoice GetExpertKernelChoice() { return static_cast<ExpertKernelChoice>(g_choice.load()); }

bool ExpertDecodeRoutesType(uint32_t type) { return type == kTypeQ4_K; }

void SetExpertDecodeStepsPerWarp(int steps) { g_steps_per_warp.store(steps < 0 ? 0 : steps); }

void SetExpertDecodeMinPiecesPerLane(int pieces) { g_min_pieces.store(pieces < 0 ? 0 : pieces); }

}  // namespace tandem::cuda
