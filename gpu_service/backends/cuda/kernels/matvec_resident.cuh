// Fast mode's one-row Q8_0x8 products with the weights resident in shared memory before the PDL
// wait, on the int8 tensor cores: y = W·x with x quantized per 32 columns into two int8 terms
// (x ≈ s·(hi + lo/254), s = max|x| / 127: ~15 bits, the int16 activations' precision of
// docs/MODEL.md §5) and W's int8 quants as stored.
//
// Why: inside a decode step the stacked GDN input product (27 MB) ends ~13.6 us after the MoE
// kernel before it completes, for ~6 us of bytes (gpu_backend_bench --probe-gdn-product, docs/
// PERF.md twenty-eighth session): its blocks become resident only ~1 us before that, hold 48 KB of
// weights each in registers, wait for x, and walk a second row group in half of them. Here each
// block (one an SM) asks for all of its rows at once with bulk copies into shared memory as soon as
// it is resident (up to ~210 KB: 27 MB over 129 blocks), forms x after the wait, and multiplies each
// 16-row tile as it lands; the int8 MMAs (one m16n8k32 for 512 weight bytes) keep the compute far
// below the bytes' time.
//
// The MMA form (shared with nothing else): lane (g, t) takes 16 bytes of rows g and g + 8 at
// columns 16t and 64 + 16t of a 128-column chunk (four Q8_0 blocks); an MMA's k-slots of lane t
// are then block t/2 (or 2 + t/2), so the eight B columns separate them: column n takes x's term
// n/4 (hi, lo) of block n%4 and zeros elsewhere, and C[row][n] is the int32 dot of the row's block
// n%4 with term n/4, which each lane scales by its two blocks' weight and activation scales. Sums
// are in a fixed order (deterministic, independent of the grid), not the f32 kernel's.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_RESIDENT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_RESIDENT_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"

namespace tandem::cuda {

// Whether the resident product takes w: Q8_0x8 with 16-byte aligned rows (Q8_0x8RowsAligned) of at
// most 2048 columns whose rows fit the device's shared memory at one block an SM (~27 MB at 2048
// columns on 132 SMs).
bool ResidentMatVecTakes(const DeviceMatrix& w);

// y (w.rows floats) = W·x for one f32 activation row x (w.cols floats, 16-byte aligned).
// cudaErrorInvalidValue where ResidentMatVecTakes(w) does not hold or x or y is null or misaligned.
cudaError_t LaunchResidentMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream);

// The norm-in form (LaunchDenseMatVecNormIn's contract: x = γ ⊙ ρ(H + y_in + g·shared) formed in
// each block, H and x not written, the inject owed to the next norm): the same bits as
// LaunchInjectRmsNorm followed by LaunchResidentMatVec. Also needs the register norm kernel to take
// the row (norm_row::RegSplitFor).
bool ResidentMatVecNormInTakes(const DeviceMatrix& w);
cudaError_t LaunchResidentMatVecNormIn(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream);

// The backend's A/B switch: TANDEM_RESIDENT_MATVEC=0 (read once; settable for tests) keeps fast mode's
// one-row Q8_0x8 products on the f32 streaming kernel.
bool ResidentMatVec();
void SetResidentMatVec(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_RESIDENT_CUH_
