// Per-type row kernels behind DequantizeRow / QuantizeRow (weight_types.h). Internal to
// tandem_weights: row_dispatch.cc picks one by WeightType. Every function takes a whole number of
// blocks (n elements, n a multiple of the type's block size) and reads or writes exactly
// RowBytes(type, n) bytes; byte buffers need no alignment (blocks are copied through locals).
#ifndef TANDEM_COMMON_WEIGHTS_ROW_KERNELS_H_
#define TANDEM_COMMON_WEIGHTS_ROW_KERNELS_H_

#include <cstdint>

namespace tandem::kernels {

void DequantizeF32(const uint8_t* src, float* dst, int64_t n);
void DequantizeF16(const uint8_t* src, float* dst, int64_t n);
void DequantizeBF16(const uint8_t* src, float* dst, int64_t n);
void QuantizeF32(const float* src, uint8_t* dst, int64_t n);
void QuantizeF16(const float* src, uint8_t* dst, int64_t n);
void QuantizeBF16(const float* src, uint8_t* dst, int64_t n);

void DequantizeQ4_0(const uint8_t* src, float* dst, int64_t n);
void DequantizeQ8_0(const uint8_t* src, float* dst, int64_t n);
void QuantizeQ4_0(const float* src, uint8_t* dst, int64_t n);
void QuantizeQ8_0(const float* src, uint8_t* dst, int64_t n);

void DequantizeQ2_K(const uint8_t* src, float* dst, int64_t n);
void DequantizeQ3_K(const uint8_t* src, float* dst, int64_t n);
void DequantizeQ4_K(const uint8_t* src, float* dst, int64_t n);
void DequantizeQ5_K(const uint8_t* src, float* dst, int64_t n);
void DequantizeQ6_K(const uint8_t* src, float* dst, int64_t n);
void QuantizeQ2_K(const float* src, uint8_t* dst, int64_t n);
void QuantizeQ3_K(const float* src, uint8_t* dst, int64_t n);
void QuantizeQ4_K(const float* src, uint8_t* dst, int64_t n);
void QuantizeQ5_K(const float* src, uint8_t* dst, int64_t n);
void QuantizeQ6_K(const float* src, uint8_t* dst, int64_t n);

}  // namespace tandem::kernels

#endif  // TANDEM_COMMON_WEIGHTS_ROW_KERNELS_H_
