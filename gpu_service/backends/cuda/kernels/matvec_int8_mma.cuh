// Fast mode's one-row Q8_0x8 products on the int8 tensor cores: y = W·x with x quantized per 32
// columns into two int8 terms (x ≈ s·(hi + lo/254), s = max|x| / 127: ~15 bits, the int16
// activations' precision of docs/MODEL.md §5) and W's int8 quants as they are stored.
//
// Why: the streaming kernel (matvec_stream.cuh) turns every weight byte into an f32 and multiplies
// it (~4 instructions an element); on a cold L2 the decode step's 27 MB input product took ~14.5 us
// for ~6 us of bytes with every form of its loads tried (docs/PERF.md, twenty-fourth to
// twenty-seventh sessions). One mma.m16n8k32 takes 512 weight bytes in one instruction: the
// product's issue drops ~8x and what is left is its loads.
//
// How the one activation row rides an m16n8k32 MMA: lane (g, t) loads 16 bytes of rows g and
// g + 8 at columns 16t and 64 + 16t of a 128-column chunk (four Q8_0 blocks); an MMA's k-slots of
// lane t are then block t/2 (or 2 + t/2) of the chunk, so the eight B columns separate them: column
// n takes x's term n/4 (hi, lo) of block n%4 and zeros elsewhere. Four MMAs leave C[row][n] = the
// int32 dot of the row's block n%4 with term n/4, which each lane scales by its two blocks' weight
// scale and activation scale. Sums are in a fixed order (deterministic), not the f32 kernel's.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_INT8_MMA_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_INT8_MMA_CUH_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"

namespace tandem::cuda {

// Whether the int8 MMA product takes w: Q8_0x8 with 16-byte aligned rows (Q8_0x8RowsAligned) of at
// most 2048 columns (a warp's share of a row stays in registers).
bool Int8MmaMatVecTakes(const DeviceMatrix& w);

// y (w.rows floats) = W·x for one f32 activation row x (w.cols floats, 16-byte aligned).
// cudaErrorInvalidValue where Int8MmaMatVecTakes(w) does not hold or x or y is null.
cudaError_t LaunchInt8MmaMatVec(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream);

// The norm-in form (LaunchDenseMatVecNormIn's contract: x = γ ⊙ ρ(H + y_in + g·shared) formed in
// each block, H and x not written, the inject owed to the next norm), then the int8 MMA product:
// the same bits as LaunchInjectRmsNorm followed by LaunchInt8MmaMatVec. Also needs the register norm
// kernel to take the row (DenseMatVecNormInTakes' condition on w.cols).
bool Int8MmaMatVecNormInTakes(const DeviceMatrix& w);
cudaError_t LaunchInt8MmaMatVecNormIn(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream);

// The backend's A/B switch: TANDEM_DENSE_INT8_MMA=0 (read once; settable for tests) keeps fast
// mode's one-row Q8_0x8 products on the f32 streaming kernel.
bool DenseInt8Mma();
void SetDenseInt8Mma(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_MATVEC_INT8_MMA_CUH_
