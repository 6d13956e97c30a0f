// The column-split one-row product (dense_colsplit.cuh). Block (s, c), 256 threads: super-block s of
// every row in slice c (rows_per_block rows of 272 bytes: eight f16 scales, then 8 × 32 int8
// quants; device_matrix.h) copied into shared memory with 16-byte cp.async before the PDL wait;
// thread t then quantizes x[256s + t] (warp w: Q8_0 block w of the super-block, one int16 scale)
// and sums rows t, t + 256, ...: eight blocks of 32 a row, each a dp2a chain (int8 × int16, exact
// in int32) times its weight scale and x's scale.
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit_probe.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/kernels/attention_merge.cuh"
#include "gpu_service/backends/cuda/kernels/q8x8_columns.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSuperCols = kColumnSuperCols;
constexpr int kSuperBytes = kColumnSuperBytes;
constexpr int kMaxRowsPerBlock = 640;  // 170 KB of shared memory
constexpr int kTargetBlocks = 128;     // about one block an SM of an H200

size_t SharedBytes(int rows_per_block) { return ColumnSharedBytes(rows_per_block); }

// Row slices: the count nearest kTargetBlocks / supers that divides rows and keeps a slice within
// kMaxRowsPerBlock (0 when none does).
int RowSlices(int64_t rows, int64_t supers) {
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / supers);
  for (int64_t d = 0; d <= want; ++d) {
    for (const int64_t s : {want - d, want + d}) {
      if (s >= 1 && rows % s == 0 && rows / s <= kMaxRowsPerBlock) return static_cast<int>(s);
    }
  }
  return 0;
}

// SetArmedColumnSplitProbe's buffer and slot counter (dense_colsplit_probe.h).
__device__ ArmedStampRows g_colsplit_probe;
__device__ unsigned g_colsplit_probe_count;

// Thread 0's stamps in the kProbe instantiation (dense_colsplit_probe.h); nothing in the others.
template <bool kProbe>
struct ColSplitStamps {
  unsigned long long* row = nullptr;
  __device__ ColSplitStamps() {
    if constexpr (kProbe) {
      if (threadIdx.x == 0) row = TakeArmedRow(g_colsplit_probe, &g_colsplit_probe_count, kColSplitProbeWords);
      Stamp(kColSplitProbeEntry);
    }
  }
  __device__ void Stamp(int word) const {
    if constexpr (kProbe) {
      if (row != nullptr) row[word] = GlobalTimerNs();
    }
  }
  __device__ void StampAfter(int word, float dep) const {  // once dep is known (KnownNow)
    if constexpr (kProbe) {
      if (row != nullptr && KnownNow(dep)) row[word] = GlobalTimerNs();
    }
  }
  __device__ void Facts(bool merged) const {
    if constexpr (kProbe) {
      if (row == nullptr) return;
      const unsigned smid = SmId();
      row[kColSplitProbeMerged] = merged ? 1u : 0u;
      row[kColSplitProbeSm] = smid;
      row[kColSplitProbeBlock] = blockIdx.x + static_cast<unsigned long long>(gridDim.x) * blockIdx.y;
    }
  }
};

// kMergeHd > 0: x's super-block s holds attention heads s·kHeads .. (256 / kMergeHd of them), merged
// here from the split attention's slices (AttnDeferredMerge) unless the context was short enough
// for the split kernel to write them.
// The merging forms are bound to one block an SM so that ptxas keeps a batch of slice loads in
// registers (MergeSliceRow's eight float4s; 41 registers without the bound issued them two or three
// at a time); the product's blocks are one an SM anyway (70 KB of weights each).
// kProbe: dense_colsplit_probe.h's stamped instantiation (thread 0's row of the armed buffer).
template <int kMergeHd, bool kProbe = false>
__global__ void __launch_bounds__(kThreads, kMergeHd > 0 ? 1 : 0)
ColumnSplitKernel(const uint8_t* __restrict__ w, int64_t row_bytes, int rows_per_block, const float* __restrict__ x,
                  float* __restrict__ y, AttnDeferredMerge m) {
  extern __shared__ __align__(16) uint8_t sh[];
  const ColSplitStamps<kProbe> stamps;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int super = blockIdx.x, row0 = blockIdx.y * rows_per_block;
  // The weights first (constants: before the wait, overlapping the kernels before).
  const uint8_t* src = w + static_cast<int64_t>(row0) * row_bytes + static_cast<int64_t>(super) * kSuperBytes;
  CopyColumnRows<kThreads>(static_cast<uint32_t>(__cvta_generic_to_shared(sh)), src, row_bytes, rows_per_block, tid);
  stamps.Stamp(kColSplitProbeIssued);
  // The merge's inputs that are not the split kernel's: the item and its positions (the host's,
  // before the step) and the heads' gate values (the q product's, three or more launches back).
  constexpr int kHeads = kMergeHd > 0 ? kSuperCols / kMergeHd : 1;
  bool merge = false;
  int32_t first = 0;
  float4 gate[kHeads];
  if constexpr (kMergeHd > 0) {
    const int32_t count = m.items[1];
    first = m.items[0];
    merge = static_cast<int64_t>(m.token_pos[first + count - 1]) + 1 > m.short_keys;
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      gate[h] = merge && tid < kMergeHd / 4 ? LoadGate<kMergeHd>(m.qg, m.qg_stride, first, super * kHeads + h, tid)
                                            : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  PdlWaitForPrevious();  // pdl.cuh
  PdlAllowNext();
  stamps.Stamp(kColSplitProbeAfterWait);
  int16_t* xq = reinterpret_cast<int16_t*>(sh + static_cast<size_t>(rows_per_block) * kSuperBytes);
  float* xscale = reinterpret_cast<float*>(xq + kSuperCols);
  float xv;
  if constexpr (kMergeHd > 0) {
    __shared__ MergeShared msh;
    __shared__ __align__(16) float merged[kSuperCols];
    if (merge) {
      const int groups = m.nh / m.kvh;
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        const int head = super * kHeads + h;
        if (h > 0) __syncthreads();  // the last merge's reads of msh are done
        MergeSliceRow<kMergeHd, true>(static_cast<int64_t>(head / groups) * m.splits, head % groups, m.splits, m.part_o,
                                      m.part_ml, gate[h], merged + h * kMergeHd, msh);
      }
      __syncthreads();
      xv = merged[tid];
    } else {
      xv = x[static_cast<int64_t>(super) * kSuperCols + tid];
    }
  } else {
    xv = x[static_cast<int64_t>(super) * kSuperCols + tid];
  }
  stamps.StampAfter(kColSplitProbeXFormed, xv);
  QuantizeColumnI16(xv, tid, lane, warp, xq, xscale);
  CpAsyncWait<0>();
  __syncthreads();
  stamps.Stamp(kColSplitProbeRowsLanded);
  for (int row = tid; row < rows_per_block; row += kThreads) {
    const float acc = ColumnSuperRowDot(sh + static_cast<size_t>(row) * kSuperBytes, xq, xscale);
    atomicAdd(y + row0 + row, acc);
  }
  if constexpr (kProbe) {
    __syncthreads();  // every thread's additions issued
    stamps.Stamp(kColSplitProbeExit);
    stamps.Facts(merge);
  }
}

ProcessSwitch g_attn_out_column_split{[] { return EnvSwitchDefaultOn("TANDEM_ATTN_OUT_COLSPLIT"); }};

}  // namespace

bool ColumnSplitMatVecFits(const DeviceMatrix& w) {
  return Q8_0x8RowsAligned(w) && w.rows > 0 && w.cols / kSuperCols <= 65535 && RowSlices(w.rows, w.cols / kSuperCols) > 0;
}

cudaError_t LaunchColumnSplitMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream,
                                    const AttnDeferredMerge* merge) {
  if (!ColumnSplitMatVecFits(w)) return cudaErrorNotSupported;
  if (x == nullptr || y == nullptr) return cudaErrorInvalidValue;
  const bool merging = merge != nullptr && merge->splits > 0;
  // The merged heads' width: o's columns over the query heads, one or two heads a super-block.
  const int64_t hd = merging && merge->nh > 0 ? w.cols / merge->nh : 0;
  if (merging && (merge->qg == nullptr || merge->items == nullptr || merge->token_pos == nullptr ||
                  merge->part_o == nullptr || merge->part_ml == nullptr || merge->nh <= 0 || merge->kvh <= 0 ||
                  merge->nh % merge->kvh != 0 || merge->splits > kMaxSplits || hd * merge->nh != w.cols ||
                  !AttnMergeableHd(hd))) {
    return cudaErrorInvalidValue;
  }
  // The stamped instantiations while the step is probed (dense_colsplit_probe.h).
  const bool stamped = ProbeDecodeStep();
  using Kernel = void (*)(const uint8_t*, int64_t, int, const float*, float*, AttnDeferredMerge);
  static const Kernel kernels[2][3] = {{ColumnSplitKernel<0>, ColumnSplitKernel<128>, ColumnSplitKernel<256>},
                                       {ColumnSplitKernel<0, true>, ColumnSplitKernel<128, true>,
                                        ColumnSplitKernel<256, true>}};
  auto raise = [](Kernel k) {
    return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(SharedBytes(kMaxRowsPerBlock)));
  };
  static const cudaError_t attr[2][3] = {{raise(kernels[0][0]), raise(kernels[0][1]), raise(kernels[0][2])},
                                         {raise(kernels[1][0]), raise(kernels[1][1]), raise(kernels[1][2])}};
  const int form = !merging ? 0 : hd == 128 ? 1 : 2;
  const Kernel kernel = kernels[stamped ? 1 : 0][form];
  const cudaError_t set = attr[stamped ? 1 : 0][form];
  if (set != cudaSuccess) return set;
  const int64_t supers = w.cols / kSuperCols;
  const int slices = RowSlices(w.rows, supers);
  const int rpb = static_cast<int>(w.rows / slices);
  return LaunchPdl(kernel, dim3(static_cast<unsigned>(supers), static_cast<unsigned>(slices)), kThreads,
                   SharedBytes(rpb), stream, static_cast<const uint8_t*>(w.data), w.row_bytes, rpb, x, y,
                   merging ? *merge : AttnDeferredMerge{});
}

cudaError_t CopyQ8_0x8ByColumns(const DeviceMatrix& m, void* dst, cudaStream_t stream, int64_t total_rows) {
  if (total_rows == 0) total_rows = m.rows;
  if (!Q8_0x8RowsAligned(m) || dst == nullptr || reinterpret_cast<uintptr_t>(dst) % 16 != 0 || total_rows < m.rows) {
    return cudaErrorInvalidValue;
  }
  const int64_t supers = m.cols / kSuperCols;
  const uint8_t* src = static_cast<const uint8_t*>(m.data);
  for (int64_t j = 0; j < supers; ++j) {
    const cudaError_t err =
        cudaMemcpy2DAsync(static_cast<uint8_t*>(dst) + j * total_rows * kQ8_0x8SuperBytes, kQ8_0x8SuperBytes,
                          src + j * kQ8_0x8SuperBytes, static_cast<size_t>(m.row_bytes), kQ8_0x8SuperBytes,
                          static_cast<size_t>(m.rows), cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t SetArmedColumnSplitProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(g_colsplit_probe, g_colsplit_probe_count, stamps, capacity, stream);
}

bool AttnOutColumnSplit() { return g_attn_out_column_split.on(); }
void SetAttnOutColumnSplit(bool on) { g_attn_out_column_split.set(on); }

}  // namespace tandem::cuda
