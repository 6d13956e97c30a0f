// The Gated DeltaNet token mixer of a layer on the GPU (docs/MODEL.md §4.2), for a whole step's
// batch (RunGdn: the input products, conv, gates, chunked or recurrent scan, gated norm, output
// product). Small steps run their input products as one matrix-vector product over the layer's
// stacked inputs (GpuLayer::mixer_in) when the upload made one, else overlap their independent
// products on the side stream (layer_loop.cc: Fork, Join). attention_mixer.cc holds the other mixer.
#include <cstdint>

#include "absl/status/status.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/backend/decode_ablation.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
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

}  // namespace tandem
