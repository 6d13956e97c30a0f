// One-token decode attention and its output product in one launch (fast mode, batch 1, hd 256).
//
// The split path runs an attention layer's mixer after its q/k prep as two launches: the split
// attention (132 blocks of one SM each, partials to global memory) and the column-split o product
// (dense_colsplit.cuh), which waits for the whole attention grid, merges the slices from L2 and
// only then multiplies (~12.5 us of an attention layer on q3n-80b shapes after the prep for a few KB
// of keys and 13.4 MB of o: docs/PERF.md, sixtieth session). Here the o product's own grid does
// the attention: block (h, s) attends query head h over the whole context, gates it, and multiplies
// the head's 256 outputs by its part s of o's rows of column super-block h (the column-split
// product's layout and arithmetic, q8x8_columns.cuh: x in int16, one atomic addition a row), the
// rows copied into shared memory after its PDL wait (by default) by the TMA. No grid boundary and
// no merge through global memory: ~6.4 us after the prep on an H100 (docs/PERF.md, sixty-first
// session).
//
// The head's keys are walked in registers (a warp 8 at a time, lanes holding 8 dims) by each of the
// head's blocks, so the kernel suits short contexts: the backend uses it up to kAttnOutFusedMaxKeys
// keys and the split path beyond. Not bit-identical to the split path (the keys' sums are split
// differently; f32 throughout); within 1e-4 relative L2 of it on o's output in the tests.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_OUT_FUSED_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_OUT_FUSED_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"

namespace tandem::cuda {

// The longest context (keys, the token's own included) the backend sends to the fused kernel; a
// step past it takes the split path (a graph of its own: the backend's graph key carries the side).
inline constexpr int64_t kAttnOutFusedMaxKeys = 512;

// Whether LaunchAttentionOutFused takes this shape and matrix: hd 256 (a head is one Q8_0x8
// super-block of o's columns), w Q8_0x8 with 16-byte aligned rows, nh · 256 columns, and rows that
// 8, 4, 2 or 1 parts of at most 768 rows divide (the most parts whose nh · parts blocks fit one
// block an SM on the device).
bool AttentionOutFusedFits(const AttnShape& d, const DeviceMatrix& w);

// y[r] += Σ_c w[r][c] · attn[c] for every row r of w, where attn (nh · hd values) is the gated
// attention output of one token: q (nh · hd, normed and roped, unscaled) against the cached keys
// and values of sequence token_seq[0] at positions 0 .. token_pos[0] (the token's own appended
// before this launch), times σ of the gate half of qg's row 0 (qg_stride floats a row; 0: nh · 2hd).
// Every per-step value (sequence, position, page table, q, qg, the cache) is read on the device, so
// a captured graph replays at every context. y must be zeroed (or hold the sum to add to) before.
// cudaErrorNotSupported when AttentionOutFusedFits is false; cudaErrorInvalidValue for null
// pointers or a qg_stride below nh · 2hd.
// prep (may be null): the q/k prep inside the launch instead of LaunchQkvNormRopeAppend before it
// (the same bits: q and the token's key normed and roped as the prep kernels do, the key and value
// written into the cache by one block of their kv head): rows holds token 0's raw q|gate rows (qg
// then names the same rows and q is ignored: may be null), k and v; with the norms' weights and the
// rotation's frequencies (AttnShape::rot of them used).
struct AttnOutFusedPrep {
  const float* k = nullptr;
  const float* v = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const double* inv_freq = nullptr;
};
cudaError_t LaunchAttentionOutFused(const float* q, const float* qg, int64_t qg_stride, const AttnShape& d,
                                    const int32_t* token_seq, const int32_t* token_pos, const PagedKv& cache,
                                    const DeviceMatrix& w, float* y, cudaStream_t stream,
                                    const AttnOutFusedPrep* prep = nullptr);

// Whether the backend runs the q/k prep inside the fused launch (TANDEM_ATTN_OUT_FUSED_PREP=1;
// off by default until measured; read once; settable).
bool AttnOutFusedPrepInside();
void SetAttnOutFusedPrepInside(bool on);

// Whether the backend's one-token attention layers (fast mode, o by columns) run attention and o as
// this one launch while the context is at most kAttnOutFusedMaxKeys. TANDEM_ATTN_OUT_FUSED=0 keeps
// the split attention and the column-split product (read once; settable; read when a step is
// enqueued and when its graph key is formed).
bool AttnOutFused();
void SetAttnOutFused(bool on);

// How a block brings in o's rows (TANDEM_ATTN_OUT_FUSED_ROWS, read once; settable): 0 16-byte
// cp.async pieces, 1 one bulk copy a row, 2 the TMA's 2-D boxes (the default; a tensor map of o
// encoded at the launch, boxes of up to 256 rows onto one barrier). The rows are asked for after
// the PDL wait unless TANDEM_ATTN_OUT_FUSED_LATE_ROWS=0.
int AttnOutFusedRowsMode();
void SetAttnOutFusedRowsMode(int mode);
bool AttnOutFusedLateRows();
void SetAttnOutFusedLateRows(bool on);

// Phase stamps of the fused kernel inside a probed decode step (step_probe.h: while
// ProbeDecodeStep() is on, the launch takes a stamped instantiation whose thread 0 of each block
// takes the next row of the armed buffer and writes %globaltimer at each phase). Test and benchmark
// use only.
inline constexpr int kAttnOutFusedProbeWords = 8;
enum AttnOutFusedProbeWord : int {
  kAttnOutFusedProbeEntry,        // the block holds its row
  kAttnOutFusedProbeAfterWait,    // its PDL wait returned
  kAttnOutFusedProbeAttended,     // its head attended and its warps merged
  kAttnOutFusedProbeRowsLanded,   // x quantized and o's rows landed (a block barrier)
  kAttnOutFusedProbeExit,         // thread 0's additions issued
  kAttnOutFusedProbeKeys,         // keys of the context (the count word)
  kAttnOutFusedProbeSm,
  kAttnOutFusedProbeBlock,        // blockIdx.x + gridDim.x · blockIdx.z
};
// Arms (stamps: capacity rows of kAttnOutFusedProbeWords u64, zeroed by the caller) or disarms
// (nullptr), in stream order.
cudaError_t SetArmedAttentionOutFusedProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream);

// Launches LaunchAttentionOutFused has made in this process (accepted or not): tests use it to see
// that a step took the fused path.
uint64_t AttentionOutFusedLaunches();

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_OUT_FUSED_CUH_
