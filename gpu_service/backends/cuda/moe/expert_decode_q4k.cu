// The Q4_K tile kernel of expert_decode_q4k.cuh (geometry and decode described there).
//
// Block: kWarps (2, 4 or 8) warps of one unit (blockIdx.y) and a tile of kWarps × steps × rows-per-step output
// rows (blockIdx.x). Shared memory: [weights: warp, step, matrix, row bytes][activations: kR rows,
// padded super-blocks][Σx: kR rows × nsb × 8 sub-blocks]. A unit with more than kR rows is done in
// passes of kR rows over the same weights in shared memory (weights cross DRAM once).
#include "gpu_service/backends/cuda/moe/expert_decode_q4k.cuh"

#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/moe/q4k_dot.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/smem_limit.h"

namespace tandem::cuda {
namespace {

using q4k::ByteAsFloat;
using q4k::CpAsync16;
using q4k::DotSuperBlock;
using q4k::kSbBytes;
using q4k::kXSbStride;
using q4k::SiluQ4K;

constexpr int kMaxSteps = 4;        // cp.async groups a warp may have outstanding
// Waits until at most `pending` (0 .. kMaxSteps - 1) of this thread's groups are in flight.
__device__ __forceinline__ void CpAsyncWaitRuntime(int pending) {
  switch (pending) {
    case 0: CpAsyncWait<0>(); break;
    case 1: CpAsyncWait<1>(); break;
    case 2: CpAsyncWait<2>(); break;
    default: CpAsyncWait<3>(); break;
  }
}

template <int kR, bool kFused, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) Q4KTileKernel(const ExpertUnit* units, int cols, int out_rows, int steps,
                                                          const float* in, float* out, const int* device_num_units) {
  constexpr int kMats = kFused ? 2 : 1;
  extern __shared__ __align__(16) uint8_t smem[];
  const int nsb = cols >> 8;
  const int row_bytes = nsb * kSbBytes;
  const int rps = 32 / nsb;  // rows per warp step
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rho = lane / nsb, sb = lane - rho * nsb;  // the lane's row in a step, its super-block
  const int mat_bytes = rps * row_bytes;               // one step of one matrix
  uint8_t* wsm = smem + warp * steps * kMats * mat_bytes;
  float* xs = reinterpret_cast<float*>(smem + kWarps * steps * kMats * mat_bytes);
  const int xstride = nsb * kXSbStride;
  float* sxs = xs + kR * xstride;
  const int sxstride = nsb * 8;
  const int row0 = (blockIdx.x * kWarps + warp) * steps * rps;

  // Everything below reads step data (the unit list and its count come from the previous kernel).
  PdlWaitForPrevious();
  PdlAllowNext();
  const ExpertUnit* u = units + blockIdx.y;
  const int rows = min(u->rows, kMaxUnitRows);
  const int first = u->first_slot;
  const uint8_t* w0 = static_cast<const uint8_t*>(kFused ? u->gate : u->down);
  const uint8_t* w1 = kFused ? static_cast<const uint8_t*>(u->up) : nullptr;
  if (device_num_units != nullptr && static_cast<int>(blockIdx.y) >= *device_num_units) return;

  // Every raw byte of the warp's rows, one cp.async group per step (both matrices).
  for (int t = 0; t < steps; ++t) {
    const int r0 = row0 + t * rps;
    const int nrows = min(rps, out_rows - r0);
    const int chunks = nrows > 0 ? nrows * row_bytes / 16 : 0;
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      const uint8_t* src = (m == 0 ? w0 : w1) + static_cast<int64_t>(r0) * row_bytes;
      uint8_t* dst = wsm + (t * kMats + m) * mat_bytes;
      for (int c = lane; c < chunks; c += 32) CpAsync16(dst + 16 * c, src + 16 * c);
    }
    CpAsyncCommit();
  }

  const int quads = cols >> 2;
  for (int p0 = 0; p0 < rows; p0 += kR) {
    const int nr = min(kR, rows - p0);
    if (p0 > 0) __syncthreads();  // the previous pass has finished reading xs / sxs
    for (int r = 0; r < nr; ++r) {
      const int src = kFused ? u->input_row[p0 + r] : first + p0 + r;
      const float4* xr = reinterpret_cast<const float4*>(in + static_cast<int64_t>(src) * cols);
      for (int qd = threadIdx.x; qd < quads; qd += kWarps * 32) {
        const int e = 4 * qd;
        *reinterpret_cast<float4*>(xs + r * xstride + (e >> 8) * kXSbStride + (e & 255)) = xr[qd];
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nr * sxstride; i += kWarps * 32) {
      const int r = i / sxstride, k = i - r * sxstride;  // k = super-block · 8 + sub-block
      sxs[i] = q4k::StagedSubBlockSum(xs + r * xstride, k);
    }
    __syncthreads();
    for (int t = 0; t < steps; ++t) {
      if (row0 + t * rps >= out_rows) break;  // warp-uniform: no rows left (nothing was copied)
      if (p0 == 0) {
        CpAsyncWaitRuntime(steps - 1 - t);
        __syncwarp();  // the other lanes' copies of this step are visible
      }
      const int row = row0 + t * rps + rho;
      const bool valid = rho < rps && row < out_rows;
      float acc[kMats][kR];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
#pragma unroll
        for (int r = 0; r < kR; ++r) acc[m][r] = 0.0f;
      }
      if (valid) {
        const uint8_t* wsb[kMats];
#pragma unroll
        for (int m = 0; m < kMats; ++m) wsb[m] = wsm + (t * kMats + m) * mat_bytes + rho * row_bytes + sb * kSbBytes;
        DotSuperBlock<kR, kMats>(wsb, xs + sb * kXSbStride, xstride, sxs + sb * 8, sxstride, nr, acc);
      }
      // Sum over the nsb lanes of a row (consecutive lanes; nsb need not be a power of two): lane
      // sb = 0 of the row ends with the total.
      for (int off = 1; off < nsb; off <<= 1) {
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            const float o = __shfl_down_sync(0xFFFFFFFFu, acc[m][r], off);
            if (sb + off < nsb) acc[m][r] += o;
          }
        }
      }
      if (valid && sb == 0) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          if (r < nr) {
            const float v = kFused ? SiluQ4K(acc[0][r]) * acc[kMats - 1][r] : acc[0][r];
            out[static_cast<int64_t>(first + p0 + r) * out_rows + row] = v;
          }
        }
      }
    }
  }
  CpAsyncWait<0>();  // nothing may be left in flight at exit (a unit without rows skips the loop)
}

template <int kR, bool kFused, int kWarps>
cudaError_t LaunchTiles(const ExpertUnit* units, int num_units, int cols, int out_rows, const float* in, float* out,
                        cudaStream_t stream, const int* device_num_units, int steps) {
  constexpr int kMats = kFused ? 2 : 1;
  const int nsb = cols / 256;
  const int rps = 32 / nsb;
  // Default: one step per warp. More steps share each block's activation staging over more rows
  // but hold more shared memory per block (fewer blocks per SM): slower at every size measured
  // (PERF_NOTES.md). A forced count is cut to what fits the opt-in shared memory (227 KB).
  if (steps <= 0) steps = 1;
  steps = steps > kMaxSteps ? kMaxSteps : steps;
  const auto smem_for = [&](int s) {
    return static_cast<size_t>(kWarps) * s * kMats * rps * nsb * kSbBytes +
           static_cast<size_t>(kR) * nsb * (kXSbStride + 8) * sizeof(float);
  };
  while (steps > 1 && smem_for(steps) > 227 * 1024) --steps;
  const size_t smem = smem_for(steps);
  auto kernel = Q4KTileKernel<kR, kFused, kWarps>;
  static std::atomic<size_t> raised{48 * 1024};
  if (const cudaError_t err = RaiseDynamicSmemLimit(kernel, smem, raised); err != cudaSuccess) return err;
  const int rows_per_block = kWarps * steps * rps;
  const dim3 grid(static_cast<unsigned>((out_rows + rows_per_block - 1) / rows_per_block),
                  static_cast<unsigned>(num_units));
  return LaunchPdl(kernel, grid, dim3(kWarps * 32), smem, stream, units, cols, out_rows, steps, in, out,
                   device_num_units);
}


template <int kWarps>
cudaError_t LaunchTilesWarps(bool fused, const ExpertUnit* units, int num_units, int max_rows, int cols, int out_rows,
                             const float* in, float* out, cudaStream_t stream, const int* device_num_units,
                             int steps_per_warp) {
  // One activation row per pass for one-row launches (the batch-1 shape), else two: most units of
  // a multi-token step still carry one or two rows.
#define TANDEM_Q4K_TILES(R, F) \
  LaunchTiles<R, F, kWarps>(units, num_units, cols, out_rows, in, out, stream, device_num_units, steps_per_warp)
  if (max_rows == 1) return fused ? TANDEM_Q4K_TILES(1, true) : TANDEM_Q4K_TILES(1, false);
  return fused ? TANDEM_Q4K_TILES(2, true) : TANDEM_Q4K_TILES(2, false);
#undef TANDEM_Q4K_TILES
}

}  // namespace

bool Q4KTilesFit(int cols) { return cols >= 256 && cols % 256 == 0 && cols / 256 <= 32; }

cudaError_t LaunchQ4KTiles(bool fused, const ExpertUnit* units, int num_units, int max_rows, int cols, int out_rows,
                           const float* in, float* out, cudaStream_t stream, const int* device_num_units,
                           int steps_per_warp, int warps) {
  if (num_units <= 0) return cudaSuccess;
  if (max_rows < 1 || max_rows > kMaxUnitRows || out_rows < 1 || !Q4KTilesFit(cols)) return cudaErrorInvalidValue;
  if (warps <= 0) {
    // 4 warps while the launch is about one wave of 4-warp blocks (132 SMs × 4 resident), else 8:
    // measured 2026-12-01 (PERF_NOTES.md): at n = 1 4 warps 13.8 us, 8 warps 15.3 us (gate/up +
    // down); at n = 32 4 warps 231.6 us, 8 warps 221.5 us.
    const int rps = 32 / (cols / 256);
    const int64_t blocks4 = static_cast<int64_t>(num_units) * ((out_rows + 4 * rps - 1) / (4 * rps));
    warps = blocks4 > 132 * 4 ? 8 : 4;
  }
  switch (warps) {
    case 2: return LaunchTilesWarps<2>(fused, units, num_units, max_rows, cols, out_rows, in, out, stream,
                                       device_num_units, steps_per_warp);
    case 4: return LaunchTilesWarps<4>(fused, units, num_units, max_rows, cols, out_rows, in, out, stream,
                                       device_num_units, steps_per_warp);
    case 8: return LaunchTilesWarps<8>(fused, units, num_units, max_rows, cols, out_rows, in, out, stream,
                                       device_num_units, steps_per_warp);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tandem::cuda
