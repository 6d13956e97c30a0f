// One K-quant super-block in a common integer form, shared by every kernel family:
//   x[e] = d * sc[s] * q[e] - dmin * mn[s]      for the 16-element sub-block s = e / 16,
// with q[e] an unsigned small integer. Q4_K / Q5_K repeat each 32-element scale and min over two
// 16-element sub-blocks; Q3_K and Q6_K store centred values (q - 4, q - 32), which this form
// writes as mn = sc and dmin = 4 d (32 d). With int8 activations a[e] and their per-16 sums
// bsum[s], a super-block's dot product is then
//   da * (d * sum_s sc[s] * sum_{e in s} q[e] a[e]  -  dmin * sum_s mn[s] * bsum[s]),
// exact integers inside each parenthesised sum.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_K_QUANT_UNPACK_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_K_QUANT_UNPACK_H_

#include <cstdint>
#include <cstring>

#include "common/weights/block_layouts.h"
#include "common/weights/half.h"

namespace tandem {

struct KQuantScales {
  int16_t sc[16];
  int16_t mn[16];
  float d;
  float dmin;
};

// Q4_K / Q5_K: the eight 6-bit scales and mins as bytes (sc8[j], mn8[j]), from the 12 scale bytes
// read as three little-endian words (the layout UnpackKScaleMin describes).
inline void UnpackQ4KScaleBytes(const uint8_t* scales, uint8_t* sc8, uint8_t* mn8) {
  uint32_t w[3];
  std::memcpy(w, scales, sizeof(w));
  const uint32_t sc_low = w[0] & 0x3F3F3F3Fu;
  const uint32_t mn_low = w[1] & 0x3F3F3F3Fu;
  const uint32_t sc_high = (w[2] & 0x0F0F0F0Fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_high = ((w[2] >> 4) & 0x0F0F0F0Fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  std::memcpy(sc8, &sc_low, 4);
  std::memcpy(sc8 + 4, &sc_high, 4);
  std::memcpy(mn8, &mn_low, 4);
  std::memcpy(mn8 + 4, &mn_high, 4);
}

inline void UnpackScales(const BlockQ4_K& b, KQuantScales* s) {
  uint8_t sc8[8], mn8[8];
  UnpackQ4KScaleBytes(b.scales, sc8, mn8);
  for (int i = 0; i < 16; ++i) {
    s->sc[i] = sc8[i / 2];
    s->mn[i] = mn8[i / 2];
  }
  s->d = Fp16ToFp32(b.d);
  s->dmin = Fp16ToFp32(b.dmin);
}

inline void UnpackScales(const BlockQ5_K& b, KQuantScales* s) {
  uint8_t sc8[8], mn8[8];
  UnpackQ4KScaleBytes(b.scales, sc8, mn8);
  for (int i = 0; i < 16; ++i) {
    s->sc[i] = sc8[i / 2];
    s->mn[i] = mn8[i / 2];
  }
  s->d = Fp16ToFp32(b.d);
  s->dmin = Fp16ToFp32(b.dmin);
}

inline void UnpackScales(const BlockQ2_K& b, KQuantScales* s) {
  for (int i = 0; i < 16; ++i) {
    s->sc[i] = b.scales[i] & 0xF;
    s->mn[i] = b.scales[i] >> 4;
  }
  s->d = Fp16ToFp32(b.d);
  s->dmin = Fp16ToFp32(b.dmin);
}

inline void UnpackScales(const BlockQ3_K& b, KQuantScales* s) {
  for (int i = 0; i < 16; ++i) s->sc[i] = s->mn[i] = static_cast<int16_t>(UnpackQ3KScale(i, b.scales));
  s->d = Fp16ToFp32(b.d);
  s->dmin = 4.0f * s->d;
}

inline void UnpackScales(const BlockQ6_K& b, KQuantScales* s) {
  for (int i = 0; i < 16; ++i) s->sc[i] = s->mn[i] = b.scales[i];
  s->d = Fp16ToFp32(b.d);
  s->dmin = 32.0f * s->d;
}

// The unsigned q[e] of every element, in element order.
inline void UnpackValues(const BlockQ4_K& b, uint8_t* q) {
  for (int e = 0; e < 256; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    q[e] = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
  }
}

inline void UnpackValues(const BlockQ5_K& b, uint8_t* q) {
  for (int e = 0; e < 256; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    const int low = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
    const int high = (b.qh[e % 32] >> (e / 32)) & 1;
    q[e] = static_cast<uint8_t>(low | (high << 4));
  }
}

inline void UnpackValues(const BlockQ2_K& b, uint8_t* q) {
  for (int e = 0; e < 256; ++e) {
    q[e] = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  }
}

inline void UnpackValues(const BlockQ3_K& b, uint8_t* q) {
  for (int e = 0; e < 256; ++e) {
    const int low = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const int high = (b.hmask[e % 32] >> (e / 32)) & 1;
    q[e] = static_cast<uint8_t>(low | (high << 2));
  }
}

inline void UnpackValues(const BlockQ6_K& b, uint8_t* q) {
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    const uint8_t lbyte = b.ql[64 * h + 32 * (g & 1) + l];
    const int low = g < 2 ? (lbyte & 0xF) : (lbyte >> 4);
    const int high = (b.qh[32 * h + l] >> (2 * g)) & 3;
    q[e] = static_cast<uint8_t>(low | (high << 4));
  }
}

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_K_QUANT_UNPACK_H_
