// The weight-format decoders of the decode matrix-vector kernels (matvec_core.cuh's fast kernel
// and matvec_stream.cuh's streaming kernel): how a lane loads one "piece" of a weight row (8, 16
// or 32 elements, per format) and turns its quants into floats, for Q8_0, Q4_K, Q5_K, Q6_K in the
// ggml block layouts and Q8_0x8 (Q8_0 regrouped on upload, device_matrix.h).
//
// - Quants become floats without the slow int->float conversion: byte u is placed in the low
//   mantissa bits of 2^23 (one byte-permute) and 2^23 + bias is subtracted (exact for u < 2^23).
//   A run of 4..16 elements sharing one scale is summed as Σ q·x first, then scaled; Q4_K/Q5_K
//   subtract dmin·m·Σx with Σx per 16 activations precomputed in shared memory.
// - The activations sit in shared memory with a per-format XOR swizzle of their 16-byte groups
//   (Swz), so that the lanes of a quarter-warp read distinct banks.
// - Q8_0 and Q6_K blocks are only 2-byte aligned: their pieces are read as aligned 4-byte words
//   and funnel-shifted. A word may then reach up to 2 bytes past the piece (never past a 4-byte
//   aligned word holding a byte of the matrix, so it cannot fault).
// The decoders also compile for the host, so that a host program can check them against
// DequantizeRow without a GPU. Only .cu files include this header (through matvec_core.cuh).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_FORMATS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_FORMATS_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gpu_service/backends/cuda/dequant.cuh"

namespace tandem::cuda::fastmv {

// Device loads through the read-only path; the host versions (plain loads and portable bit
// operations) let a host program check the format decoding against the CPU reference.
#define TANDEM_MV_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define TANDEM_MV_UNROLL _Pragma("unroll")
#else
#define TANDEM_MV_UNROLL
#endif

TANDEM_MV_HD uint32_t Ld32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const uint32_t*>(p));
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}
TANDEM_MV_HD uint32_t Ld16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const uint16_t*>(p));
#else
  return *reinterpret_cast<const uint16_t*>(p);
#endif
}
TANDEM_MV_HD uint4 Ld128(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const uint4*>(p));
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}
TANDEM_MV_HD uint32_t FunnelShiftR(uint32_t lo, uint32_t hi, uint32_t shift) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, shift);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (shift & 31));
#endif
}
// 2^23 + byte b of w, as a float (exact).
TANDEM_MV_HD float MagicByte(uint32_t w, int b) {
#ifdef __CUDA_ARCH__
  return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7540 + b));
#else
  const uint32_t bits = 0x4B000000u | ((w >> (8 * b)) & 0xFF);
  float f;
  memcpy(&f, &bits, 4);
  return f;
#endif
}
TANDEM_MV_HD float F16Bits(uint32_t bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))); }

// The 4 bytes at p (2-byte aligned) from aligned words; the second word only when p is not
// 4-aligned (a predicated load, no branch).
TANDEM_MV_HD uint32_t Ld32At2(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t s = static_cast<uint32_t>(a & 2);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(a - s);
  const uint32_t lo = Ld32(q);
  const uint32_t hi = s ? Ld32(q + 4) : 0u;
  return FunnelShiftR(lo, hi, s * 8);
}

// The 8 bytes at p (2-byte aligned) as two words.
TANDEM_MV_HD void Ld64At2(const uint8_t* p, uint32_t& w0, uint32_t& w1) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t s = static_cast<uint32_t>(a & 2);
  const uint8_t* q = reinterpret_cast<const uint8_t*>(a - s);
  const uint32_t lo = Ld32(q), mid = Ld32(q + 4);
  const uint32_t hi = s ? Ld32(q + 8) : 0u;
  w0 = FunnelShiftR(lo, mid, s * 8);
  w1 = FunnelShiftR(mid, hi, s * 8);
}

// The four unsigned bytes of w as floats minus bias (exact).
template <int kBias>
TANDEM_MV_HD float4 BytesToFloat4(uint32_t w) {
  constexpr float kMagic = 8388608.0f + kBias;
  return make_float4(MagicByte(w, 0) - kMagic, MagicByte(w, 1) - kMagic, MagicByte(w, 2) - kMagic,
                     MagicByte(w, 3) - kMagic);
}

// Activation rows one matvec launch carries per grid.y chunk: the smallest of 1, 2, 4 and 8 that
// holds n, halved while shared_bytes(bucket) exceeds `limit` (the core, streaming and staged Q6_K
// launchers share the rule; more rows run as further chunks).
template <class SharedBytes>
inline int RowBucket(int n, size_t limit, SharedBytes shared_bytes) {
  int bucket = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
  while (bucket > 1 && shared_bytes(bucket) > limit) bucket /= 2;
  return bucket;
}

// launch(std::integral_constant<int, B>{}) for the row bucket B (1, 2, 4 or 8) RowBucket chose: the
// one switch from a run-time bucket to the kernels' compile-time row count (a launch's error, or
// what a bucket's shared memory takes).
template <class Launch>
inline auto ForRowBucket(int bucket, Launch&& launch) {
  switch (bucket) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    default: return launch(std::integral_constant<int, 8>{});
  }
}

// a + q·x over a quad's four lanes, summed x, y, z, w: the inner product step every matvec kernel
// (matvec_core, matvec_stream, matvec_q6k_staged) takes, so all sum in the same order.
TANDEM_MV_HD float FmaQuad(float4 q, float4 x, float a) {
  a = fmaf(q.x, x.x, a);
  a = fmaf(q.y, x.y, a);
  a = fmaf(q.z, x.z, a);
  return fmaf(q.w, x.w, a);
}

// Each format: a piece of kPieceElems elements is kRuns runs of kRunLen consecutive columns
// starting at RunCol(p, run); Word(raw, p, run, i) holds the run's elements 4i..4i+3 as unsigned
// bytes (value + kBias); RunScale gives the run's scale and (kXSum) the offset multiplying Σx.
// Swz maps an activation float4 index to its slot in shared memory (a bijection on aligned
// groups of 8, 16 or 64 float4s that keeps a quarter-warp's reads in distinct banks).

// Q8_0: piece = 8 quants (a quarter block); 4 lanes per 34-byte block.
struct FmtQ8_0 {
  static constexpr int kMaxSlots = 4, kMinBlocks = 3;
  static constexpr bool kPrefetch = true;
  static constexpr int kPieceElems = 8, kRuns = 1, kRunLen = 8, kBias = 128;
  static constexpr bool kXSum = false;
  struct Raw {
    uint32_t q0, q1, d;
  };
  __host__ __device__ static int64_t RowBytes(int cols) { return static_cast<int64_t>(cols) / 32 * 34; }
  __host__ __device__ static void Load(const uint8_t* row, int p, Raw& r) {
    const uint8_t* blk = row + static_cast<int64_t>(p >> 2) * 34;
    Ld64At2(blk + 2 + 8 * (p & 3), r.q0, r.q1);
    r.d = Ld16(blk);
  }
  __host__ __device__ static int RunCol(int p, int) { return 8 * p; }
  __host__ __device__ static uint32_t Word(const Raw& r, int, int, int i) { return (i == 0 ? r.q0 : r.q1) ^ 0x80808080u; }
  __host__ __device__ static void RunScale(const Raw& r, int, int, float& scale, float& offset) {
    scale = F16Bits(static_cast<uint16_t>(r.d));
    offset = 0.0f;
  }
  __host__ __device__ static int Swz(int q) { return q ^ ((q >> 3) & 1); }
};

// Q8_0x8 (Q8_0 regrouped on upload, device_matrix.h): piece = 16 quants, half a block, read
// with one 16-byte load plus its block's 2-byte scale; 16 lanes per 272-byte super-block, so one
// load instruction of a warp reads two runs of 256 contiguous bytes. (Q8_0 needs 3-4 loads for 8
// quants; this is what bounded its decode matvec.) Swz: lane l of a quarter-warp reads float4
// 4l + i; XOR-ing the low three bits with l spreads the eight lanes over all 32 banks (a
// bijection on aligned groups of 32 float4s, so cols % 128 == 0).
struct FmtQ8_0x8 {
  static constexpr int kMaxSlots = 4, kMinBlocks = 2;  // 3 spilled (80 registers) at kN = 1, 2
  static constexpr bool kPrefetch = true;
  static constexpr int kPieceElems = 16, kRuns = 1, kRunLen = 16, kBias = 128;
  static constexpr bool kXSum = false;
  struct Raw {
    uint4 q;
    uint32_t d;
  };
  __host__ __device__ static int64_t RowBytes(int cols) { return static_cast<int64_t>(cols) / 256 * 272; }
  __host__ __device__ static void Load(const uint8_t* row, int p, Raw& r) {
    const uint8_t* sb = row + static_cast<int64_t>(p >> 4) * 272;
    r.q = Ld128(sb + 16 + 16 * (p & 15));
    r.d = Ld16(sb + 2 * ((p & 15) >> 1));
  }
  __host__ __device__ static int RunCol(int p, int) { return 16 * p; }
  __host__ __device__ static uint32_t Word(const Raw& r, int, int, int i) {
    return (i == 0 ? r.q.x : i == 1 ? r.q.y : i == 2 ? r.q.z : r.q.w) ^ 0x80808080u;
  }
  __host__ __device__ static void RunScale(const Raw& r, int, int, float& scale, float& offset) {
    scale = F16Bits(static_cast<uint16_t>(r.d));
    offset = 0.0f;
  }
  __host__ __device__ static int Swz(int q) { return q ^ ((q >> 2) & 7); }
};

// Q6_K: piece = 16 elements: 4 runs of 4 (columns 128h + 32g + l, g = 0..3) sharing one
// qh word; 16 lanes per 210-byte block.
struct FmtQ6_K {
  static constexpr int kMaxSlots = 4, kMinBlocks = 2;
  static constexpr bool kPrefetch = true;
  static constexpr int kPieceElems = 16, kRuns = 4, kRunLen = 4, kBias = 32;
  static constexpr bool kXSum = false;
  struct Raw {
    uint32_t ql0, ql1, qh, sc_lo, sc_hi, d;
  };
  __host__ __device__ static int64_t RowBytes(int cols) { return static_cast<int64_t>(cols) / 256 * 210; }
  __host__ __device__ static void Load(const uint8_t* row, int p, Raw& r) {
    const uint8_t* blk = row + static_cast<int64_t>(p >> 4) * 210;
    const int h = (p >> 3) & 1, l = 4 * (p & 7);
    r.ql0 = Ld32At2(blk + 64 * h + l);
    r.ql1 = Ld32At2(blk + 64 * h + 32 + l);
    r.qh = Ld32At2(blk + 128 + 32 * h + l);
    Ld64At2(blk + 192 + 8 * h, r.sc_lo, r.sc_hi);
    r.d = Ld16(blk + 208);
  }
  __host__ __device__ static int RunCol(int p, int run) { return 256 * (p >> 4) + 128 * ((p >> 3) & 1) + 32 * run + 4 * (p & 7); }
  __host__ __device__ static uint32_t Word(const Raw& r, int, int run, int) {
    const uint32_t src = (run & 1) ? r.ql1 : r.ql0;
    const uint32_t low = (run >= 2 ? (src >> 4) : src) & 0x0F0F0F0Fu;
    const uint32_t high = run == 0 ? (r.qh << 4) : run == 1 ? (r.qh << 2) : run == 2 ? r.qh : (r.qh >> 2);
    return low | (high & 0x30303030u);
  }
  __host__ __device__ static void RunScale(const Raw& r, int p, int run, float& scale, float& offset) {
    const int b = ((p & 7) >> 2) + 2 * run;  // scale byte 8h + l/16 + 2g, h's 8 bytes in sc_lo/sc_hi
    const uint32_t word = b < 4 ? r.sc_lo : r.sc_hi;
    const int sc = static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * (b & 3))));
    scale = F16Bits(static_cast<uint16_t>(r.d)) * static_cast<float>(sc);
    offset = 0.0f;
  }
  __host__ __device__ static int Swz(int q) { return q; }
};

// Scale and min of sub-block j of a Q4_K/Q5_K block from its 16-byte head (d, dmin, scales),
// in registers (UnpackKScaleMin of block_layouts.h without a byte array).
TANDEM_MV_HD void KScaleMin(const uint4& head, int j, float& scale, float& offset) {
  const int b = 8 * (j & 3);
  const uint32_t y = head.y >> b, z = head.z >> b, w = head.w >> b;
  uint32_t sc, m;
  if (j < 4) {
    sc = y & 63;
    m = z & 63;
  } else {
    sc = (w & 0xF) | (((y >> 6) & 3) << 4);
    m = ((w >> 4) & 0xF) | (((z >> 6) & 3) << 4);
  }
  scale = F16Bits(static_cast<uint16_t>(head.x & 0xFFFF)) * static_cast<float>(sc);
  offset = F16Bits(static_cast<uint16_t>(head.x >> 16)) * static_cast<float>(m);
}

// Q4_K: piece = 16 qs bytes = 32 elements: run 0 the low nibbles (sub-block 2g), run 1 the high
// nibbles (sub-block 2g + 1); 8 lanes per 144-byte block.
struct FmtQ4_K {
  static constexpr int kMaxSlots = 4, kMinBlocks = 2;
  static constexpr bool kPrefetch = false;
  static constexpr int kPieceElems = 32, kRuns = 2, kRunLen = 16, kBias = 0;
  static constexpr bool kXSum = true;
  struct Raw {
    uint4 head, qs;
  };
  __host__ __device__ static int64_t RowBytes(int cols) { return static_cast<int64_t>(cols) / 256 * 144; }
  __host__ __device__ static void Load(const uint8_t* row, int p, Raw& r) {
    const uint8_t* blk = row + static_cast<int64_t>(p >> 3) * 144;
    r.head = Ld128(blk);
    r.qs = Ld128(blk + 16 + 16 * (p & 7));
  }
  __host__ __device__ static int RunCol(int p, int run) { return 256 * (p >> 3) + 64 * ((p & 7) >> 1) + 16 * (p & 1) + 32 * run; }
  __host__ __device__ static uint32_t Word(const Raw& r, int, int run, int i) {
    const uint32_t w = i == 0 ? r.qs.x : i == 1 ? r.qs.y : i == 2 ? r.qs.z : r.qs.w;
    return (run ? (w >> 4) : w) & 0x0F0F0F0Fu;
  }
  __host__ __device__ static void RunScale(const Raw& r, int p, int run, float& scale, float& offset) {
    KScaleMin(r.head, 2 * ((p & 7) >> 1) + run, scale, offset);
  }
  __host__ __device__ static int Swz(int q) { return q ^ ((q >> 4) & 3); }
};

// Q5_K: as Q4_K plus the 16 qh bytes of the piece's columns (bit j = sub-block).
struct FmtQ5_K {
  static constexpr int kMaxSlots = 2, kMinBlocks = 2;
  static constexpr bool kPrefetch = false;
  static constexpr int kPieceElems = 32, kRuns = 2, kRunLen = 16, kBias = 0;
  static constexpr bool kXSum = true;
  struct Raw {
    uint4 head, qh, qs;
  };
  __host__ __device__ static int64_t RowBytes(int cols) { return static_cast<int64_t>(cols) / 256 * 176; }
  __host__ __device__ static void Load(const uint8_t* row, int p, Raw& r) {
    const uint8_t* blk = row + static_cast<int64_t>(p >> 3) * 176;
    r.head = Ld128(blk);
    r.qh = Ld128(blk + 16 + 16 * (p & 1));
    r.qs = Ld128(blk + 48 + 16 * (p & 7));
  }
  __host__ __device__ static int RunCol(int p, int run) { return FmtQ4_K::RunCol(p, run); }
  __host__ __device__ static uint32_t Word(const Raw& r, int p, int run, int i) {
    const uint32_t w = i == 0 ? r.qs.x : i == 1 ? r.qs.y : i == 2 ? r.qs.z : r.qs.w;
    const uint32_t h = i == 0 ? r.qh.x : i == 1 ? r.qh.y : i == 2 ? r.qh.z : r.qh.w;
    const int j = 2 * ((p & 7) >> 1) + run;
    return ((run ? (w >> 4) : w) & 0x0F0F0F0Fu) | (((h >> j) << 4) & 0x10101010u);
  }
  __host__ __device__ static void RunScale(const Raw& r, int p, int run, float& scale, float& offset) {
    KScaleMin(r.head, 2 * ((p & 7) >> 1) + run, scale, offset);
  }
  __host__ __device__ static int Swz(int q) { return FmtQ4_K::Swz(q); }
};

template <uint32_t kType>
struct FormatOf {
  using Type = void;  // no fast path: the generic kernels of dequant.cuh serve it
};
template <> struct FormatOf<kTypeQ8_0> { using Type = FmtQ8_0; };
template <> struct FormatOf<kTypeQ6_K> { using Type = FmtQ6_K; };
template <> struct FormatOf<kTypeQ4_K> { using Type = FmtQ4_K; };
template <> struct FormatOf<kTypeQ5_K> { using Type = FmtQ5_K; };
template <> struct FormatOf<kTypeQ8_0x8> { using Type = FmtQ8_0x8; };

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_FORMATS_CUH_
