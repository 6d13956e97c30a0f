// The two token mixers of a layer on the GPU (docs/MODEL.md §4.2), for a whole step's batch:
// Gated DeltaNet (RunGdn: the input products, conv, gates, chunked or recurrent scan, gated norm,
// output product) and attention (RunAttention: q/k/v products, cache append, dense or sparse
// attention with the indexer, output product). Small steps run their input products as one
// matrix-vector product over the layer's stacked inputs (GpuLayer::mixer_in) when the upload made
// one, else overlap their independent products on the side stream (layer_loop.cc: Fork, Join).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/backend/decode_ablation.h"
#include "gpu_service/backends/cuda/backend/sparse_attention.cuh"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_decode.cuh"
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gpu_service/backends/cuda/moe/indexer.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem {

using backend_internal::Launch;

CudaBackend::Impl::GdnInputs CudaBackend::Impl::PlanGdnInputs(const cuda::GpuLayer& w, int64_t T,
                                                              int fused_switch) const {
  GdnInputs in;
  in.stacked_in = T <= cuda::kMatVecMaxRows && StackedInputs(w);
  // One token with the gated norm and ssm_out inside the fused kernel (GetGdnDecodeFused 3 or 4,
  // EnqueueForward zeroed mixer_out_y for it): the layer's output goes to its row of mixer_out_y.
  // Mode 3 reads z from the one stacked product, mode 4 from the side stream, joined before the
  // kernel.
  const int out_mode_switch = mixer_out_step ? fused_switch : 0;
  in.out_inside = out_mode_switch >= 3 && T == 1 && in.stacked_in && !cuda::Ablated(cuda::Ablate::kGdnCore, T) &&
                  !cuda::Ablated(cuda::Ablate::kGdnOut, T) && cuda::GdnDecodeOutFits(gdn_shape, w.ssm_out);
  in.z_side = in.stacked_in && w.qkv_ba.present() &&
              (in.out_inside ? out_mode_switch == 4 : cuda::GdnStackedZSide());
  return in;
}

bool CudaBackend::Impl::GdnLayerInOneLaunch(const cuda::GpuLayer& w, const GdnInputs& in) const {
  if (!cuda::GdnDecodeLayerOne() || !in.out_inside || in.z_side || !x_norm_in.has_value() ||
      cuda::ProbeDecodeStep() || w.ssm_out_by_columns == nullptr || !cuda::GdnOutBulk()) {
    return false;
  }
  // The launch's stacked rows: z's then qkv's then ba's (LaunchGdnDecodeLayer's row offsets).
  return w.z.rows == c->gdn.nv * c->gdn.dv && w.qkv.rows == c->gdn.c_dim() &&
         cuda::GdnDecodeLayerFits(gdn_shape, w.ssm_out, w.mixer_in, w.ssm_out_by_columns_rows);
}

absl::Status CudaBackend::Impl::RunGdn(int64_t layer, const StepPlan& plan) {
  const cuda::GpuLayer& w = dm->layers[layer];
  const GdnDims& d = c->gdn;
  const cuda::GdnShape& shape = gdn_shape;
  const int64_t T = plan.tokens, cd = d.c_dim(), nv = d.nv, vw = d.nv * d.dv;
  cudaStream_t st = stream.get();
  // Small steps: one matrix-vector product over the stacked [z; qkv; ba] (stacked_in), or over
  // [qkv; ba] with z on the side stream, joined before the gated norm (z_side), or z and ba on the
  // side stream, beside qkv and the conv, joined before the gates need ba (side_products). Larger
  // steps go in order (GEMMs share one cuBLAS handle).
  const bool overlap = T <= cuda::kMatVecMaxRows;
  bool decode = true;
  for (int64_t n : plan.counts) decode &= n == 1;
  const int fused_switch = cuda::GetGdnDecodeFused();  // read once: the step's launches agree
  const GdnInputs in = PlanGdnInputs(w, T, fused_switch);
  const bool stacked_in = in.stacked_in, out_inside = in.out_inside, z_side = in.z_side;
  const bool one_launch = GdnLayerInOneLaunch(w, in);  // read once: the product and the launch agree
  // The stacked [z; qkv; ba] norm-in product writes the layer's polled rows, qkv and ba first, and
  // the fused kernel with ssm_out inside polls them (GdnDecodeFusedArgs::rows_polled), so that it
  // need not wait for the product's grid. EnqueueForward filled the rows at the step's start.
  const bool rows_polled = cuda::GdnRowsPolled() && in.out_inside && in.stacked_in && !in.z_side && !one_launch &&
                           x_norm_in.has_value() && gdn_polled_rows != nullptr &&
                           static_cast<size_t>(layer) < gdn_polled_slot.size() && gdn_polled_slot[layer] >= 0 &&
                           w.mixer_in.rows <= gdn_polled_stride && w.z.rows < w.mixer_in.rows;
  cuda::RowsPolled polled;
  polled.on = rows_polled;
  polled.first_row = w.z.rows;
  float* stacked_rows =
      rows_polled ? gdn_polled_rows + gdn_polled_slot[layer] * gdn_polled_stride : mixer_rows.as<float>();
  const bool side_products = overlap && !stacked_in;
  if (side_products || z_side) {
    if (absl::Status s = Fork(); !s.ok()) return s;
  }
  // Where the kernels read the products' rows: their own arrays, or the parts of a stacked
  // product's rows (row stride: the stack's width): [qkv | z | ba] of the prefill GEMM
  // (MixerStacked), [z | qkv | ba] or [qkv | ba] of the small steps' matrix-vector product.
  const float *qkv_rows = qkv, *z_rows = zg, *ba_rows = ba;
  int64_t qkv_stride = cd, z_stride = vw, ba_stride = 2 * nv;
  absl::StatusOr<int64_t> stride = int64_t{0};
  if (!overlap && !decode) stride = MixerStacked(w, T, {});
  if (!stride.ok()) return stride.status();
  // Decode: ba first on the side stream, the gates waiting for it alone (a mark, not a join), z
  // after it, joined before the gated norm, its only reader. The CUPTI timeline of graph-replayed
  // batch-1 steps (H200, 2026-12-01) had the gates start ~3.5 us after the conv ended, waiting for
  // z (4096 rows) and then ba (64 rows) under one join; ba first measured faster (q3n-80b batch-1
  // decode 306.9 -> 313.0 tok/s, docs/PERF.md "Eighth session"; the z-then-ba order's switch,
  // TANDEM_GDN_DECODE_ORDER, was removed in the ninth session).
  const bool ba_first = side_products && decode;
  const bool skip_in = cuda::Ablated(cuda::Ablate::kGdnIn, T);  // decode_ablation.h: timing only
  if (z_side) {
    if (!skip_in) {
      if (absl::Status s = Product(w.z, x, T, zg, false, side.get()); !s.ok()) return s;
      if (absl::Status s = Product(w.qkv_ba, x, T, mixer_rows.as<float>()); !s.ok()) return s;
    }
    qkv_rows = mixer_rows.as<float>();
    ba_rows = qkv_rows + w.qkv.rows;
    qkv_stride = ba_stride = w.qkv_ba.rows;
  } else if (stacked_in) {
    // x's norm may be this product's own (MixerNormInProduct: the read left it in x_norm_in); with
    // the layer in one launch (one_launch) the fused kernel computes the product below.
    if (!one_launch) {
      if (absl::Status s = InputProduct(w.mixer_in, T, stacked_rows, nullptr, /*gdn=*/true,
                                        rows_polled ? &polled : nullptr);
          !s.ok()) {
        return s;
      }
    }
    z_rows = stacked_rows;
    qkv_rows = z_rows + w.z.rows;
    ba_rows = qkv_rows + w.qkv.rows;
    qkv_stride = z_stride = ba_stride = w.mixer_in.rows;
  } else if (ba_first) {
    if (absl::Status s = Product(w.ba, x, T, ba, false, side.get()); !s.ok()) return s;
    if (absl::Status s = side_fork->Mark(side.get()); !s.ok()) return s;
    if (absl::Status s = Product(w.z, x, T, zg, false, side.get()); !s.ok()) return s;
    if (absl::Status s = Product(w.qkv, x, T, qkv); !s.ok()) return s;
  } else if (side_products) {
    if (absl::Status s = Product(w.z, x, T, zg, false, side.get()); !s.ok()) return s;
    if (absl::Status s = Product(w.ba, x, T, ba, false, side.get()); !s.ok()) return s;
    if (absl::Status s = Product(w.qkv, x, T, qkv); !s.ok()) return s;
  } else if (*stride > 0) {
    qkv_rows = mixer_rows.as<float>();
    z_rows = qkv_rows + w.qkv.rows;
    ba_rows = z_rows + w.z.rows;
    qkv_stride = z_stride = ba_stride = *stride;
  } else if (absl::Status s = Products({{&w.z, zg}, {&w.ba, ba}, {&w.qkv, qkv}}, x, T); !s.ok()) {
    return s;  // one f16 conversion of x for the three
  }
  if (side_products && !decode) {
    if (absl::Status s = Join(); !s.ok()) return s;
  }
  // The gated norm writes the output product's f16 input rows itself (no f32 rows read back) on
  // larger fast-mode steps; else it writes f32 rows in place. The rows are in the output products'
  // mode (out_mode): [lo | hi | hi] split rows (and, with an F8 copy, their fp8 rows derived by
  // the product) for kFastSplit, only the hi rows under TANDEM_DENSE_OUT_SINGLE (kFast).
  const cuda::GemmMode mode = out_mode;
  const bool norm_to_f16 =
      T > cuda::kMatVecMaxRows && mode != cuda::GemmMode::kExact && gemm->IsPrepared(w.ssm_out, mode);
  // Decode's conv, q/k norms, gates and recurrence (1), and the gated norm too (2), in one launch
  // (cuda::GetGdnDecodeFused; 0 and shapes the fused kernel does not take: the four kernels below).
  // It reads qkv and ba where the products left them: with the default [qkv; ba] product on this
  // stream (z_side) or the one stacked product it waits for nothing else. Mode 2 also needs z (the
  // side stream's, joined first) and writes f32 rows, so not where the gated norm writes f16 rows.
  int fused = decode && cuda::GdnDecodeFusedFits(shape) ? (fused_switch >= 3 ? 1 : fused_switch) : 0;
  if (fused == 2 && norm_to_f16) fused = 1;
  // The fused kernel's inputs (decode steps): the products' rows, the layer's weights, the state.
  cuda::GdnDecodeFusedArgs args;
  args.qkv = qkv_rows;
  args.qkv_stride = qkv_stride;
  args.ba = ba_rows;
  args.ba_stride = ba_stride;
  args.taps = w.conv1d;
  args.ssm_a = w.ssm_a;
  args.dt_bias = w.dt_bias;
  args.history = recurrent + gdn_conv_off[layer];
  args.state = recurrent + gdn_ssm_off[layer];
  args.row_stride = recurrent_floats;
  args.rows = seq_dev();
  args.z = z_rows;
  args.z_stride = z_stride;
  args.norm = w.ssm_norm;
  args.eps = d.eps;
  if (out_inside) {
    if (z_side) {
      if (absl::Status s = Join(); !s.ok()) return s;  // z
    }
    float* out = mixer_out_y + layer * mixer_out_stride;
    mixer_y = out;
    // The copy by columns may carry the router's rows (GpuLayer::route_rows): summed too, into the
    // row's floats past h, which the ffn norm reads when the step routes through them.
    const int64_t rows = w.ssm_out_by_columns != nullptr ? w.ssm_out_by_columns_rows : 0;
    route_parts = RouteThroughOutFor(w, T, out);
    if (one_launch) {
      cuda::GdnDecodeIn layer_in;
      layer_in.w = w.mixer_in;
      layer_in.qkv_row0 = w.z.rows;
      layer_in.ba_row0 = w.z.rows + w.qkv.rows;
      layer_in.norm = *x_norm_in;
      layer_in.rows = mixer_rows.as<float>();
      return Launch(cuda::LaunchGdnDecodeLayer(args, w.ssm_out, out, shape, layer_in, st, w.ssm_out_by_columns, rows),
                    "gdn decode (the layer in one launch)");
    }
    args.rows_polled = rows_polled;
    return Launch(cuda::LaunchGdnDecodeFusedOut(args, w.ssm_out, out, shape, st, w.ssm_out_by_columns, rows),
                  "gdn decode (fused, ssm_out inside)");
  }
  bool joined = false;  // the side stream's products have been joined
  if (fused != 0) {
    if (fused == 2 && (side_products || z_side)) {
      if (absl::Status s = Join(); !s.ok()) return s;  // z (and ba)
      joined = true;
    } else if (ba_first) {
      if (absl::Status s = side_fork->WaitForMark(stream.get()); !s.ok()) return s;  // ba
    } else if (side_products) {
      if (absl::Status s = Join(); !s.ok()) return s;  // z and ba
      joined = true;
    }
    args.o = go;
    if (cuda::Ablated(cuda::Ablate::kGdnCore, T)) {
      // decode_ablation.h: timing only.
    } else if (absl::Status s = Launch(cuda::LaunchGdnDecodeFused(args, T, shape, fused == 2, st), "gdn decode (fused)");
               !s.ok()) {
      return s;
    }
  } else if (decode) {
    // One token per sequence: one launch per kernel whatever the batch, each token finding its
    // sequence's state through the step's row list in device memory (seq_dev), so that the launch
    // arguments do not depend on which sequences run (decode_graphs.h).
    if (absl::Status s = Launch(cuda::LaunchGdnConvDecode(qkv_rows, recurrent + gdn_conv_off[layer], recurrent_floats,
                                                          seq_dev(), w.conv1d, T, shape, conv, st, qkv_stride),
                                "gdn conv (decode)");
        !s.ok()) {
      return s;
    }
    if (ba_first) {
      if (absl::Status s = side_fork->WaitForMark(stream.get()); !s.ok()) return s;  // ba
    }
    if (absl::Status s = Launch(cuda::LaunchGdnPrepare(conv, ba_rows, w.ssm_a, w.dt_bias, T, shape, g, beta, st,
                                                       ba_stride),
                                "gdn prepare");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Launch(cuda::LaunchGdnRecurrentDecode(conv, g, beta, T, shape, recurrent + gdn_ssm_off[layer],
                                                               recurrent_floats, seq_dev(), go, st),
                                "gdn recurrent (decode)");
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < plan.seqs.size() && !decode; ++i) {
    const int64_t off = plan.offsets[i], n = plan.counts[i];
    float* base = state(*plan.seqs[i]);
    // The conv and the q/k norms and gates in one pass over the qkv rows.
    if (absl::Status s = Launch(cuda::LaunchGdnConvPrepare(qkv_rows + off * qkv_stride, base + gdn_conv_off[layer],
                                                           w.conv1d, ba_rows + off * ba_stride, w.ssm_a, w.dt_bias, n,
                                                           shape, conv + off * cd, g + off * nv, beta + off * nv, st,
                                                           qkv_stride, ba_stride),
                                "gdn conv + prepare");
        !s.ok()) {
      return s;
    }
    // Prefill chunks through the chunked form (tensor cores in fast mode), decode token by token.
    if (n > 1 && gdn_scratch_bytes > 0) {
      const cuda::GdnChunkPrecision precision =
          options.mode == CudaMode::kFast && options.fast_gdn ? cuda::GdnChunkPrecision::kTf32
                                                              : cuda::GdnChunkPrecision::kF32;
      if (absl::Status s = Launch(cuda::LaunchGdnChunked(conv + off * cd, g + off * nv, beta + off * nv, n, shape,
                                                         precision, gdn_scratch, gdn_scratch_bytes,
                                                         base + gdn_ssm_off[layer], go + off * vw, st),
                                  "gdn chunked");
          !s.ok()) {
        return s;
      }
    } else if (absl::Status s = Launch(cuda::LaunchGdnRecurrent(conv + off * cd, g + off * nv, beta + off * nv, n,
                                                                shape, base + gdn_ssm_off[layer], go + off * vw, st),
                                       "gdn recurrent");
               !s.ok()) {
      return s;
    }
  }
  if ((ba_first || z_side) && !joined) {
    if (absl::Status s = Join(); !s.ok()) return s;  // z, for the gated norm
  }
  const bool skip_out = cuda::Ablated(cuda::Ablate::kGdnOut, T);  // decode_ablation.h: timing only
  if (fused == 2) return skip_out ? absl::OkStatus() : OutProduct(w.ssm_out, go, T, y);  // go holds the gated rows
  if (norm_to_f16) {
    uint16_t* go16 = gemm->input_scratch();
    if (absl::Status s = Launch(cuda::LaunchGdnGatedNormToF16(go, z_rows, w.ssm_norm, d.eps, T, shape,
                                                              mode == cuda::GemmMode::kFastSplit, go16, st, z_stride),
                                "gdn gated norm (f16 rows)");
        !s.ok()) {
      return s;
    }
    return gemm->RunInput(w.ssm_out, cuda::DenseGemm::F16Input{go16, T, vw, mode}, y, st);
  }
  if (absl::Status s =
          Launch(cuda::LaunchGdnGatedNorm(go, z_rows, w.ssm_norm, d.eps, T, shape, go, st, z_stride), "gdn gated norm");
      !s.ok()) {
    return s;
  }
  return skip_out ? absl::OkStatus() : OutProduct(w.ssm_out, go, T, y);
}

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
