// The attention token mixer of a layer on the GPU (docs/MODEL.md §4.2), for a whole step's batch
// (RunAttention: q/k/v products, cache append, dense or sparse attention with the indexer, output
// product; a fast one-token step's attention and o in one launch, attention_out_fused.cuh). Small
// steps run their input products as one matrix-vector product over the layer's stacked inputs when
// the upload made one, else overlap their independent products on the side stream (layer_loop.cc:
// Fork, Join). gdn_mixer.cc holds the other mixer.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/backend/sparse_attention.cuh"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_decode.cuh"
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gpu_service/backends/cuda/moe/indexer.cuh"
namespace tandem {

using backend_internal::Launch;

std::optional<cuda::NormRoute> CudaBackend::Impl::RouteThroughOutFor(const cuda::GpuLayer& w, int64_t T,
                                                                     const float* out) const {
  const bool carried = w.kind == LayerKind::kGdn ? w.ssm_out_by_columns != nullptr
                                                  : w.o_route.present() && cuda::RouteThroughOutMode() >= 2;
  if (T != 1 || w.route_rows <= 0 || !carried || w.route_inv_scale == nullptr || !cuda::RouteThroughOut() ||
      cuda::OldNormEarlyH() || route_h_reads.get() == nullptr) {
    return std::nullopt;
  }
  cuda::NormRoute r;
  r.rows = static_cast<int>(w.route_rows);
  r.parts = out + c->h;
  r.padded = cuda::RoutePaddedRows(w.route_rows);
  r.inv_scale = w.route_inv_scale;
  r.h_reads = route_h_reads.as<int>();
  return r;
}

bool CudaBackend::Impl::AttnOutByColumns(const cuda::GpuLayer& w, int64_t T) const {
  return T == 1 && mixer_out_step && cuda::AttnOutColumnSplit() && cuda::ColumnSplitMatVecFits(w.o);
}

const cuda::DeviceMatrix* CudaBackend::Impl::AttnOutMatrix(const cuda::GpuLayer& w, int64_t T) const {
  if (!AttnOutByColumns(w, T)) return nullptr;
  // o's rows and the router's after them (GpuLayer::o_route) when this step routes through them.
  const bool with_route = RouteThroughOutFor(w, T, mixer_out_y).has_value() && cuda::ColumnSplitMatVecFits(w.o_route);
  return with_route ? &w.o_route : &w.o;
}

// Attention's output product: for a fast one-token step the column-split product into the layer's
// row of mixer_out_y (zeroed by EnqueueForward; dense_colsplit.cuh), else into y.
absl::Status CudaBackend::Impl::AttnOutProduct(int64_t layer, const cuda::GpuLayer& w, int64_t T) {
  if (const cuda::DeviceMatrix* m = AttnOutMatrix(w, T); m != nullptr) {
    float* out = mixer_out_y + layer * mixer_out_stride;
    mixer_y = out;
    const bool with_route = m == &w.o_route;
    route_parts = with_route ? RouteThroughOutFor(w, T, out) : std::nullopt;
    const cuda::AttnDeferredMerge merge = attn_merge;
    attn_merge = cuda::AttnDeferredMerge{};
    return Launch(cuda::LaunchColumnSplitMatVec(*m, ao, out, stream.get(), &merge),
                  with_route ? "attention output and routing parts (column split)" : "attention output (column split)");
  }
  if (attn_merge.splits > 0) return absl::InternalError("attention left its merge to a row-split o product");
  return OutProduct(w.o, ao, T, y);
}

absl::Status CudaBackend::Impl::RunAttention(int64_t layer, const StepPlan& plan) {
  const cuda::GpuLayer& w = dm->layers[layer];
  attn_merge = cuda::AttnDeferredMerge{};  // none left by a launch that failed after deferring
  const AttnDims& d = c->attn;
  const cuda::AttnShape& shape = attn_shape;
  const int64_t T = plan.tokens, slot = attn_slot[layer];
  cudaStream_t st = stream.get();
  // Small steps: one matrix-vector product over the stacked [q; k; v] (stacked_in; the sparse
  // attention of the indexer reads the gate at the dense row width, so with an indexer only at one
  // token), then the cache append on the side stream beside the query norm (the default; or the
  // one q/k prep launch reading its parts, attention.cuh); or the product over [k; v] on the side stream
  // (with the append unless one_prep) beside the queries' product (kv_side); or keys and values
  // (products, and the append unless one_prep) on the side stream beside the queries
  // (side_products). Joined before the prep launch or before attention reads the cache.
  const bool overlap = T <= cuda::kMatVecMaxRows;
  const bool stacked_in = overlap && StackedInputs(w) && (!d.has_indexer() || T == 1);
  // Decode in one attention launch (TANDEM_ATTN_DECODE_FUSED, attention_decode.cuh): the input
  // products (q's on the main stream and [k; v]'s on the side stream, joined, as the unfused path
  // runs them with AttnStackedKvSide; else the one product over [q; k; v]), then the norms, RoPE,
  // the cache append, the split attention and its merge in one kernel, then the output product.
  if (stacked_in && !d.has_indexer() && cuda::AttnDecodeFused() && cuda::DecodeAttentionFits(plan.attn, shape)) {
    float* rows = mixer_rows.as<float>();
    cuda::QkvRows qkv;
    if (AttnKvAside(w)) {
      if (absl::Status s = Fork(); !s.ok()) return s;
      if (absl::Status s = InputProduct(w.kv, T, rows, side.get()); !s.ok()) return s;
      if (absl::Status s = InputProduct(w.q, T, qg); !s.ok()) return s;
      if (absl::Status s = Join(); !s.ok()) return s;
      qkv = cuda::QkvRows{qg, 0, rows, w.kv.rows, rows + w.k.rows, w.kv.rows};
    } else {
      if (absl::Status s = InputProduct(w.mixer_in, T, rows); !s.ok()) return s;
      const int64_t stride = w.mixer_in.rows;
      qkv = cuda::QkvRows{rows, stride, rows + w.q.rows, stride, rows + w.q.rows + w.k.rows, stride};
    }
    const cuda::PagedKv cache{k_pool[slot], v_pool[slot], page_table, static_cast<int>(max_pages), attn_f16_tiles};
    if (absl::Status s = Launch(cuda::LaunchDecodeAttention(qkv, T, shape, w.q_norm, w.k_norm, dm->rope_inv_freq,
                                                            plan.attn, items_dev(), seq_dev(), pos_dev(), cache, ao,
                                                            attn_scratch, st),
                                "decode attention");
        !s.ok()) {
      return s;
    }
    return AttnOutProduct(layer, w, T);
  }
  const bool kv_side = stacked_in && AttnKvAside(w);
  const bool side_products = overlap && !stacked_in;
  // Small steps (decode): the q/k norms, RoPE and the cache append as one launch after the three
  // products are joined (LaunchQkvNormRopeAppend, same bits), instead of KvAppend on the side stream
  // and QueryNormRope on the main one; the two launches are the default (attention.cuh).
  const bool one_prep = overlap && !cuda::OldAttnDecode();
  // The side stream runs: keys and values (side_products), [k; v] (kv_side, with the append unless
  // one_prep), or the append alone after the one [q; k; v] product (stacked_in, two launches only).
  const bool forked = side_products || kv_side || (stacked_in && !one_prep);
  if (side_products || kv_side) {
    if (absl::Status s = Fork(); !s.ok()) return s;
  }
  cudaStream_t kvs = overlap ? side.get() : st;
  const cuda::PagedKv cache{k_pool[slot], v_pool[slot], page_table, static_cast<int>(max_pages), attn_f16_tiles};
  // Queries (with their gates), keys and values from their arrays, or from a stacked product's rows:
  // [k | v] of the prefill GEMM or of kv_side (row stride kv_stride), [q | k | v] of stacked_in
  // (qg_stride, kv_stride).
  const float *qg_rows = qg, *k_rows = kb, *v_rows = vb;
  int64_t qg_stride = 0, kv_stride = 0;
  if (kv_side) {
    if (absl::Status s = InputProduct(w.kv, T, mixer_rows.as<float>(), kvs); !s.ok()) return s;
    k_rows = mixer_rows.as<float>();
    v_rows = k_rows + w.k.rows;
    kv_stride = w.kv.rows;
  } else if (stacked_in) {
    if (absl::Status s = InputProduct(w.mixer_in, T, mixer_rows.as<float>()); !s.ok()) return s;
    if (!one_prep) {
      if (absl::Status s = Fork(); !s.ok()) return s;  // the append (side stream) waits for the product
    }
    qg_rows = mixer_rows.as<float>();
    k_rows = qg_rows + w.q.rows;
    v_rows = k_rows + w.k.rows;
    qg_stride = kv_stride = w.mixer_in.rows;
  } else if (!overlap) {  // one f16 conversion of x for the three products
    absl::StatusOr<int64_t> stride = MixerStacked(w, T, {{&w.q, qg}});
    if (!stride.ok()) return stride.status();
    if (*stride > 0) {
      k_rows = mixer_rows.as<float>();
      v_rows = k_rows + w.k.rows;
      kv_stride = *stride;
    } else if (absl::Status s = Products({{&w.k, kb}, {&w.v, vb}, {&w.q, qg}}, x, T); !s.ok()) {
      return s;
    }
  } else {
    if (absl::Status s = Product(w.k, x, T, kb, false, kvs); !s.ok()) return s;
    if (absl::Status s = Product(w.v, x, T, vb, false, kvs); !s.ok()) return s;
  }
  if (!one_prep) {
    if (absl::Status s = Launch(cuda::LaunchKvAppend(k_rows, v_rows, T, shape, w.k_norm, dm->rope_inv_freq, seq_dev(),
                                                     pos_dev(), cache, kvs, kv_stride),
                                "kv append");
        !s.ok()) {
      return s;
    }
  }
  if (side_products || kv_side) {
    if (absl::Status s = InputProduct(w.q, T, qg); !s.ok()) return s;
  }
  if (!one_prep) {
    if (absl::Status s = Launch(cuda::LaunchQueryNormRope(qg_rows, T, shape, w.q_norm, dm->rope_inv_freq, pos_dev(),
                                                          q, st, qg_stride),
                                "query norm rope");
        !s.ok()) {
      return s;
    }
  }
  if (forked) {
    if (absl::Status s = Join(); !s.ok()) return s;
  }
  // Attention and o in one launch (attention_out_fused.cuh), with the q/k prep inside it too when
  // AttnOutFusedPrepInside.
  const cuda::DeviceMatrix* fused_o = !d.has_indexer() && AttnOutFusedStep(plan) ? AttnOutMatrix(w, T) : nullptr;
  const bool fused = fused_o != nullptr && cuda::AttentionOutFusedFits(shape, *fused_o);
  const bool prep_inside = fused && one_prep && cuda::AttnOutFusedPrepInside();
  if (one_prep && !prep_inside) {
    const cuda::QkvRows rows{qg_rows, qg_stride, k_rows, kv_stride, v_rows, kv_stride};
    if (absl::Status s = Launch(cuda::LaunchQkvNormRopeAppend(rows, T, shape, w.q_norm, w.k_norm, dm->rope_inv_freq,
                                                              seq_dev(), pos_dev(), q, cache, st),
                                "q/k norm rope + kv append");
        !s.ok()) {
      return s;
    }
  }
  if (fused) {
    float* out = mixer_out_y + layer * mixer_out_stride;
    mixer_y = out;
    route_parts = fused_o == &w.o_route ? RouteThroughOutFor(w, T, out) : std::nullopt;
    const cuda::AttnOutFusedPrep prep{k_rows, v_rows, w.q_norm, w.k_norm, dm->rope_inv_freq};
    return Launch(cuda::LaunchAttentionOutFused(q, qg_rows, qg_stride, shape, seq_dev(), pos_dev(), cache, *fused_o, out,
                                                st, prep_inside ? &prep : nullptr),
                  "attention and output product (fused)");
  }
  if (!d.has_indexer()) {
    // The merge of a one-token step's slices left to the column-split o product
    // (TANDEM_ATTN_MERGE_IN_OUT, attention.cuh).
    cuda::AttnDeferredMerge* defer = AttnOutByColumns(w, T) && cuda::AttnMergeInOut() ? &attn_merge : nullptr;
    if (absl::Status s = Launch(cuda::LaunchAttention(q, qg_rows, T, shape, plan.attn, items_dev(), seq_dev(),
                                                      pos_dev(), cache, ao, attn_scratch, st, qg_stride, defer),
                                "attention");
        !s.ok()) {
      return s;
    }
    return AttnOutProduct(layer, w, T);
  }

  // Indexer: queries and raw keys, the block keys completed by this step, scores and selection,
  // per sequence; then attention over the selected blocks for the whole batch.
  const int ih = static_cast<int>(d.ih), di = static_cast<int>(d.di), cr = static_cast<int>(d.cr);
  const int keep = static_cast<int>(d.keep), rot = static_cast<int>(d.rot);
  const int64_t row_w = d.ih * d.di + d.di;
  if (absl::Status s = Product(w.idx_qk, x, T, iqk); !s.ok()) return s;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const int64_t off = plan.offsets[i], n = plan.counts[i], start = plan.starts[i];
    const int32_t row = plan.seqs[i]->row;
    float* keys = index_keys[slot] + static_cast<int64_t>(row) * options.max_context * di;
    float* bkeys = block_keys[slot] + static_cast<int64_t>(row) * block_slots * di;
    if (absl::Status s = Launch(cuda::LaunchIndexerPrepare(iqk + off * row_w, w.idx_q_norm, static_cast<int>(n), ih, di,
                                                           rot, d.theta, d.eps, start, iq + off * ih * di, keys, st),
                                "indexer prepare");
        !s.ok()) {
      return s;
    }
    const int64_t first_block = start / cr, end_block = (start + n) / cr;
    if (end_block > first_block) {
      if (absl::Status s = Launch(cuda::LaunchIndexerBlockKeys(keys, w.idx_k_norm, first_block,
                                                               static_cast<int>(end_block - first_block), cr, di, rot,
                                                               d.theta, d.eps, bkeys, st),
                                  "indexer block keys");
          !s.ok()) {
        return s;
      }
    }
    if ((start + n - 1) / cr > 0) {
      if (absl::Status s = Launch(cuda::LaunchIndexerScores(iq + off * ih * di, bkeys, static_cast<int>(n), ih, di, start,
                                                            cr, scores + off * block_slots,
                                                            static_cast<int>(block_slots), st),
                                  "indexer scores");
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = Launch(cuda::LaunchIndexerSelect(scores + off * block_slots, static_cast<int>(block_slots),
                                                          static_cast<int>(n), start, cr, keep,
                                                          sel_blocks + off * (keep + 1), sel_counts + off, st),
                                "indexer select");
        !s.ok()) {
      return s;
    }
  }
  if (selection_sink != nullptr) {
    if (absl::Status s = CopySelectionsToSink(layer, plan); !s.ok()) return s;
  }
  cuda::SparseAttnArgs args;
  args.q = q;
  args.qg = qg_rows;  // one token when stacked (stacked_in): its row only
  args.n = T;
  args.nh = shape.nh;
  args.kvh = shape.kvh;
  args.hd = shape.hd;
  args.token_seq = seq_dev();
  args.token_pos = pos_dev();
  args.k_cache = cache.k;
  args.v_cache = cache.v;
  args.page_table = page_table;
  args.max_pages = static_cast<int>(max_pages);
  args.blocks = sel_blocks;
  args.counts = sel_counts;
  args.max_selected = keep + 1;
  args.cr = cr;
  args.o = ao;
  if (absl::Status s = Launch(cuda::LaunchSparseAttention(args, st), "sparse attention"); !s.ok()) return s;
  return OutProduct(w.o, ao, T, y);
}

absl::Status CudaBackend::Impl::CopySelectionsToSink(int64_t layer, const StepPlan& plan) {
  const int64_t T = plan.tokens, keep = c->attn.keep, cr = c->attn.cr, row = keep + 1;
  std::vector<int32_t> blocks(static_cast<size_t>(T * row)), counts(static_cast<size_t>(T));
  cudaStream_t st = stream.get();
  // Tests only: a wait per sparse layer is fine (the graph path is off while the sink is set).
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(blocks.data(), sel_blocks, blocks.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(counts.data(), sel_counts, counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  BlockSelection& out = (*selection_sink)[static_cast<size_t>(layer)];
  out.keep = keep;
  out.blocks.assign(static_cast<size_t>(T * keep), -1);
  out.counts.assign(static_cast<size_t>(T), 0);
  // The kernels' format (moe/indexer.cuh): counts[t] ids, ascending, the last the query's own
  // block p / cr, which the reference's selection does not list.
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    for (int64_t t = 0; t < plan.counts[i]; ++t) {
      const int64_t r = plan.offsets[i] + t, p = plan.starts[i] + t;
      const int32_t n = counts[static_cast<size_t>(r)];
      const int32_t* ids = blocks.data() + r * row;
      if (n < 1 || n > row || ids[n - 1] != p / cr) {
        return absl::InternalError(absl::StrCat("layer ", layer, " position ", p, ": the block selection lists ", n,
                                                " blocks, the last ", n >= 1 && n <= row ? ids[n - 1] : -1,
                                                "; expected 1 to ", row, " ending with the own block ", p / cr));
      }
      std::copy(ids, ids + n - 1, out.blocks.begin() + r * keep);
      out.counts[static_cast<size_t>(r)] = n - 1;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
