// The row loop of MatMul and the per-chunk dequantizers, written once over a vector-operations
// type V and instantiated by each matmul_<isa>.cc (internal to tandem_reference).
//
// Include this header only after every other header and after the file's `#pragma GCC target`,
// so that the code here is compiled for that instruction set and nothing else is. Everything
// here sits in an anonymous namespace: each instruction set's copy stays private to its file (no
// inline function compiled for AVX-512 can be merged by the linker into code run elsewhere).
//
// V provides:
//   kReferenceDequant: true to dequantize with DequantizeRow (the scalar variant), false to use
//     the vector dequantizers below, which must reproduce DequantizeRow's values bit for bit
//     (each of them evaluates DequantizeRow's expression with the same f32 operations; the files
//     are compiled with -ffp-contract=off so that a multiply and a subtract stay two roundings);
//   kWidth (8 or 16) and the int32 / f32 vector types I and F with
//     LoadU8 / LoadI8 (kWidth bytes, zero- / sign-extended), LoadU16 (kWidth u16, zero-extended),
//     LoadF16 (kWidth f16 to f32), And / Add (with an int32 constant), Or, Srl / Shl (by a count),
//     ToFloat (int32 to f32), AsFloat (bit cast), Set1, Mul, Sub, Store (unaligned);
//   kHasLookup16 and, if true, Levels16 (the f32 values 0..15) and Lookup16(table, idx) (lane i
//     gets table[idx[i] & 15]; needs kWidth 16);
//   DotChunk(w, x) and DotPartial(w, x, m): the contract's chunk sum over 256 or m < 256 elements;
//   kAccumulators (the vectors DotChunk sums into: kLanes / kWidth), Zero, Load, Fma(a, b, acc)
//   and ReduceAccumulators (DotChunk's final tree) for the fused decode path.
#ifndef TANDEM_COMMON_REFERENCE_MATMUL_ROWS_H_
#define TANDEM_COMMON_REFERENCE_MATMUL_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/reference/matmul_kernels.h"
#include "common/weights/block_layouts.h"
#include "common/weights/half.h"
#include "common/weights/weight_types.h"

namespace tandem::matmul_internal {
namespace {

constexpr int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }

// Token tiles at least this large have their activation chunks copied together (see below).
constexpr int64_t kPackTokens = 8;

[[maybe_unused, gnu::always_inline]] inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return Fp16ToFp32(h);
}

// Bytes of one 256-element chunk of a row.
template <WeightType kType>
constexpr int64_t ChunkBytes() {
  switch (kType) {
    case WeightType::kF32: return kChunkElems * 4;
    case WeightType::kF16:
    case WeightType::kBF16: return kChunkElems * 2;
    case WeightType::kQ4_0: return kChunkElems / kLegacyBlockElems * sizeof(BlockQ4_0);
    case WeightType::kQ8_0: return kChunkElems / kLegacyBlockElems * sizeof(BlockQ8_0);
    case WeightType::kQ2_K: return sizeof(BlockQ2_K);
    case WeightType::kQ3_K: return sizeof(BlockQ3_K);
    case WeightType::kQ4_K: return sizeof(BlockQ4_K);
    case WeightType::kQ5_K: return sizeof(BlockQ5_K);
    case WeightType::kQ6_K: return sizeof(BlockQ6_K);
  }
  return 0;
}

// ---- Dequantizers of one full 256-element chunk; each mirrors its DequantizeRow kernel. ----

template <class V, class Sink>
[[gnu::always_inline]] inline void DequantF16(const uint8_t* src, Sink& out) {
#pragma GCC unroll 32
  for (int e = 0; e < kChunkElems; e += V::kWidth) out.Put(e, V::LoadF16(src + 2 * e));
}

template <class V, class Sink>
[[gnu::always_inline]] inline void DequantBF16(const uint8_t* src, Sink& out) {
#pragma GCC unroll 32
  for (int e = 0; e < kChunkElems; e += V::kWidth) out.Put(e, V::AsFloat(V::Shl(V::LoadU16(src + 2 * e), 16)));
}

// x = d * qs[e] over `blocks` blocks (eight in a full chunk).
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ8_0(const uint8_t* src, Sink& out, int64_t blocks) {
  const auto block_values = [&](int64_t b) __attribute__((always_inline)) {
    const uint8_t* block = src + b * sizeof(BlockQ8_0);
    const auto d = V::Set1(HalfAt(block + offsetof(BlockQ8_0, d)));
    const uint8_t* qs = block + offsetof(BlockQ8_0, qs);
#pragma GCC unroll 4
    for (int l = 0; l < kLegacyBlockElems; l += V::kWidth) {
      out.Put(kLegacyBlockElems * b + l, V::Mul(V::ToFloat(V::LoadI8(qs + l)), d));
    }
  };
  if (blocks == kChunkElems / kLegacyBlockElems) {
#pragma GCC unroll 8
    for (int b = 0; b < kChunkElems / kLegacyBlockElems; ++b) block_values(b);  // constant offsets
  } else {
    for (int64_t b = 0; b < blocks; ++b) block_values(b);
  }
}

// x = (nibble - 8) * d over `blocks` blocks; element l < 16 is the low nibble of qs[l].
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ4_0(const uint8_t* src, Sink& out, int64_t blocks) {
  constexpr int kHalf = kLegacyBlockElems / 2;
  const auto block_values = [&](int64_t b) __attribute__((always_inline)) {
    const uint8_t* block = src + b * sizeof(BlockQ4_0);
    const auto d = V::Set1(HalfAt(block + offsetof(BlockQ4_0, d)));
    const uint8_t* qs = block + offsetof(BlockQ4_0, qs);
#pragma GCC unroll 2
    for (int l = 0; l < kHalf; l += V::kWidth) {
      const auto bytes = V::LoadU8(qs + l);
      out.Put(kLegacyBlockElems * b + l, V::Mul(V::ToFloat(V::Add(V::And(bytes, 0xF), -8)), d));
      out.Put(kLegacyBlockElems * b + kHalf + l, V::Mul(V::ToFloat(V::Add(V::Srl(bytes, 4), -8)), d));
    }
  };
  if (blocks == kChunkElems / kLegacyBlockElems) {
#pragma GCC unroll 8
    for (int b = 0; b < kChunkElems / kLegacyBlockElems; ++b) block_values(b);  // constant offsets
  } else {
    for (int64_t b = 0; b < blocks; ++b) block_values(b);
  }
}

// Element e = 128 h + 32 g + l: q = (qs[32 h + l] >> 2 g) & 3, x = dl * q - ml (sub-block e / 16).
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ2_K(const uint8_t* block, Sink& out) {
  const float d = HalfAt(block + offsetof(BlockQ2_K, d));
  const float dmin = HalfAt(block + offsetof(BlockQ2_K, dmin));
  const uint8_t* scales = block + offsetof(BlockQ2_K, scales);
  const uint8_t* qs = block + offsetof(BlockQ2_K, qs);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
#pragma GCC unroll 4
      for (int l = 0; l < 32; l += V::kWidth) {
        const int e = 128 * h + 32 * g + l;
        const uint8_t sc = scales[e / 16];
        const float dl = d * (sc & 0xF);
        const float ml = dmin * (sc >> 4);
        const auto q = V::And(V::Srl(V::LoadU8(qs + 32 * h + l), 2 * g), 3);
        out.Put(e, V::Sub(V::Mul(V::Set1(dl), V::ToFloat(q)), V::Set1(ml)));
      }
    }
  }
}

// As Q2_K for the low two bits; bit (e / 32) of hmask[l] set means q - 0, clear means q - 4.
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ3_K(const uint8_t* block, Sink& out) {
  const float d = HalfAt(block + offsetof(BlockQ3_K, d));
  const uint8_t* scales = block + offsetof(BlockQ3_K, scales);
  const uint8_t* hmask = block + offsetof(BlockQ3_K, hmask);
  const uint8_t* qs = block + offsetof(BlockQ3_K, qs);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
#pragma GCC unroll 4
      for (int l = 0; l < 32; l += V::kWidth) {
        const int e = 128 * h + 32 * g + l;
        const float dl = d * UnpackQ3KScale(e / 16, scales);
        const auto low = V::And(V::Srl(V::LoadU8(qs + 32 * h + l), 2 * g), 3);
        const auto high = V::And(V::Srl(V::LoadU8(hmask + l), e / 32), 1);
        const auto q = V::Add(V::Or(low, V::Shl(high, 2)), -4);
        out.Put(e, V::Mul(V::Set1(dl), V::ToFloat(q)));
      }
    }
  }
}

// Sub-block j's factor d * sc and offset dmin * m (as DequantizeQ4_K / Q5_K compute them). The
// eight 6-bit scales and mins are unpacked four at a time in 32-bit words (UnpackKScaleMin's
// layout, read little-endian: these kernels are x86 only), then converted in one vectorizable loop.
[[maybe_unused, gnu::always_inline]] inline void KFactors(const uint8_t* block, float* factor, float* offset) {
  const float d = HalfAt(block + offsetof(BlockQ4_K, d));
  const float dmin = HalfAt(block + offsetof(BlockQ4_K, dmin));
  uint32_t packed[3];
  std::memcpy(packed, block + offsetof(BlockQ4_K, scales), sizeof(packed));
  const uint32_t words[4] = {
      packed[0] & 0x3F3F3F3Fu,                                                      // scales 0-3
      ((packed[2] & 0x0F0F0F0Fu) | (((packed[0] >> 6) & 0x03030303u) << 4)),       // scales 4-7
      packed[1] & 0x3F3F3F3Fu,                                                      // mins 0-3
      (((packed[2] >> 4) & 0x0F0F0F0Fu) | (((packed[1] >> 6) & 0x03030303u) << 4)),  // mins 4-7
  };
  uint8_t bytes[16];
  std::memcpy(bytes, words, sizeof(bytes));
  for (int j = 0; j < 8; ++j) factor[j] = d * bytes[j];
  for (int j = 0; j < 8; ++j) offset[j] = dmin * bytes[8 + j];
}

// Element e = 64 g + 32 k + l: nibble k of qs[32 g + l], x = factor[e / 32] * q - offset[e / 32].
// With a 16-entry lookup (AVX-512's vpermps), each sub-block's 16 possible values are computed
// once, with the same two roundings, and picked by nibble: one instruction instead of three.
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ4_K(const uint8_t* block, Sink& out) {
  float factor[8], offset[8];
  KFactors(block, factor, offset);
  const uint8_t* qs = block + offsetof(BlockQ4_K, qs);
  if constexpr (V::kHasLookup16) {
    const auto levels = V::Levels16();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const auto low_values = V::Sub(V::Mul(V::Set1(factor[2 * g]), levels), V::Set1(offset[2 * g]));
      const auto high_values = V::Sub(V::Mul(V::Set1(factor[2 * g + 1]), levels), V::Set1(offset[2 * g + 1]));
#pragma GCC unroll 2
      for (int l = 0; l < 32; l += V::kWidth) {
        const auto bytes = V::LoadU8(qs + 32 * g + l);
        out.Put(64 * g + l, V::Lookup16(low_values, bytes));  // uses the low 4 bits only
        out.Put(64 * g + 32 + l, V::Lookup16(high_values, V::Srl(bytes, 4)));
      }
    }
  } else {
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const auto f0 = V::Set1(factor[2 * g]), o0 = V::Set1(offset[2 * g]);
      const auto f1 = V::Set1(factor[2 * g + 1]), o1 = V::Set1(offset[2 * g + 1]);
#pragma GCC unroll 4
      for (int l = 0; l < 32; l += V::kWidth) {
        const auto bytes = V::LoadU8(qs + 32 * g + l);
        out.Put(64 * g + l, V::Sub(V::Mul(f0, V::ToFloat(V::And(bytes, 0xF))), o0));
        out.Put(64 * g + 32 + l, V::Sub(V::Mul(f1, V::ToFloat(V::Srl(bytes, 4))), o1));
      }
    }
  }
}

// As Q4_K with a fifth bit: bit (e / 32) of qh[l] adds 16.
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ5_K(const uint8_t* block, Sink& out) {
  float factor[8], offset[8];
  KFactors(block, factor, offset);
  const uint8_t* qs = block + offsetof(BlockQ5_K, qs);
  const uint8_t* qh = block + offsetof(BlockQ5_K, qh);
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const int j0 = 2 * g, j1 = 2 * g + 1;
    const auto f0 = V::Set1(factor[j0]), o0 = V::Set1(offset[j0]);
    const auto f1 = V::Set1(factor[j1]), o1 = V::Set1(offset[j1]);
#pragma GCC unroll 4
    for (int l = 0; l < 32; l += V::kWidth) {
      const auto bytes = V::LoadU8(qs + 32 * g + l);
      const auto high = V::LoadU8(qh + l);
      const auto q0 = V::Or(V::And(bytes, 0xF), V::Shl(V::And(V::Srl(high, j0), 1), 4));
      const auto q1 = V::Or(V::Srl(bytes, 4), V::Shl(V::And(V::Srl(high, j1), 1), 4));
      out.Put(64 * g + l, V::Sub(V::Mul(f0, V::ToFloat(q0)), o0));
      out.Put(64 * g + 32 + l, V::Sub(V::Mul(f1, V::ToFloat(q1)), o1));
    }
  }
}

// Element e = 128 h + 32 g + l: low nibble (g < 2) or high nibble of ql[64 h + 32 (g & 1) + l],
// bits 2 g.. of qh[32 h + l] on top; x = (d * scales[e / 16]) * (q - 32).
template <class V, class Sink>
[[gnu::always_inline]] inline void DequantQ6_K(const uint8_t* block, Sink& out) {
  const float d = HalfAt(block + offsetof(BlockQ6_K, d));
  const auto* scales = reinterpret_cast<const int8_t*>(block + offsetof(BlockQ6_K, scales));
  const uint8_t* ql = block + offsetof(BlockQ6_K, ql);
  const uint8_t* qh = block + offsetof(BlockQ6_K, qh);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
#pragma GCC unroll 4
      for (int l = 0; l < 32; l += V::kWidth) {
        const int e = 128 * h + 32 * g + l;
        const float factor = d * scales[e / 16];
        const auto low_bytes = V::LoadU8(ql + 64 * h + 32 * (g & 1) + l);
        const auto low = g < 2 ? V::And(low_bytes, 0xF) : V::Srl(low_bytes, 4);
        const auto high = V::And(V::Srl(V::LoadU8(qh + 32 * h + l), 2 * g), 3);
        const auto q = V::Add(V::Or(low, V::Shl(high, 4)), -32);
        out.Put(e, V::Mul(V::Set1(factor), V::ToFloat(q)));
      }
    }
  }
}

// Where a dequantizer's vectors go: into an L1 buffer, or straight into a chunk dot product.
template <class V>
struct StoreSink {
  float* out;
  [[gnu::always_inline]] void Put(int64_t e, typename V::F values) { V::Store(out + e, values); }
};

// Accumulator a takes the vectors with (e / kWidth) % kAccumulators == a; every dequantizer
// emits each accumulator's vectors in increasing e, so the sums are DotChunk's to the bit.
template <class V>
struct DotSink {
  const float* x;
  typename V::F acc[V::kAccumulators];
  [[gnu::always_inline]] void Put(int64_t e, typename V::F values) {
    auto& a = acc[(e / V::kWidth) % V::kAccumulators];
    a = V::Fma(values, V::Load(x + e), a);
  }
};

// Sends the 256 values of a full chunk (not F32) to `sink`.
template <class V, WeightType kType, class Sink>
[[gnu::always_inline]] inline void DequantFullChunk(const uint8_t* src, Sink& sink) {
  constexpr int64_t kLegacyBlocks = kChunkElems / kLegacyBlockElems;
  if constexpr (kType == WeightType::kF16) DequantF16<V>(src, sink);
  if constexpr (kType == WeightType::kBF16) DequantBF16<V>(src, sink);
  if constexpr (kType == WeightType::kQ4_0) DequantQ4_0<V>(src, sink, kLegacyBlocks);
  if constexpr (kType == WeightType::kQ8_0) DequantQ8_0<V>(src, sink, kLegacyBlocks);
  if constexpr (kType == WeightType::kQ2_K) DequantQ2_K<V>(src, sink);
  if constexpr (kType == WeightType::kQ3_K) DequantQ3_K<V>(src, sink);
  if constexpr (kType == WeightType::kQ4_K) DequantQ4_K<V>(src, sink);
  if constexpr (kType == WeightType::kQ5_K) DequantQ5_K<V>(src, sink);
  if constexpr (kType == WeightType::kQ6_K) DequantQ6_K<V>(src, sink);
}

// The f32 values of the chunk at `src` (m elements): the row itself for F32, else `buf`.
template <class V, WeightType kType>
const float* DequantChunk(const uint8_t* src, int64_t m, float* buf) {
  if constexpr (kType == WeightType::kF32) {
    return reinterpret_cast<const float*>(src);
  } else if constexpr (V::kReferenceDequant) {
    DequantizeRow(kType, src, buf, m);
    return buf;
  } else {
    StoreSink<V> sink{buf};
    if (m == kChunkElems) {
      DequantFullChunk<V, kType>(src, sink);
    } else if constexpr (kType == WeightType::kQ4_0) {
      DequantQ4_0<V>(src, sink, m / kLegacyBlockElems);  // a short last chunk has whole blocks
    } else if constexpr (kType == WeightType::kQ8_0) {
      DequantQ8_0<V>(src, sink, m / kLegacyBlockElems);
    } else {
      DequantizeRow(kType, src, buf, m);  // float rows of any length
    }
    return buf;
  }
}

// The contract's sum of one full chunk against x, without storing the dequantized values.
template <class V, WeightType kType>
float FusedDotChunk(const uint8_t* src, const float* x) {
  DotSink<V> sink{x, {}};
  for (auto& a : sink.acc) a = V::Zero();
  DequantFullChunk<V, kType>(src, sink);
  return V::ReduceAccumulators(sink.acc);
}

// Tiles of kRowTile weight rows by kTokenTile activation rows; per chunk, the tile's weight rows
// are dequantized once and dotted with every activation row of the tile. Row r's sum for token t
// sees the same chunk sums in the same order whatever the tiling.
template <class V, WeightType kType>
void MatMulRowsTyped(const MatMulJob& job, int64_t row_begin, int64_t row_end) {
  const int64_t cols = job.w.cols;
  const int64_t rows = job.w.rows;
  const int64_t chunks = (cols + kChunkElems - 1) / kChunkElems;
  alignas(64) float buf[kRowTile][kChunkElems];
  alignas(64) float x_pack[kTokenTile][kChunkElems];
  double acc[kRowTile][kTokenTile];
  const float* w_chunk[kRowTile];
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowTile) {
    const int64_t row_count = MinI64(kRowTile, row_end - r0);
    for (int64_t t0 = 0; t0 < job.n; t0 += kTokenTile) {
      const int64_t token_count = MinI64(kTokenTile, job.n - t0);
      for (int64_t r = 0; r < row_count; ++r) {
        for (int64_t t = 0; t < token_count; ++t) acc[r][t] = 0.0;
      }
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t start = c * kChunkElems;
        const int64_t m = MinI64(kChunkElems, cols - start);
        const float* x_chunk = job.x + t0 * cols + start;
        // One activation row (decode): dequantize straight into the dot product's registers.
        constexpr bool kCanFuse = kType != WeightType::kF32 && !V::kReferenceDequant;
        const bool fused = kCanFuse && token_count == 1 && m == kChunkElems;
        for (int64_t r = 0; r < row_count; ++r) {
          const uint8_t* src = job.w.row(r0 + r) + c * ChunkBytes<kType>();
          // The same chunk of the next row tile: the hardware prefetcher alone does not keep up
          // with four interleaved rows (it halved the time of a DRAM-resident q6_K n = 1 product).
          if (r0 + r + kRowTile < job.w.rows) {
            const uint8_t* ahead = job.w.row(r0 + r + kRowTile) + c * ChunkBytes<kType>();
            for (int64_t b = 0; b < ChunkBytes<kType>(); b += 64) __builtin_prefetch(ahead + b);
          }
          if constexpr (kCanFuse) {
            if (fused) {
              acc[r][0] += FusedDotChunk<V, kType>(src, x_chunk);
              continue;
            }
          }
          w_chunk[r] = DequantChunk<V, kType>(src, m, buf[r]);
        }
        if (fused) continue;
        int64_t x_stride = cols;
        if (token_count >= kPackTokens && m == kChunkElems) {
          // Activation rows cols apart fall into the same few L1 sets when cols is a power of
          // two; packed, the tile's chunks are contiguous.
          for (int64_t t = 0; t < token_count; ++t) {
            std::memcpy(x_pack[t], x_chunk + t * cols, sizeof(x_pack[t]));
          }
          x_chunk = x_pack[0];
          x_stride = kChunkElems;
        }
        if (m == kChunkElems) {
          for (int64_t t = 0; t < token_count; ++t) {
            for (int64_t r = 0; r < row_count; ++r) acc[r][t] += V::DotChunk(w_chunk[r], x_chunk + t * x_stride);
          }
        } else {
          for (int64_t t = 0; t < token_count; ++t) {
            for (int64_t r = 0; r < row_count; ++r) acc[r][t] += V::DotPartial(w_chunk[r], x_chunk + t * cols, m);
          }
        }
      }
      for (int64_t t = 0; t < token_count; ++t) {
        for (int64_t r = 0; r < row_count; ++r) job.y[(t0 + t) * rows + r0 + r] = static_cast<float>(acc[r][t]);
      }
    }
  }
}

// matmul.cc has already rejected any other type.
template <class V>
void MatMulRows(const MatMulJob& job, int64_t row_begin, int64_t row_end) {
  switch (job.w.type) {
    case WeightType::kF32: return MatMulRowsTyped<V, WeightType::kF32>(job, row_begin, row_end);
    case WeightType::kF16: return MatMulRowsTyped<V, WeightType::kF16>(job, row_begin, row_end);
    case WeightType::kBF16: return MatMulRowsTyped<V, WeightType::kBF16>(job, row_begin, row_end);
    case WeightType::kQ4_0: return MatMulRowsTyped<V, WeightType::kQ4_0>(job, row_begin, row_end);
    case WeightType::kQ8_0: return MatMulRowsTyped<V, WeightType::kQ8_0>(job, row_begin, row_end);
    case WeightType::kQ2_K: return MatMulRowsTyped<V, WeightType::kQ2_K>(job, row_begin, row_end);
    case WeightType::kQ3_K: return MatMulRowsTyped<V, WeightType::kQ3_K>(job, row_begin, row_end);
    case WeightType::kQ4_K: return MatMulRowsTyped<V, WeightType::kQ4_K>(job, row_begin, row_end);
    case WeightType::kQ5_K: return MatMulRowsTyped<V, WeightType::kQ5_K>(job, row_begin, row_end);
    case WeightType::kQ6_K: return MatMulRowsTyped<V, WeightType::kQ6_K>(job, row_begin, row_end);
  }
}

}  // namespace
}  // namespace tandem::matmul_internal

#endif  // TANDEM_COMMON_REFERENCE_MATMUL_ROWS_H_
