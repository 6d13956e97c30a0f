// The packed block structs of the ggml block formats Tandem computes with, byte for byte as in
// ggml's ggml-common.h, plus the helpers that unpack (and pack) their sub-block scales.
//
// Half-precision fields (d, dmin) hold raw f16 bit patterns; convert with half.h. All structs
// have 2-byte alignment and no padding (static_asserts below). Element index e runs over the
// block in row order; each struct's comment says where element e's bits live.
//
// Plain C++ without Abseil so that SIMD CPU kernels and CUDA kernels can include it.
#ifndef TANDEM_COMMON_WEIGHTS_BLOCK_LAYOUTS_H_
#define TANDEM_COMMON_WEIGHTS_BLOCK_LAYOUTS_H_

#include <cstdint>

#include "common/weights/half.h"

namespace tandem {

inline constexpr int kLegacyBlockElems = 32;  // QK4_0, QK8_0
inline constexpr int kSuperBlockElems = 256;  // QK_K
inline constexpr int kKScaleBytes = 12;       // K_SCALE_SIZE

// Q4_0: x = d * (q - 8), q in [0, 15]. Element e < 16 is the low nibble of qs[e], element
// e >= 16 the high nibble of qs[e - 16].
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kLegacyBlockElems / 2];
};

// Q8_0: x = d * qs[e], qs signed.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kLegacyBlockElems];
};

// Q2_K: 16 sub-blocks of 16; sub-block s = e / 16 has scales[s] = (min nibble << 4) | scale
// nibble, and x = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q in [0, 3].
// q of element e: byte qs[32 * (e / 128) + e % 32], bits 2 * ((e % 128) / 32) and up.
struct BlockQ2_K {
  uint8_t scales[kSuperBlockElems / 16];
  uint8_t qs[kSuperBlockElems / 4];
  uint16_t d;
  uint16_t dmin;
};

// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales sc (see UnpackQ3KScale) and
// x = d * sc * (q - 4), q in [0, 7]. q's low two bits sit in qs exactly as Q2_K's q;
// its high bit is bit (e / 32) of hmask[e % 32].
struct BlockQ3_K {
  uint8_t hmask[kSuperBlockElems / 8];
  uint8_t qs[kSuperBlockElems / 4];
  uint8_t scales[kKScaleBytes];
  uint16_t d;
};

// Q4_K: 8 sub-blocks of 32 with 6-bit scale sc and min m (see UnpackKScaleMin) and
// x = d * sc * q - dmin * m, q in [0, 15]. q of element e: byte qs[32 * (e / 64) + e % 32],
// low nibble when (e % 64) < 32, high nibble otherwise.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kSuperBlockElems / 2];
};

// Q5_K: as Q4_K with q in [0, 31]: the low four bits as Q4_K's q, the fifth bit is bit (e / 32)
// of qh[e % 32].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kSuperBlockElems / 8];
  uint8_t qs[kSuperBlockElems / 2];
};

// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales and x = d * scales[e / 16] * (q - 32),
// q in [0, 63]. With h = e / 128, g = (e % 128) / 32, l = e % 32: the low four bits are in
// ql[64 * h + 32 * (g & 1) + l] (low nibble for g < 2, high nibble for g >= 2), the top two bits
// are bits 2 * g and 2 * g + 1 of qh[32 * h + l].
struct BlockQ6_K {
  uint8_t ql[kSuperBlockElems / 2];
  uint8_t qh[kSuperBlockElems / 4];
  int8_t scales[kSuperBlockElems / 16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18, "ggml block_q4_0 is 18 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "ggml block_q8_0 is 34 bytes");
static_assert(sizeof(BlockQ2_K) == 84, "ggml block_q2_K is 84 bytes");
static_assert(sizeof(BlockQ3_K) == 110, "ggml block_q3_K is 110 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "ggml block_q4_K is 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "ggml block_q5_K is 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "ggml block_q6_K is 210 bytes");

// Q4_K / Q5_K: scale and min of sub-block j (0..7), 6 bits each, from the 12 scale bytes.
// Sub-blocks 0-3 keep theirs in the low 6 bits of bytes j (scale) and j + 4 (min); sub-blocks
// 4-7 keep the low 4 bits in byte j + 4 (scale low nibble, min high nibble) and the top 2 bits in
// the top 2 bits of bytes j - 4 (scale) and j (min).
TANDEM_WEIGHTS_HD inline void UnpackKScaleMin(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// The inverse of UnpackKScaleMin for all eight sub-blocks; scale[j], min[j] must be <= 63.
TANDEM_WEIGHTS_HD inline void PackKScalesMins(const uint8_t* scale, const uint8_t* min, uint8_t* scales) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = scale[j];
    scales[j + 4] = min[j];
  }
  for (int j = 4; j < 8; ++j) {
    scales[j + 4] = static_cast<uint8_t>((scale[j] & 0xF) | ((min[j] & 0xF) << 4));
    scales[j - 4] |= static_cast<uint8_t>((scale[j] >> 4) << 6);
    scales[j] |= static_cast<uint8_t>((min[j] >> 4) << 6);
  }
}

// Q3_K: the signed scale of sub-block j (0..15), in [-32, 31]. Each is stored as 6 bits biased
// by 32: the low 4 bits are the low nibble of byte j (j < 8) or the high nibble of byte j - 8
// (j >= 8); the top 2 bits are bits 2 * (j / 4) and up of byte 8 + j % 4.
TANDEM_WEIGHTS_HD inline int UnpackQ3KScale(int j, const uint8_t* scales) {
  const int low = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// The inverse of UnpackQ3KScale for all sixteen sub-blocks; biased[j] = scale + 32 in [0, 63].
TANDEM_WEIGHTS_HD inline void PackQ3KScales(const uint8_t* biased, uint8_t* scales) {
  for (int j = 0; j < kKScaleBytes; ++j) scales[j] = 0;
  for (int j = 0; j < 16; ++j) {
    const uint8_t low = biased[j] & 0xF;
    if (j < 8) {
      scales[j] = low;
    } else {
      scales[j - 8] |= static_cast<uint8_t>(low << 4);
    }
    scales[8 + j % 4] |= static_cast<uint8_t>((biased[j] >> 4) << (2 * (j / 4)));
  }
}

// Q2_K / Q3_K: packs 256 two-bit values (element order, each in [0, 3]) into the 64-byte qs
// layout the two types share (see BlockQ2_K).
TANDEM_WEIGHTS_HD inline void PackTwoBitValues(const uint8_t* values, uint8_t* qs) {
  for (int h = 0; h < kSuperBlockElems; h += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[h / 4 + l] = static_cast<uint8_t>(values[h + l] | (values[h + l + 32] << 2) | (values[h + l + 64] << 4) |
                                           (values[h + l + 96] << 6));
    }
  }
}

}  // namespace tandem

#endif  // TANDEM_COMMON_WEIGHTS_BLOCK_LAYOUTS_H_
