// y += W·x for one activation row, split by W's columns instead of its rows (dense_colsplit.cu):
// block (s, c) takes Q8_0x8 super-block s of W's columns (256) for row slice c, copies those rows'
// super-blocks into shared memory before its PDL wait, and after it reads only x's 256 values of
// that super-block, quantizes them to int16 (one scale per 32), sums with dp2a and adds its rows'
// partial sums into y with atomics. Why: a mixer's output product (attention's o, 4096 → 2048 at
// 80B shapes) follows kernels that hold few SMs' registers but many SMs' time; a row-split
// product's blocks can start only their first ring of weights before the wait and then stream the
// rest behind x's staging, while this kernel's blocks hold all of the matrix (8.9 MB over 128
// blocks of 70 KB) by the time x is written, and each needs 1 KB of x, not 16 KB.
//
// y must hold its start value (e.g. zeros: the backend zeroes the step's per-layer rows), and the
// order of the blocks' additions, so the last bits of y, is not fixed (fast mode only).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_COLSPLIT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_COLSPLIT_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"

namespace tandem::cuda {

// Whether LaunchColumnSplitMatVec takes w: Q8_0x8 (cols a multiple of 256, data and row stride
// 16-byte aligned), and a row split giving about 128 blocks of at most 640 rows each.
bool ColumnSplitMatVecFits(const DeviceMatrix& w);

// y[r] += Σ_c w[r][c]·x[c] (x: w.cols floats, y: w.rows floats, both written by kernels before
// this one on the stream: read after the PDL wait). cudaErrorNotSupported, launching nothing, when
// ColumnSplitMatVecFits(w) is false; cudaErrorInvalidValue for null x or y.
// merge (may be null; used when merge->splits > 0): x is attention's output o whose slices
// LaunchAttention left unmerged (AttnDeferredMerge, launched just before this): the blocks of
// super-block s merge head s's slices themselves, with SplitMergeKernel's operations (so x's values
// have the merge kernel's bits), or read o where the context was short. One launch fewer than the
// merge kernel then this product. cudaErrorInvalidValue for a merge missing a pointer, with more
// than the split kernel's slices, or whose heads are not w's column super-blocks.
cudaError_t LaunchColumnSplitMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream,
                                    const AttnDeferredMerge* merge = nullptr);

// dst ← m's super-blocks by columns (device_matrix.h: Q8_0x8ByColumnsBytes(m.rows, m.cols) bytes,
// 16-byte aligned, not overlapping m), one strided device-to-device copy per column super-block on
// `stream`. cudaErrorInvalidValue unless Q8_0x8RowsAligned(m) and dst is 16-byte aligned.
// total_rows (0: m.rows): the rows of the by-columns copy dst holds, at least m.rows; m's rows are
// its first ones (super-block j of row r at (j·total_rows + r)·272), the rest left as they are (the
// router rows appended by route_compose.cuh).
cudaError_t CopyQ8_0x8ByColumns(const DeviceMatrix& m, void* dst, cudaStream_t stream, int64_t total_rows = 0);

// The backend's switch (backend/attention_mixer.cc RunAttention): attention's output product of a
// fast-mode one-token step through LaunchColumnSplitMatVec into the layer's row of the per-layer
// output buffer, instead of the row-split matvec into y. TANDEM_ATTN_OUT_COLSPLIT=0 turns it off
// (read once; settable; read when a step is enqueued).
bool AttnOutColumnSplit();
void SetAttnOutColumnSplit(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_COLSPLIT_CUH_
