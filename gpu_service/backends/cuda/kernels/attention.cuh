// Gated full attention on the GPU (docs/MODEL.md §4.5, dense form): q/k RMS norm with partial NeoX
// RoPE, K/V append into a paged cache, and flash-style attention with the σ(gate) output gate
// for decode and prefill alike. The projections (attn_q/k/v, attn_output) are dense products.
//
// The paged cache: K and V pools of f32, page p holding positions [64·i, 64·i + 64) of whichever
// sequence maps logical page i to p; position j of that page at (p·64 + j)·kv_width. A sequence's
// page table is a row of `page_table` (row stride max_pages). Per token of a step the caller gives
// the sequence's page-table row (token_seq) and the position (token_pos); the tokens of one
// sequence are consecutive in the step and in increasing position.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::cuda {

inline constexpr int kKvPageSize = 64;

struct AttnShape {
  int nh = 0, kvh = 0, hd = 0, rot = 0;
  float eps = 1e-6f;
  int kv_width() const { return kvh * hd; }
};

struct PagedKv {
  float* k = nullptr;                 // pages × 64 × kv_width
  float* v = nullptr;                 // pages × 64 × kv_width
  const int32_t* page_table = nullptr;  // sequences × max_pages physical page ids
  int max_pages = 0;
  // Optional f16 tile scratch of the hd-256 wgmma prefill (AttnKv16(); at least
  // AttnKv16ScratchBytes(d, pages) bytes for physical pages 0 .. pages - 1, 16-byte aligned; one
  // buffer may serve every layer: each attention call rewrites the tiles it reads). Null: the
  // kernel stages and converts the f32 tiles itself.
  void* f16_tiles = nullptr;
};

// The RoPE inverse frequencies θ^(−2i/rot), i < rot/2, computed in f64 on the host exactly as the
// CPU reference does; upload them once per model.
std::vector<double> RopeInvFrequencies(double theta, int rot);

// Queries: for every token t and head h, q_out[t][h] = RoPE_pos(q_norm ⊙ ρ(qg[t][h][0:hd])), with
// qg laid out n × nh × 2hd (per head hd query values then hd gate values, as attn_q writes them).
// inv_freq holds rot/2 doubles in device memory. hd <= 1024. qg_stride: the floats from one token's
// qg row to the next, >= nh·2hd (0: nh·2hd), so that qg can be a part of the rows of one stacked
// decode product ([q | k | v] per token, GpuLayer::mixer_in).
cudaError_t LaunchQueryNormRope(const float* qg, int64_t n, const AttnShape& d, const float* q_norm,
                                const double* inv_freq, const int32_t* token_pos, float* q_out,
                                cudaStream_t stream, int64_t qg_stride = 0);

// Which kernel LaunchQueryNormRope runs: by default, for hd in {32, 64, 128, 256} and rot a
// multiple of 64, one warp per (token, head) (8 heads a block, no barriers), else and with
// TANDEM_OLD_QUERY_ROPE=1 (read once; SetOldQueryRope in tests) one block per (token, head). Both
// give the same bits (the warp kernel repeats the block kernel's reduction and expressions, and
// LaunchQkvNormRopeAppend's per-head code is the block kernel's).
bool OldQueryRope();
void SetOldQueryRope(bool on);

// Keys and values: k (n × kvh·hd, raw projection) is normed with k_norm and roped at the token's
// position, then stored with v (n × kvh·hd) into the token's page of the cache. kv_stride: the
// floats from one token's k (and v) row to the next, >= kvh·hd (0: kvh·hd), so that k and v can be
// parts of the rows of one stacked product ([k | v] per token, DenseGemm::RunStack).
cudaError_t LaunchKvAppend(const float* k, const float* v, int64_t n, const AttnShape& d,
                           const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                           const int32_t* token_pos, const PagedKv& cache, cudaStream_t stream,
                           int64_t kv_stride = 0);

// The rows the q/k/v products wrote: qg (per token nh × 2hd: per head hd query values then hd gate
// values), k and v (kvh·hd each). Strides: floats from one token's row to the next (0: packed,
// nh·2hd for qg and kvh·hd for k and v), so that the three may be parts of one stacked product's
// rows ([q | k | v] per token).
struct QkvRows {
  const float* qg = nullptr;
  int64_t qg_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
};

// LaunchQueryNormRope and LaunchKvAppend in one launch (grid n × (nh + kvh)): bit-identical q_out
// and cache rows, one kernel fewer on the decode path. Needs q, k and v all written (run it after
// the three products). Not used when OldAttnDecode().
cudaError_t LaunchQkvNormRopeAppend(const QkvRows& rows, int64_t n, const AttnShape& d, const float* q_norm,
                                    const float* k_norm, const double* inv_freq, const int32_t* token_seq,
                                    const int32_t* token_pos, float* q_out, const PagedKv& cache,
                                    cudaStream_t stream);

// Whether attention decode runs QueryNormRope and KvAppend as two launches (true) or
// LaunchQkvNormRopeAppend, the same operations in one launch (false, the default since 2026-12-03;
// TANDEM_ATTN_DECODE_ONE_PREP=0 for the two launches, read once; settable in tests). On the H200
// (2026-12-01, q3n-80b decode at batch 1, two rounds) the two launches had measured 344.1 / 344.3
// tok/s against 335.2 / 343.8 for the one launch; with the merge in the last slice block
// (AttnMergeInBlock, which needs the one launch) and the column-split o product after it, the pair
// measured 444.2 against 439.9 tok/s (three rounds, 2026-12-03, docs/PERF.md "Twenty-second
// session").
bool OldAttnDecode();
void SetOldAttnDecode(bool on);
// With the one-launch prep and TANDEM_ATTN_MERGE_IN_BLOCK=1 (read once; settable for tests): the
// last block of each (row item, kv head) to finish combines the split attention's slices itself (a
// ticket counter in the scratch), in SplitMergeKernel's order (the same bits), instead of the
// SplitMergeKernel launch (the default again since 2026-12-03). On the H200 the merge launch had been
// 2.3% faster end to end (2026-12-01, 335.8 against 328.4 tok/s), then the merge in the block 1.0%
// (with the column-split o product, twenty-second session); since the split attention's latency
// fixes (twenty-fourth session) the merge launch is again ~1% faster (460.7 against 455.9 tok/s;
// attention_bench at 520 keys 9.74 against 11.59 us), the merging block's chain of L2 round trips
// after the last ticket being longer than a launch boundary.
bool AttnMergeInBlock();
void SetAttnMergeInBlock(bool on);

// A one-token step's slices left for the next launch to merge (LaunchAttention's deferred_merge):
// what SplitMergeKernel reads. splits == 0: nothing deferred (the launch merged, or had one slice),
// o holds the attention's output. Otherwise o holds it only for a context of at most short_keys
// keys (token_pos of the item's last token + 1, read on the device: the split kernel's slice 0
// wrote it), and the partials of `splits` slices hold it for longer ones.
// Head widths whose heads a Q8_0x8 super-block of o's columns (256) holds whole, one or two: the
// widths LaunchAttention defers for and LaunchColumnSplitMatVec merges.
inline constexpr bool AttnMergeableHd(int64_t hd) { return hd == 128 || hd == 256; }
struct AttnDeferredMerge {
  const float* qg = nullptr;
  int64_t qg_stride = 0;
  int nh = 0, kvh = 0;
  const int32_t* items = nullptr;
  const int32_t* token_pos = nullptr;
  int short_keys = 0;
  int splits = 0;
  const float* part_o = nullptr;
  const float* part_ml = nullptr;
};
// Whether the backend's one-token attention leaves its merge to the column-split o product
// (LaunchColumnSplitMatVec's merge, dense_colsplit.cuh), one launch fewer an attention layer. On
// by default: on the H200 (2026-12-03, q3n-80b decode at batch 1, three rounds) 500.1 tok/s against
// 491.7 with the merge launch. TANDEM_ATTN_MERGE_IN_OUT=0 keeps the merge launch (read once;
// settable; read when a step is enqueued).
bool AttnMergeInOut();
void SetAttnMergeInOut(bool on);

// The split attention's blocks (row items) read the step's items, rows, positions and page table
// before their PDL wait (the host writes them before the step), and, for plans where each
// sequence's tokens are one item (AttentionPlan::one_item_per_sequence: decode), copy the keys and
// values of positions before the item's first token (earlier steps' appends) into their ring
// before it too; the item's new keys (this step's append) follow after the wait. The same values
// in the same slots: the same bits. TANDEM_OLD_ATTN_EARLY_KV=1 (read once; settable) copies every
// key after the wait, for A/B.
bool OldAttnEarlyKv();
void SetOldAttnEarlyKv(bool on);

// Short decode contexts in one block: with splits (row items fewer than one block per SM, e.g.
// batch-1 decode: 66 context slices per kv head), a row item whose context (token_pos of its last
// token + 1, read on the device) is at most AttnShortKeys() keys is attended to by its first slice
// block alone, which writes o; the other slice blocks and the merge kernel's blocks of that item
// exit at once (no partials). Longer contexts take the split + merge path unchanged. The choice is
// made per item at run time, so a graph captured at any context replays correctly at every other.
// Bits: equal to the split path up to 32 keys (one slice with keys there, and the same operations);
// above, the keys' sums are split differently (one slice against several merged), both exact f32:
// an f32 emulation of both gave 1.8e-7 relative L2 at 256 keys (6.8e-7 at 8192 with the bound
// forced up: each warp of the one block sums ctx / 8 keys in sequence). TANDEM_OLD_ATTN_SPLIT=1
// (read once; settable for tests) gives the split + merge path at every context.
// TANDEM_ATTN_SHORT_KEYS=N (read once; settable) sets the bound (0: never), for timing; a launch
// uses the bound current when it is made (a captured graph keeps it). The default was 256 keys
// until the split blocks copied their keys before the PDL wait (OldAttnEarlyKv): since then
// attention_bench has the split + merge path faster at every context from 64 keys (H200,
// 2026-12-02, batch 1, us per launch, whole / split: ctx 64 15.6 / 13.5, 128 19.2 / 13.7, 256
// 24.6 / 13.8) and within 0.5 us below, where the two give the same bits.
inline constexpr int kAttnShortKeysDefault = 32;
bool OldAttnSplit();
void SetOldAttnSplit(bool on);
int AttnShortKeys();
void SetAttnShortKeys(int keys);

// The hd-256 tensor-core prefill (kF16TensorCores tile items) on Hopper's wgmma
// (attention_tc_wgmma.cu) instead of the mma.sync pipelined kernel: same items, plan, partials and
// merge; bit-identical outputs (the same f16 operands summed in the same order). On by default on
// compute capability 9.0 devices since 2026-12-01 (H200: 8192-token prefill attention 2.97 -> 2.24
// ms, end to end +3.4%, docs/PERF.md "Tenth session"); TANDEM_ATTN_TC_WGMMA=0 gives back the mma.sync
// kernel (read once; settable for tests and benchmarks; a launch uses the choice current when made).
bool AttnTcWgmma();
void SetAttnTcWgmma(bool on);

// TANDEM_ATTN_KV16=1 (read once; settable for tests and benchmarks; unset means 2, the default,
// where the sm_90a code runs): with AttnTcWgmma() and a cache that carries f16_tiles, the hd-256
// tensor-core prefill first converts, once per call, every K and V tile its tile items attend (each sequence's keys
// 0 .. last position, from the paged f32 cache) into f16 tiles laid out as the wgmma kernel's
// shared slabs (attention_kv16.cu), and the kernel copies them into shared memory as they are:
// no f32 staging, no conversion per block, half the bytes per tile, and a second K / Vt buffer
// in the freed shared memory. The same f16 operand bytes, the same wgmmas: bit-identical outputs.
// TANDEM_ATTN_KV16=2: the same path with FlashAttention-3's intra-warpgroup overlap (each
// warpgroup issues S(t + 1) = Q·K(t + 1)^T before the online softmax and O += P·V of tile t, so
// the tensor cores run it during the softmax; attention_kv16.cu); the same operations in the same
// order per output element: bit-identical outputs again. AttnKv16() is AttnKv16Mode() != 0;
// SetAttnKv16(on) sets mode 1 or 0.
bool AttnKv16();
void SetAttnKv16(bool on);
int AttnKv16Mode();  // 0 off, 1 the f16-tile kernel, 2 its overlapped form
void SetAttnKv16Mode(int mode);

// Bytes of PagedKv::f16_tiles for a pool of `pages` physical pages: per page and kv head a K and a
// Vt tile of 64 keys x hd f16 (hd 256 only; 0 otherwise). Half of one layer's f32 K + V pool.
size_t AttnKv16ScratchBytes(const AttnShape& d, int64_t pages);

// How LaunchAttention computes. kF32 is exact (f32 scores, softmax and accumulation on the CUDA
// cores; within ~1e-6 of the CPU reference). kF16TensorCores is the backend's fast mode: sequences
// with many tokens in the step (prefill) run on f16 tensor cores (Q, K, V rounded to f16 in
// shared memory, the cache stays f32; f32 accumulation and softmax; relative L2 ~3e-3 against
// kF32); sequences with few tokens (decode) still take the exact split-KV path.
enum class AttentionPrecision { kF32, kF16TensorCores };

// A sequence takes tensor-core tiles (kF16TensorCores) when it has at least this many tokens in
// the step.
inline constexpr int kAttnTensorCoreMinTokens = 64;

// The host plan of one step (FlashInfer style). Every item is (first token, token count) with all
// its tokens in one sequence. Row items (at most 8 / groups tokens, groups = nh / kvh, which must
// divide 8) run on the exact kernel: each item and kv head is split over num_splits blocks that
// each attend to a slice of the context (the slice is computed on the device from token_pos), then
// a merge kernel combines the slices. Tile items (at most 128 / groups tokens) run on the tensor
// cores. All counts depend only on the step's batch shape (tokens per sequence), never on
// positions or page tables, so a step captured as a CUDA graph replays correctly with new device
// contents of token_pos, token_seq, page_table and the items.
struct AttentionPlan {
  std::vector<int32_t> items;  // num_row_items pairs then num_tile_items pairs; upload as int32
  int num_row_items = 0;
  int num_tile_items = 0;
  int num_splits = 1;          // context slices per row item and kv head
  int tc_splits = 1;           // key-tile slices per tile item and kv head (short prompts)
  size_t scratch_bytes = 0;    // device scratch LaunchAttention needs (0 when both splits are 1)
  // Row items only, and each sequence's tokens in one of them (decode, short drafts): the plans
  // LaunchDecodeAttention (attention_decode.cuh) takes.
  bool one_item_per_sequence = false;
};

// Plans a step from its per-token sequence ids (tokens of one sequence consecutive). An invalid
// shape (kvh <= 0, nh % kvh != 0, 8 % (nh / kvh) != 0) gives an empty plan, which LaunchAttention
// rejects when n > 0. Tile items fewer than half a wave (one block per SM; a prompt of up to ~500
// tokens at GQA 8) are cut into as many slices of their key tiles as fill one wave (at most
// max_tc_splits, capped at kAttnMaxTcSplits), so that the longest item's chain of key tiles is
// shorter and more SMs work;
// 1 keeps every tile item whole (tests and benchmarks: the layout before the slices).
inline constexpr int kAttnMaxTcSplits = 4;
inline constexpr size_t kAttnTicketBytes = 1024;
AttentionPlan PlanAttention(const std::vector<int32_t>& token_seq, const AttnShape& d,
                            AttentionPrecision precision = AttentionPrecision::kF32,
                            int max_tc_splits = kAttnMaxTcSplits);

// An upper bound of scratch_bytes over every plan of shape d, whatever the batch: allocate it
// once (256-byte aligned, e.g. from cudaMalloc), ZERO IT ONCE (cudaMemset) and pass it to every
// LaunchAttention. Its first kAttnTicketBytes hold the split tickets (one counter per row item and
// kv head), which every launch leaves at zero again; the rest is rewritten by every launch.
size_t AttentionMaxScratchBytes(const AttnShape& d);

// o[t][h] = softmax_j(<q[t][h], K_j>/sqrt(hd))·V_j over positions j <= token_pos[t] of the token's
// sequence (kv head h / groups), times sigma(gate) taken from qg (n × nh × 2hd). `items` is the
// device copy of plan.items; `scratch` holds at least plan.scratch_bytes (may be null when that is
// 0; zeroed once when allocated, see AttentionMaxScratchBytes). Every per-step value is read from
// device memory; only the plan's counts are host values.
// hd must be 64, 128 or 256. qg_stride: qg's token rows as for LaunchQueryNormRope (0: nh·2hd); a
// wider stride is for row items only (a plan with tile items refuses it: cudaErrorInvalidValue).
// deferred_merge (may be null): for n == 1, a plan of one row item with num_splits > 1, hd that
// AttnMergeableHd takes and the merge in the block off, no merge is launched and *deferred_merge
// says what to merge (AttnDeferredMerge); otherwise it is set to nothing deferred.
cudaError_t LaunchAttention(const float* q, const float* qg, int64_t n, const AttnShape& d,
                            const AttentionPlan& plan, const int32_t* items, const int32_t* token_seq,
                            const int32_t* token_pos, const PagedKv& cache, float* o, void* scratch,
                            cudaStream_t stream, int64_t qg_stride = 0, AttnDeferredMerge* deferred_merge = nullptr);

// The earlier interface, kept for existing callers: the row items of PlanAttention (kF32) as
// int32 pairs, and the exact kernel over them with one block per item and kv head (no context
// split, no scratch), which is slow for decode at long context.
std::vector<int32_t> PlanAttentionItems(const std::vector<int32_t>& token_seq, int groups);
cudaError_t LaunchAttention(const float* q, const float* qg, int64_t n, const AttnShape& d,
                            const int32_t* items, int num_items, const int32_t* token_seq,
                            const int32_t* token_pos, const PagedKv& cache, float* o,
                            cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_CUH_
