// Dense matrix-vector products for decode: y = W·x for 1..8 activation rows, with W in any type
// of DenseKernelsSupportType (Q8_0x8 included: the layout the upload gives Q8_0 products,
// device_matrix.h), dequantized on the fly, f32 activations and f32 accumulation
// (the exact mode of docs/MODEL.md §5). Decode is memory-bound: each weight byte is read once per
// launch whatever the number of activation rows.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"

namespace tandem::cuda {

inline constexpr int kMatVecMaxRows = 8;
// Configurations of the one-row Q6_K head kernel (MatVecOptions::variant 0..kMatVecHeadVariants - 1).
inline constexpr int kMatVecHeadVariants = 5;

// Which kernel a launch takes. Production passes kAuto; tests and benchmarks compare the others.
enum class MatVecKernel {
  kAuto,      // the streaming kernel (matvec_stream.cuh) for Q8_0, Q4_K, Q5_K, Q6_K and F32 where
              // its alignment and shared-memory limits hold, else as kPrevious; Q6_K matrices of
              // >= 64 MB (the LM head) take the head kernel (matvec_q6k_head.cuh) at one
              // activation row of 2048 columns, else the staged kernel (matvec_q6k_staged.cuh);
              // the environment variable TANDEM_MATVEC_GENERIC (read once) turns kAuto into kGeneric
  kPrevious,  // the dispatch before the streaming kernel: matvec_core.cuh's fast kernel for the
              // quantized types at their natural row stride, else the generic kernel
  kGeneric,   // the generic one-warp-per-row kernel, every type
  kStream,    // the streaming kernel wherever it takes the matrix (also >= 64 MB), else as kPrevious
  kStaged,    // Q6_K: the staged kernel (matvec_q6k_staged.cuh) wherever it takes the matrix (any
              // size); otherwise, and for other types, as kAuto
  kQ6Head,    // Q6_K: the one-row head kernel (matvec_q6k_head.cuh: n = 1, 2048 columns) wherever
              // it takes the product, else as kStaged
};

// Tuning overrides of the streaming kernel (0 = its own choice); other kernels ignore them.
struct MatVecOptions {
  MatVecKernel kernel = MatVecKernel::kAuto;
  int warps_per_row = 0;  // 1, 2, 4 or 8 warps split each row
  int blocks_per_sm = 0;  // grid.x = SMs · blocks_per_sm / activation-row chunks, capped by the rows
                          // (also the staged and head Q6_K kernels' grid)
  int variant = 0;        // the head kernel's configuration (matvec_q6k_head.cuh kQ6HeadConfigs;
                          // 0 = the default; benchmarks)
  // kQ6Head only (else cudaErrorInvalidValue, as where the head kernel does not take the product:
  // DenseMatVecQ6HeadTakes): the kernel writes to *y_at, read on the device after its wait,
  // instead of y (a destination a captured graph does not fix: the caller's page-locked logits).
  float* const* y_at = nullptr;
  // kQ6Head only (refused elsewhere, as y_at): the head kernel's int16 form, x quantized to int16
  // per 64 columns and summed with dp2a (matvec_q6k_head.cuh kI16; ~1e-5 of a row's Σ|w·x|): the
  // fast mode's LM head, never the exact mode's.
  bool int16_x = false;
};

// x: n rows of w.cols f32 (row t at x + t·x_stride); y: n rows of w.rows f32 (row t at
// y + t·y_stride). 1 <= n <= kMatVecMaxRows. x must be 16-byte aligned with x_stride a multiple of 4.
// y must not alias x. cudaErrorInvalidValue for an unsupported type or shape.
cudaError_t LaunchDenseMatVec(const DeviceMatrix& w, const float* x, int64_t x_stride, int n,
                              float* y, int64_t y_stride, cudaStream_t stream);

// The same with a kernel choice (cudaErrorInvalidValue also for warps_per_row not 0, 1, 2, 4, 8,
// blocks_per_sm < 0 or a variant the head kernel does not have).
cudaError_t LaunchDenseMatVec(const DeviceMatrix& w, const float* x, int64_t x_stride, int n,
                              float* y, int64_t y_stride, const MatVecOptions& options,
                              cudaStream_t stream);

// Whether the one-row Q6_K head kernel (MatVecKernel::kQ6Head) takes w at n activation rows.
bool DenseMatVecQ6HeadTakes(const DeviceMatrix& w, int n);

// The warps per row (1, 2, 4 or 8) over which a kAuto launch of the F32 matrix w at one activation
// row splits each row: the streaming kernel's own choice, which depends on w.rows. 0 when that
// launch takes another kernel (whose sums do not depend on the row count) or w is not F32. A
// launch over a taller view that starts with w's rows, with MatVecOptions::warps_per_row set to
// this (0: none), gives those rows the same bits as w's own kAuto launch (the MoE stage's router
// product with the shared expert's gate row after it).
int DenseMatVecF32WarpsPerRow(const DeviceMatrix& w);

// A product whose rows the kernel after it may read as they are written, before the product's grid
// completes (the GDN layer's fused kernel, gdn_decode_fused.cuh GdnDecodeFusedArgs::rows_polled):
// the caller fills y with kRowUnwrittenBits words before the launch; the blocks walk their row
// groups from the one holding first_row (the order of the groups only: every row sums as without it,
// the same bits) and store each row once with a device-scope relaxed store, so that a reader that
// polls a row until its bits differ from kRowUnwrittenBits reads its value. No row a product writes
// has those bits (a NaN with every payload bit set; the GPU's arithmetic NaN is 0x7FFFFFFF). Why
// not a counter of written rows: its release add waits for every load the writing thread has in
// flight, the next row group's among them (1% slower end to end, docs/PERF.md "Thirty-sixth
// session").
inline constexpr uint32_t kRowUnwrittenBits = 0xFFFFFFFFu;
struct RowsPolled {
  bool on = false;
  int64_t first_row = 0;  // in [0, w.rows)
};

// A one-row product that forms its input itself: y = W·x with x = γ ⊙ ρ(H + y_in + g·shared), the
// block input that LaunchInjectRmsNorm (one stream, no inject weights) would write, with the same
// bits, but neither H nor x is written: every block of the product forms x from H, y_in and the
// shared term in its own shared memory. The norm's launch (~2 us of a decode layer's chain of
// dependent launches on the H200) is saved; the caller owes H its inject: the next norm adds it
// (norm_streams.cuh EarlierInject), and nothing may write y_in or the shared term before then.
// h_written_earlier as LaunchInjectRmsNorm's: H is read before the PDL wait.
struct MatVecNormIn {
  const float* H = nullptr;      // one row of w.cols floats
  const float* y = nullptr;      // the pending inject (w.cols floats), or nullptr: none
  PendingShared sh;              // y's shared term, or none
  const float* gamma = nullptr;  // w.cols floats
  float eps = 0.0f;
  bool h_written_earlier = false;
  RowsPolled polled;             // off by default
};

// Whether LaunchDenseMatVecNormIn takes w: Q8_0x8 that the streaming kernel takes, whose row
// (w.cols) the register norm kernel takes, and whose four staged rows fit its shared memory
// (w.cols <= 3584: h 2048 and the test presets' widths).
bool DenseMatVecNormInTakes(const DeviceMatrix& w);

// y (w.rows floats) = W·x as above. cudaErrorInvalidValue where DenseMatVecNormInTakes(w) does not
// hold, for a null H or gamma, for a shared term without y_in, or for polled rows (in.polled) whose
// first row lies outside w's rows.
cudaError_t LaunchDenseMatVecNormIn(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream);

// On by default (+1.5% batch-1 decode on q3n-80b shapes on an H100, ahead in each of four
// interleaved rounds, docs/PERF.md "Sixty-fifth session"); TANDEM_NORM_IN_LEAN=0 (read once;
// settable; read at launch) turns it off: LaunchDenseMatVecNormIn over a matrix of kNormInLeanCols
// columns (the 80B's h: its GDN and attention input products at one token) takes a kernel with that
// width compiled in (33.5 KB of machine code against 47.0 KB, 128 registers either way); the same
// arithmetic, the same bits. NormInLeanLaunches counts those launches (tests).
inline constexpr int kNormInLeanCols = 2048;
bool NormInLean();
void SetNormInLean(bool on);
uint64_t NormInLeanLaunches();

// The backend's A/B switch for the norm-in product (CudaBackend's MixerNormInProduct):
// TANDEM_MIXER_NORM_LAUNCH=1 (read once; settable for tests) keeps the norm's own launch.
bool MixerNormLaunch();
void SetMixerNormLaunch(bool on);

// The backend's A/B switch for the fast mode's LM head (EnqueueHead): the head kernel's int16 form
// (MatVecOptions::int16_x) unless TANDEM_HEAD_INT16=0 (read once; settable for tests). The exact
// mode's head is always the f32 form.
bool HeadInt16();
void SetHeadInt16(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_CUH_
