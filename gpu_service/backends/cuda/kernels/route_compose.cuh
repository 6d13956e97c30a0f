// The router's logits through a mixer's output product (fast-mode one-token decode): the rows the
// upload appends to the fused GDN kernel's output product (gdn_decode_fused.cuh), so that the
// layer's routing logits are ready when its mixer ends instead of one router product after it.
//
// Why: the MoE layer's router product reads x = γ ⊙ ρ·(H' + y), where H' is the residual stream
// before the mixer's output y = W_out·g (g: the mixer's gated outputs). Its logits are
//   l_r = ρ·(Σ_j Wr[r][j]·γ[j]·H'[j] + Σ_c M[r][c]·g[c]),   M = Wr·diag(γ)·W_out,
// the first sum known before the mixer runs (H' is complete once the MoE before it is) and the
// second a product over the same g the output product reads. With M's rows appended to W_out's,
// the fused GDN kernel computes both output products in one pass; the ffn norm then forms l from
// the parts (norm_streams.cuh NormRoute) and the fused MoE kernel starts from ready logits. On
// the H200 timeline the router product and its hand-off took ~3.6 us of each MoE layer's ~20
// (docs/PERF.md, twenty-fifth and twenty-sixth sessions).
//
// M is stored as two Q8_0x8 terms so that the int8 × int16 product keeps ~16 bits: row r scaled by
// S_r = 2^-e (e: the exponent of its largest |value|, so that the scaled row lies in (-1, 1)),
// hi = Q8_0(S_r·M_r), lo = Q8_0(256·(S_r·M_r − hi)); then M_r ≈ (hi + lo / 256) / S_r, within
// ~2e-5 of the row's largest value (the lo term's rounding; f16 scales).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ROUTE_COMPOSE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ROUTE_COMPOSE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// The factor of the lo term (M_r ≈ (hi + lo · kRouteLoScale) / S_r).
inline constexpr float kRouteLoScale = 1.0f / 256.0f;

// Rows the appended terms take for R router rows: each term padded to a multiple of 8 (the fused
// kernel's cluster splits its rows in eight).
inline constexpr int64_t RoutePaddedRows(int64_t R) { return (R + 7) / 8 * 8; }
// The rows of an output matrix of out_rows rows with the two terms of R router rows after them
// (out_rows when R is 0: none).
inline constexpr int64_t RouteOutRows(int64_t out_rows, int64_t R) {
  return out_rows + (R > 0 ? 2 * RoutePaddedRows(R) : 0);
}

// Where ComposeRouteRows writes the two terms: super-block g of destination row q at
// data + q·row_bytes + g·group_bytes, hi at rows first_row + r, lo at first_row + RoutePaddedRows(R)
// + r. A by-columns copy of `total` rows (device_matrix.h) has row_bytes 272 and group_bytes
// total·272; Q8_0x8 rows (the matrix's own rows, the terms placed right after them) row_bytes
// the row stride and group_bytes 272.
struct RouteRowsTarget {
  void* data = nullptr;
  int64_t row_bytes = 0;
  int64_t group_bytes = 0;
  int64_t first_row = 0;
};

// Writes the two terms of M = wr_gamma · out (wr_gamma: R × out.rows f32 on the device, row-major;
// out: Q8_0x8 rows on the device, out.rows × out.cols) into `to` (padding rows zero), and 1 / S_r
// into inv_scale[r] (RoutePaddedRows(R) floats; 0 for padding rows). Nothing else of `to` is
// touched. Uses `scratch` (R × out.cols floats) for M. Runs on `stream`; load-time work (not a
// decode kernel). cudaErrorInvalidValue unless out is Q8_0x8 with 16-byte aligned rows and every
// pointer is set.
cudaError_t ComposeRouteRows(const float* wr_gamma, int64_t R, const DeviceMatrix& out, const RouteRowsTarget& to,
                             float* inv_scale, float* scratch, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ROUTE_COMPOSE_CUH_
