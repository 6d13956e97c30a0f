// F32, F16 and BF16 rows: one element per "block", converted with half.h.
#include <cstring>

#include "common/weights/half.h"
#include "common/weights/row_kernels.h"

namespace tandem::kernels {

void DequantizeF32(const uint8_t* src, float* dst, int64_t n) { std::memcpy(dst, src, sizeof(float) * n); }
void QuantizeF32(const float* src, uint8_t* dst, int64_t n) { std::memcpy(dst, src, sizeof(float) * n); }

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void StoreU16(uint16_t v, uint8_t* p) { std::memcpy(p, &v, sizeof(v)); }

}  // namespace

void DequantizeF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(LoadU16(src + 2 * i));
}

void DequantizeBF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(LoadU16(src + 2 * i));
}

void QuantizeF16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) StoreU16(Fp32ToFp16(src[i]), dst + 2 * i);
}

void QuantizeBF16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) StoreU16(Fp32ToBf16(src[i]), dst + 2 * i);
}

}  // namespace tandem::kernels
