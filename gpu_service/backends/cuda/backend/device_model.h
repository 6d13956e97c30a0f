// The model's weights in device memory: every tensor the layer loop reads, uploaded once at load
// into one device allocation (Engram tables excepted: their rows are gathered on the host, since
// their addresses depend only on token ids). Plain structs over cuda::DeviceMatrix (the matrix
// type both kernel families take), free of the kernel families' launch headers.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DEVICE_MODEL_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DEVICE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// A ggml expert tensor {cols, rows, experts}: expert e's matrix starts at data + e·rows·row_bytes.
struct GpuExperts {
  uint32_t type = 0;
  const uint8_t* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t experts = 0;
  int64_t row_bytes = 0;
  const void* expert(int64_t e) const { return data + e * rows * row_bytes; }
};

// A stream read (docs/MODEL.md §4.1): hc_* set, or only `norm` for the plain read.
struct GpuHcRead {
  const float* norm = nullptr;  // S·h
  DeviceMatrix down, up, inject;   // absent for the plain read; inject optional
};

struct GpuLayer {
  LayerKind kind = LayerKind::kGdn;
  GpuHcRead attn_read, ffn_read;
  // Decode's input products of the mixer as one matrix-vector product (RunGdn, RunAttention): a
  // Q8_0x8 view over the rows of [z; qkv; ba] (GDN) or [q; k; v] (attention), whose parts were
  // uploaded adjacent in that order, so that output row t of one product holds [z | qkv | ba] or
  // [q | k | v]. The parts keep their own views over the same bytes (no weight byte is stored
  // twice). Absent when the parts do not stack (types, cols, layout) or with
  // TANDEM_OLD_DECODE_INPUTS=1. GDN's z comes first so that [qkv; ba] is a view too (qkv_ba: the
  // schedule that keeps z on the side stream, GdnStackedZSide); attention's [k; v] is one too (kv:
  // AttnStackedKvSide). Present exactly when mixer_in is, for their layer kind.
  DeviceMatrix mixer_in, qkv_ba, kv;
  // Gated DeltaNet.
  DeviceMatrix qkv, z, ba, ssm_out;
  // ssm_out's Q8_0x8 super-blocks by columns (device_matrix.h), a second copy (8.9 MB a layer at
  // 80B shapes) that the fused GDN kernel's output product reads when present (GdnOutByColumns).
  const void* ssm_out_by_columns = nullptr;
  // The router's logits through the output product (kernels/route_compose.cuh, RouteThroughOut):
  // the by-columns copy then holds ssm_out_by_columns_rows = ssm_out.rows + 2·RoutePaddedRows(
  // route_rows) rows, ssm_out's, then the hi and lo terms of M = Wr·diag(γ_ffn)·ssm_out for the
  // route_rows router rows (E, then the shared gate's row when the layer has one), and
  // route_inv_scale their 1 / S_r (attention layers: o_route below, and the same two fields).
  // route_rows 0 (and ssm_out_by_columns_rows = ssm_out.rows): none.
  int64_t ssm_out_by_columns_rows = 0;
  int64_t route_rows = 0;
  const float* route_inv_scale = nullptr;
  const float* conv1d = nullptr;  // c_dim × kk
  const float* ssm_a = nullptr;
  const float* dt_bias = nullptr;
  const float* ssm_norm = nullptr;
  // Attention (+ indexer).
  DeviceMatrix q, k, v, o, idx_qk;
  // o's rows and, right after them, the router's two terms (route_rows > 0): the matrix the
  // column-split output product reads then (its rows past o's sum the routing parts).
  DeviceMatrix o_route;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* idx_q_norm = nullptr;
  const float* idx_k_norm = nullptr;
  // MoE.
  DeviceMatrix router, shared_gate_inp, shared_gate, shared_up, shared_down;
  // The router's E rows and the shared expert's gate vector as one (E + 1)-row matrix, where the
  // upload placed them back to back with one type and row stride (absent otherwise): one product
  // gives a decode token's routing logits and its shared-expert gate logit (MoeStage).
  DeviceMatrix router_and_gate;
  GpuExperts gate_exps, up_exps, down_exps;
  // Engram (the table engram_embd stays on the host).
  bool has_engram = false;
  DeviceMatrix engram_key, engram_value;
  const float* engram_key_norm = nullptr;
  const float* engram_query_norm = nullptr;
  const float* engram_conv_norm = nullptr;
  const float* engram_conv = nullptr;
};

struct DeviceModel {
  DeviceBuffer storage;           // every tensor, 256-byte aligned
  DeviceMatrix token_embd, output;
  GpuHcRead output_read;
  std::vector<GpuLayer> layers;   // the n_layers main layers (the MTP layer is not uploaded)
  const double* rope_inv_freq = nullptr;  // rot/2 f64, as the CPU reference computes them
  uint64_t bytes = 0;
};

// Whether UploadModel stacks each layer's mixer input matrices for decode (GpuLayer::mixer_in).
// TANDEM_OLD_DECODE_INPUTS=1 (read once) starts it off: today's separate matrices (ba in plain
// Q8_0) and launches. Tests flip it between two uploads in one process. Not bit-identical: the
// stream matvec picks its row split (ChooseStreamSplit's wpr) from the row count, so a part can be
// summed in another order inside the stack (q3n-80b at one row, by the cost model: qkv, z and q
// keep wpr 1, k and v alone take wpr 4 and 1 in the stack; ba alone is plain Q8_0, another kernel).
bool StackedDecodeInputs();
void SetStackedDecodeInputs(bool on);

// With stacked decode inputs, how GDN layers run them: true (the default) the product over qkv_ba
// on the main stream and z's own product on the side stream, joined before the gated norm, its
// only reader (z's 4096 rows of q3n-80b then stay off the path through the conv and the
// recurrence); false one product over mixer_in. TANDEM_GDN_DECODE_Z_SIDE=0 turns it off (A/B);
// read when a step is enqueued (decode graphs keep the schedule they were captured with). Why:
// at one row the stream kernel's cost model gives the whole q3n-80b stack (12352 rows, 386
// groups of 32 rows) two groups for its busiest block where [qkv; ba] (8256) takes one (a wave:
// 2 blocks per SM, the Q8_0x8 n = 1 kernel using 128 registers, on 132 SMs). Measured on the H200
// (2026-12-01, q3n-80b decode at batch 1, two rounds, with AttnStackedKvSide alike): 337.5 tok/s
// with both parts aside against 328.4 for the one-product stacks and 327.9 for the separate
// products of TANDEM_OLD_DECODE_INPUTS.
bool GdnStackedZSide();
void SetGdnStackedZSide(bool on);

// Whether UploadModel adds GpuLayer::ssm_out_by_columns (read once per upload; settable for tests):
// on by default, TANDEM_GDN_OUT_BY_COLUMNS=0 turns it off. Why: each block of the fused GDN
// kernel's output product copies 256 rows' super-block of one column strip (70 KB at 80B shapes),
// 272 bytes out of every 4352-byte row; by columns that is one contiguous run.
bool GdnOutByColumns();
void SetGdnOutByColumns(bool on);

// Whether UploadModel appends the router's rows through the output product to the output matrix
// of every layer it can (GpuLayer::route_rows: f32 router and shared gate rows, a plain one-stream
// ffn read; GDN: ssm_out's copy by columns; attention: after o's rows), and whether fast-mode
// one-token steps use them (read at upload and when a step is enqueued; settable for tests): the
// ffn norm then forms the routing logits from the parts (norm_streams.cuh NormRoute) and the fused
// MoE kernel takes them ready. TANDEM_ROUTE_THROUGH_OUT (mode; read once, settable): 2 GDN and attention layers (their o
// product; the default since the o product merges the attention's slices, AttnMergeInOut: +0.5%
// against 1 in three rounds, docs/PERF.md "Thirty-first session"; before that 0.2-0.3% slower,
// the norm's launch after o having started only ~2.5 us before its wait, short of the route
// blocks' reads), 1 GDN layers only (+4.6% batch-1 decode on q3n-80b against 0, "Thirtieth
// session"), 0 off. 4.5 MB a layer at 80B shapes.
// RouteThroughOut(): mode > 0; SetRouteThroughOut(on): mode 1 or 0.
bool RouteThroughOut();
void SetRouteThroughOut(bool on);
int RouteThroughOutMode();
void SetRouteThroughOutMode(int mode);

// The same for attention layers: true (the default) q's own product on the main stream and the
// product over kv ([k; v]) on the side stream (as before the stack, one product fewer); false one
// product over mixer_in ([q; k; v]). TANDEM_ATTN_DECODE_KV_SIDE=0 turns it off (A/B); read when a
// step is enqueued.
bool AttnStackedKvSide();
void SetAttnStackedKvSide(bool on);

// Whether Q8_0x8 parts of `rows[i]` rows over `cols` columns, placed one after another in 256-byte
// aligned slots (UploadModel's placer), lie adjacent: every part but the last ends on a 256-byte
// boundary (a Q8_0x8 row is cols / 256 · 272 bytes). Host arithmetic only.
bool Q8_0x8PartsAdjacent(int64_t cols, const int64_t* rows, size_t count);

// Uploads the main layers' tensors. InvalidArgument naming a tensor whose type has no GPU kernel.
absl::StatusOr<std::unique_ptr<DeviceModel>> UploadModel(const ModelConfig& config,
                                                         const ModelWeights& weights);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DEVICE_MODEL_H_
