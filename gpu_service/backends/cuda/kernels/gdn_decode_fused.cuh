// The middle of a GDN layer's decode step in one launch (gdn_decode_fused.cu): the causal conv of
// the token's qkv row with its history, the q/k L2 norms (q also scaled by 1/√dk), the gates g and
// β, the delta-rule recurrence over the state, and optionally the gated norm. The same bits as the
// four kernels it replaces, in order LaunchGdnConvDecode → LaunchGdnPrepare →
// LaunchGdnRecurrentDecode → LaunchGdnGatedNorm (gdn.cuh), with the same history and state
// updates. Why one launch: at batch-1 decode each of those kernels moves little (the state is
// 2 MiB a layer on q3n-80b) and costs ~2-3 us of fixed latency on the critical path; the
// CUPTI timeline (docs/PERF.md, eighth session) had the four take ~11 us a GDN layer.
//
// Grid (nv, dv/32, n) of (32, 8) threads as GdnRecurrentKernel's decode launch, in thread block
// clusters of (nv/nk, dv/32, 1): the blocks of a cluster are the value heads of one key head group
// (and all their columns), so each block can compute the conv and the norms of its group's q and k
// heads itself, and the history of those channels is rewritten once, after a cluster barrier, by
// the cluster's first block. The gated-norm variant exchanges the per-block sums of squares of a
// value head through distributed shared memory.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"

namespace tandem::cuda {

// What LaunchGdnDecodeFused reads and writes. Token t's rows: qkv + t·qkv_stride, ba + t·ba_stride
// (2nv gate inputs), z + t·z_stride (gated norm only), o + t·nv·dv; its sequence's conv history and
// state at history + rows[t]·row_stride and state + rows[t]·row_stride (rows in device memory). The
// input strides let qkv, ba and z be parts of one stacked decode product's rows (GpuLayer::mixer_in).
struct GdnDecodeFusedArgs {
  const float* qkv = nullptr;
  int64_t qkv_stride = 0;  // 0: c_dim
  const float* ba = nullptr;
  int64_t ba_stride = 0;  // 0: 2nv
  const float* taps = nullptr;
  const float* ssm_a = nullptr;
  const float* dt_bias = nullptr;
  float* history = nullptr;
  float* state = nullptr;
  int64_t row_stride = 0;
  const int32_t* rows = nullptr;
  // The gated norm (gated_norm = true): o ← norm ⊙ ρ(o_head) ⊙ SiLU(z_head), as LaunchGdnGatedNorm.
  const float* z = nullptr;
  int64_t z_stride = 0;  // 0: nv·dv
  const float* norm = nullptr;
  float eps = 0.0f;
  float* o = nullptr;  // n × nv·dv: the recurrence's output, or the gated norm's with gated_norm
  // Set by LaunchGdnDecodeFusedOut from its arguments (callers leave them).
  const uint8_t* out_w = nullptr;
  int64_t out_row_bytes = 0;     // from one row's super-block to the next row's
  int64_t out_group_bytes = 0;   // from one column super-block to the next
  int out_rows = 0;
  float* out_y = nullptr;
  bool out_bulk = false;  // the block's rows as one contiguous run by bulk copies (by columns only)
  bool out_one_barrier = false;  // set by LaunchGdnDecodeFusedOut from GdnOutOneBarrier()
  bool out_probe = false;        // set by LaunchGdnDecodeFusedOut: the stamps of gdn_decode_out_probe.h
  // LaunchGdnDecodeFusedOut only: qkv, ba and z are rows of the stacked product launched just before
  // it on the stream, polled (dense_matvec.cuh RowsPolled: kRowUnwrittenBits until written). Then
  // the kernel does not wait for the product's grid (pdl.cuh) but polls each value it reads until
  // written, so that the conv and the recurrence run while the product still writes z (the walk
  // starts past z); it waits for the product's grid only before it exits. Why: the product's blocks
  // that walk a second row group end ~6 us after the others (docs/PERF.md, thirty-fifth session's
  // probe), and the whole kernel waited for them. The same bits (the rows are the same); a value
  // unwritten for 2 s traps (no hang).
  bool rows_polled = false;
};

// Whether the fused kernel takes shape d: dk 64 or 128, dv 32, 64 or 128, nv a multiple of nk,
// nv <= 256, a cluster of (nv/nk)·(dv/32) <= 8 blocks (the portable cluster size), 1 <= kk <= 8.
bool GdnDecodeFusedFits(const GdnShape& d);

// Decode of n sequences, one token each (n <= 65535). Returns cudaErrorNotSupported, launching
// nothing, for a shape GdnDecodeFusedFits refuses (the caller runs the four kernels instead), and
// cudaErrorInvalidValue for bad arguments.
cudaError_t LaunchGdnDecodeFused(const GdnDecodeFusedArgs& a, int64_t n, const GdnShape& d, bool gated_norm,
                                 cudaStream_t stream);

// One token, the gated norm and the layer's output product too: out_y[r] += Σ_c out[r][c]·gated[c]
// for every row r of `out` (atomics: out_y must hold its start value, e.g. zeros, and the order of
// the additions is not fixed). The gated outputs are quantized to int16 with one scale per 32
// (relative error ~1e-5 a row); a.o, when set, also receives them (f32, as the gated launch).
// The conv history and the state: the same bits as LaunchGdnDecodeFused. Takes `out` when
// GdnDecodeOutFits: the shape fits the fused kernel with (nv/nk)·dv = 256 (a cluster of 8 blocks
// over one Q8_0x8 super-block of columns), out Q8_0x8 of nv·dv columns (rows 16-byte aligned) and
// rows a multiple of 8, at most 5120. Otherwise cudaErrorNotSupported, launching nothing.
// out_by_columns (may be null): the same super-blocks by columns (device_matrix.h,
// CopyQ8_0x8ByColumns; 16-byte aligned), which the kernel then reads instead of out's rows: each
// block's 70 KB (80B shapes) one contiguous run instead of 272 bytes out of each of 256 rows;
// with GdnOutBulk() that run comes by a few bulk copies (the tensor memory accelerator) instead of
// every thread's 16-byte cp.async.
bool GdnDecodeOutFits(const GdnShape& d, const DeviceMatrix& out);
// by_columns_rows (0: out.rows): the rows of the by-columns copy, out's first and then rows of its
// own (the router's rows through the output, kernels/route_compose.cuh), all of them summed into
// out_y (by_columns_rows floats); a multiple of 8, at most 5120, and only with out_by_columns.
cudaError_t LaunchGdnDecodeFusedOut(const GdnDecodeFusedArgs& a, const DeviceMatrix& out, float* out_y,
                                    const GdnShape& d, cudaStream_t stream, const void* out_by_columns = nullptr,
                                    int64_t by_columns_rows = 0);

// The whole GDN layer of a one-token step in one launch: LaunchGdnDecodeFusedOut with the layer's
// stacked input product [z; qkv; ba] computed inside (gdn_decode_in.cuh says how and why) from
// x = γ ⊙ ρ(H + y + g·shared), formed by every block as LaunchDenseMatVecNormIn forms it (neither H
// nor x written: the caller owes H its inject, as there). The product's rows go to in.rows (in.w.rows
// floats, stacked order), which the kernel then reads as z, qkv and ba (args' z, qkv and ba and their
// strides are ignored). x is quantized to int16 (one scale per 32) for the product, so its rows are
// within ~1e-5 relative of the norm-in streaming product's, not its bits.
struct GdnDecodeIn {
  DeviceMatrix w;          // [z; qkv; ba] stacked, Q8_0x8, nv·dv + c_dim + 2nv rows
  int64_t qkv_row0 = 0;    // nv·dv
  int64_t ba_row0 = 0;     // nv·dv + c_dim
  MatVecNormIn norm;       // dense_matvec.cuh
  float* rows = nullptr;   // w.rows floats
  // Diagnosis only (tests, benches; null in the backend): kInProbePhases %globaltimer stamps a block
  // (entry, PDL wait returned, x formed, first chunk landed, last chunk summed, cluster's rows ready,
  // gated outputs formed, exit), nv · dv/32 blocks' rows.
  unsigned long long* probe = nullptr;
};
inline constexpr int kInProbePhases = 8;
// Whether LaunchGdnDecodeLayer takes the shape: GdnDecodeOutFits, in_w Q8_0x8 with 16-byte aligned
// rows of at most 2048 columns and the stacked row count, and shared memory for two blocks an SM
// holds a ring of at least two slots of 8 rows whose place (with the norm's) then takes a block's
// share of the output product's rows (by_columns_rows of them: 0 for out's).
bool GdnDecodeLayerFits(const GdnShape& d, const DeviceMatrix& out, const DeviceMatrix& in_w, int64_t by_columns_rows);
// cudaErrorNotSupported where GdnDecodeLayerFits does not hold (launching nothing; the caller runs
// the product and LaunchGdnDecodeFusedOut), cudaErrorInvalidValue for bad arguments, and unless the
// output product's rows come by columns through bulk copies (out_by_columns given, GdnOutBulk()).
cudaError_t LaunchGdnDecodeLayer(const GdnDecodeFusedArgs& args, const DeviceMatrix& out, float* out_y,
                                 const GdnShape& d, const GdnDecodeIn& in, cudaStream_t stream,
                                 const void* out_by_columns, int64_t by_columns_rows = 0);
// How many clusters of the fused kernel with ssm_out inside (in_w null) or of the one-launch layer
// (in_w: its stacked input matrix) this device holds at once at these shapes (dk 128):
// cudaOccupancyMaxActiveClusters, for benches and diagnosis.
cudaError_t GdnDecodeOutMaxActiveClusters(const GdnShape& d, const DeviceMatrix& out, int64_t by_columns_rows,
                                          const DeviceMatrix* in_w, int* clusters);
// The backend's switch for it (backend/gdn_mixer.cc RunGdn, one-token fast steps where the
// stacked product would form its own norm and mode 3 holds), TANDEM_GDN_LAYER_ONE=1 (read once;
// settable; read when a step is enqueued). Off: on q3n-80b shapes it measured 462.0 against 500.1
// tok/s batch-1 decode (H200, docs/PERF.md "Thirty-third session": x formed ~5 us after the wait
// and the clusters' spread outweigh the boundary it removes).
bool GdnDecodeLayerOne();
void SetGdnDecodeLayerOne(bool on);

// The backend's switch (backend/gdn_mixer.cc RunGdn, decode steps), TANDEM_GDN_DECODE_FUSED:
//   0  the four kernels (conv, prepare, recurrence, gated norm), the path before 2026-12-01;
//   1  the fused kernel without the gated norm, launched once qkv and ba are ready (right after the
//      main stream's [qkv; ba] or stacked product; after ba's mark or the join with the separate
//      products); the gated norm after z joins;
//   2  the fused kernel with the gated norm, launched after z joins (f32 rows only: where the
//      gated norm would write f16 rows, 1);
//   3  fast-mode one-token steps where GdnDecodeOutFits: LaunchGdnDecodeFusedOut after the one
//      stacked [z; qkv; ba] product (z not on the side stream), the layer's output in a per-layer
//      buffer zeroed at the step's start; every other step as 1 (the default: +7.4% batch-1
//      decode on q3n-80b shapes against 1, docs/PERF.md "Twenty-second session");
//   4  as 3 with z's product on the side stream, joined before the kernel (measured as 1: the
//      join keeps the kernel from starting under the product before it).
// Shapes the kernel does not take run the four kernels whatever the switch. Read when a step is
// enqueued: decode graphs keep the mode they were captured with.
int GetGdnDecodeFused();
void SetGdnDecodeFused(int mode);

// The backend's switch for GdnDecodeFusedArgs::rows_polled (backend/gdn_mixer.cc RunGdn: the
// stacked norm-in product writes a row buffer of the layer's own, filled with kRowUnwrittenBits at
// the step's start, and the fused kernel with ssm_out inside reads its rows as they are written):
// on by default (+1.6% batch-1 decode on q3n-80b shapes, ahead in each of three rounds, docs/PERF.md
// "Thirty-sixth session"); TANDEM_GDN_ROWS_POLLED=0 (read once; settable; read when a step is
// enqueued) waits for the product's grid instead.
bool GdnRowsPolled();
void SetGdnRowsPolled(bool on);

// TANDEM_GDN_LEAN (0, 1 or 2; read once; settable; read at launch). 1 (+1.8% batch-1 decode on
// q3n-80b shapes on an H100 against 0, docs/PERF.md "Sixty-fourth session"): a one-token launch with
// ssm_out inside whose arguments are the defaults (one barrier, the rows polled, bulk copies, the
// state read early) takes a kernel compiled for them alone, the other forms' code left out; the same
// arithmetic. 2, the default (+1.1% against 1 on an H100, ahead in each of four interleaved rounds,
// "Sixty-fifth session"): where the shape is also the 80B's (dk kGdnLeanDk, nk, nv, dv and kk
// below), a kernel with those compiled in too (24.3 KB of machine code against 30.7 KB, 96 registers
// against 120); other shapes take level 1's kernel. 0: the general kernel.
// GdnLeanLaunches(level) counts the launches of that level's kernel (tests).
inline constexpr int kGdnLeanDk = 128;
inline constexpr int kGdnLeanNk = 16;
inline constexpr int kGdnLeanNv = 32;
inline constexpr int kGdnLeanDv = 128;
inline constexpr int kGdnLeanKk = 4;
int GdnLean();
void SetGdnLean(int level);
uint64_t GdnLeanLaunches(int level);

// The fused kernel reads its token's recurrent state column and conv history (which only it
// writes, in earlier steps) before its PDL wait, overlapping the product before it; the same
// values, the same bits. TANDEM_OLD_GDN_EARLY_STATE=1 (read once; settable; read at launch, so a
// captured graph keeps it) reads them after the wait, for A/B.
bool OldGdnEarlyState();
void SetOldGdnEarlyState(bool on);

// LaunchGdnDecodeFusedOut's gated norm and output product with one cluster barrier instead of
// two: after the barrier that shares the heads' sums of squares, every thread forms the gated
// output of the cluster column it sums in the output product (its head's sums, its raw output from
// the block that holds it, its z) instead of each block forming its own 32 and a second barrier
// before the gather. The same gated outputs (the same operations, the same bits). On by default
// (+1.0% batch-1 decode on q3n-80b shapes, ahead in each of three rounds, docs/PERF.md
// "Thirty-seventh session"); TANDEM_GDN_OUT_ONE_BARRIER=0 (read once; settable; read at launch)
// for the two barriers. The kIn form (LaunchGdnDecodeLayer) keeps two.
bool GdnOutOneBarrier();
void SetGdnOutOneBarrier(bool on);

// LaunchGdnDecodeFusedOut with out_by_columns copies each block's rows by bulk copies (the
// default: 446.0 against 434.4 tok/s batch-1 decode with the 16-byte cp.async pieces of the same
// build, docs/PERF.md "Twenty-third session"); TANDEM_GDN_OUT_BULK=0 (read once; settable; read at
// launch) for the pieces.
bool GdnOutBulk();
void SetGdnOutBulk(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_FUSED_CUH_
