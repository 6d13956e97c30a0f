// The fused GDN decode kernel's output product (gdn_decode_fused_kernel.cuh, its kOut form): the layout of
// the output matrix's rows a block holds, and the sum of the cluster's 256 gated outputs with them
// once gathered. A thread a column: the kernel's blocks are kOutCols threads in that form. Device
// code only (include from .cu files); internal linkage, as in matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_OUT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_OUT_CUH_

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu_service/backends/cuda/cluster_barrier.cuh"
#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_parts.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/mbarrier.cuh"

namespace tandem::cuda {
namespace {

// The output product inside (kOut): a cluster of 8 blocks holds 256 gated outputs, one Q8_0x8
// super-block of every row of the output matrix (kQ8_0x8SuperBytes = 16 bytes of scales, then 8 ×
// 32 quants); block rank c takes rows [c·rows/8, (c+1)·rows/8), kMaxOutRowsPerBlock at most.
constexpr int kOutClusterBlocks = 8;
constexpr int kOutCols = kOutClusterBlocks * kGdnDecodeBlockCols;  // 256: one super-block
constexpr int kOutSuperBytes = kColumnSuperBytes;
constexpr int kMaxOutRowsPerBlock = 640;         // 170 KB of shared memory
static_assert(kOutCols == kColumnSuperCols && kOutSuperBytes % 16 == 0, "one 16-byte aligned Q8_0x8 super-block");

// Dynamic shared memory of the kOut kernel: the block's rows of the output matrix, then the
// cluster's 256 gated outputs as int16 and their 8 scales (q8x8_columns.cuh).
inline size_t OutSharedBytes(int rows_per_block) { return ColumnSharedBytes(rows_per_block); }

// The kOut kernel's output product after the gather (every block of the cluster, all threads):
// xv is the cluster's gated output of column tid, gathered from the other blocks' shared memory;
// this block arrives at the cluster barrier once xv is stored (the wait here is the matching last
// step, so that no block leaves while another may still read its shared memory). out_y[row] += the
// cluster's 256 gated outputs · the block's rows of its column super-block (out_sh, copied before
// the PDL wait). out_y is added to with atomics, so the order of the clusters' additions, and the
// last bits of out_y, are not fixed.
// kIn (kRowsApart): the rows sit at rows_sh (the freed ring, gdn_decode_in.cuh) and the gathered
// outputs at out_sh; otherwise the outputs follow the rows at out_sh. Either way the rows come by
// bulk copies completing bulk_bar (out_bulk) or by cp.async pieces.
template <bool kRowsApart = false>
__device__ __forceinline__ void OutProductSum(const GdnDecodeFusedArgs& a, float xv, uint8_t* out_sh, int rpb,
                                              unsigned rank, int tid, int lane, int warp, uint32_t bulk_bar,
                                              const uint8_t* rows_sh = nullptr) {
  int16_t* xq = reinterpret_cast<int16_t*>(out_sh + (kRowsApart ? 0 : static_cast<size_t>(rpb) * kOutSuperBytes));
  float* xscale = reinterpret_cast<float*>(xq + kOutCols);
  QuantizeColumnI16(xv, tid, lane, warp, xq, xscale);
  // This block is done with the others' shared memory (xv, gathered from it, is stored above, so
  // those loads are complete); the matching wait is the last step. Relaxed: it publishes nothing
  // (cluster_barrier.cuh: a release arrive costs a GPU-scope MEMBAR).
  ClusterArriveRelaxed();
  if (a.out_bulk) {
    mbarrier::WaitParity(bulk_bar, 0);  // the rows' bulk copies (phase 0: one use a launch)
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
  float* y = a.out_y + static_cast<int64_t>(rank) * rpb;
  const uint8_t* rows = kRowsApart ? rows_sh : out_sh;
  for (int row = tid; row < rpb; row += kOutCols) {  // a thread a column: kOutCols threads
    atomicAdd(y + row, ColumnSuperRowDot(rows + static_cast<size_t>(row) * kOutSuperBytes, xq, xscale));
  }
  ClusterWait();
}

// The kOut kernel's last part with the gather (the two-barrier form): every block's gated outputs
// are in its o_sh (rank vh % r + y·r holds columns (vh % r)·dv + 32y ..) before any is read; thread
// tid gathers the cluster's column tid, then OutProductSum.
template <bool kRowsApart = false>
__device__ __forceinline__ void OutProductPart(const GdnDecodeFusedArgs& a, float* o_sh, uint8_t* out_sh, int rpb,
                                               unsigned rank, int r, int dv, int tid, int lane, int warp,
                                               uint32_t bulk_bar, const uint8_t* rows_sh = nullptr) {
  ClusterArrive();
  ClusterWait();
  // Thread tid gathers the cluster's column tid (a warp: one Q8_0 block of 32 columns).
  const int head = tid / dv, col_block = (tid % dv) / kGdnDecodeBlockCols;
  const unsigned holder = static_cast<unsigned>(head + col_block * r);
  const float xv = cooperative_groups::this_cluster().map_shared_rank(o_sh, holder)[lane];
  OutProductSum<kRowsApart>(a, xv, out_sh, rpb, rank, tid, lane, warp, bulk_bar, rows_sh);
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_OUT_CUH_
