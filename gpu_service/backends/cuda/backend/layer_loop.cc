// The blocks of one layer (docs/MODEL.md §4.2) on the GPU, for a whole step's batch: products
// batched over every token of the step, per-sequence kernels (Engram) looped over the step's
// sequences; the streams' fork and join, the L2 prefetches, the hyper-connection reads. The two
// mixers are in gdn_mixer.cc and attention_mixer.cc, the head and the logits' way out in
// head_stage.cc.
#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/reference/engram.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/backend/decode_ablation.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec_probe.h"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/l2_prefetch.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem {

using cuda::Stage;

using backend_internal::Launch;

absl::Status CudaBackend::Impl::Product(const cuda::DeviceMatrix& w, const float* in, int64_t n, float* out,
                                        bool accurate, cudaStream_t on) {
  if (in == x && x_norm_in.has_value()) {
    return absl::InternalError("a product read x, whose norm the read left to the layer's input product");
  }
  cudaStream_t st = on != nullptr ? on : stream.get();
  if (n <= cuda::kMatVecMaxRows) {
    return Launch(cuda::LaunchDenseMatVec(w, in, w.cols, static_cast<int>(n), out, w.rows, st), "dense matvec");
  }
  if (!accurate || gemm->mode() == cuda::GemmMode::kExact) return gemm->Run(w, in, n, out, st);
  // Near-f32 on the tensor cores (f16 hi/lo triples): as accurate as the pedantic f32 GEMM for the
  // router's logits, several times faster.
  return gemm->Run(w, in, n, out, st, cuda::GemmMode::kFastSplit);
}

absl::Status CudaBackend::Impl::InputProduct(const cuda::DeviceMatrix& w, int64_t n, float* out, cudaStream_t on,
                                             bool gdn, const cuda::RowsPolled* polled) {
  if (!x_norm_in.has_value()) {
    if (polled != nullptr) return absl::InternalError("polled rows asked of a product without its norm");
    return Product(w, x, n, out, false, on);
  }
  if (n != 1) return absl::InternalError("a read's norm left to the product of a step of several tokens");
  cudaStream_t st = on != nullptr ? on : stream.get();
  cuda::MatVecNormIn in = *x_norm_in;
  if (polled != nullptr) in.polled = *polled;
  if (gdn && cuda::ProbeDecodeStep()) {
    return Launch(cuda::LaunchDenseMatVecNormInProbed(w, in, out, st), "dense matvec (norm in, probed)");
  }
  return Launch(cuda::LaunchDenseMatVecNormIn(w, in, out, st), "dense matvec (norm in)");
}

bool CudaBackend::Impl::MixerNormInProduct(const cuda::GpuLayer& w, int64_t T) const {
  if (T != 1 || c->n_streams != 1 || (inject_pending && !inject_is_one) || cuda::MixerNormLaunch()) return false;
  for (cuda::Ablate piece : {cuda::Ablate::kMixerNorm, cuda::Ablate::kMixer, cuda::Ablate::kGdnIn,
                             cuda::Ablate::kFfnNorm}) {
    if (cuda::Ablated(piece, T)) return false;
  }
  // The mixer's products of x (its only readers), and whether its output goes to its row of
  // mixer_out_y rather than y.
  std::array<const cuda::DeviceMatrix*, 2> readers = {nullptr, nullptr};
  bool out_aside = false;
  if (w.kind == LayerKind::kGdn) {  // RunGdn's one product over w.mixer_in
    const GdnInputs in = PlanGdnInputs(w, T, cuda::GetGdnDecodeFused());
    if (!in.stacked_in || in.z_side) return false;
    readers[0] = &w.mixer_in;
    out_aside = in.out_inside;
  } else if (w.kind == LayerKind::kAttention) {  // RunAttention's [k; v] and q products, or [q; k; v]
    if (c->attn.has_indexer() || !StackedInputs(w)) return false;
    if (AttnKvAside(w)) {
      readers = {&w.kv, &w.q};
    } else {
      readers[0] = &w.mixer_in;
    }
    out_aside = AttnOutByColumns(w, T);
  } else {
    return false;
  }
  for (const cuda::DeviceMatrix* m : readers) {
    if (m != nullptr && !cuda::DenseMatVecNormInTakes(*m)) return false;
  }
  // The pending y (and its shared term, the MoE stage's own buffer) must hold until the ffn read
  // adds them: not y itself where the mixer writes its output there (moe_y may name y).
  return !inject_pending || PendingY() != y || out_aside;
}

absl::Status CudaBackend::Impl::OutProduct(const cuda::DeviceMatrix& w, const float* in, int64_t n, float* out) {
  if (n <= cuda::kMatVecMaxRows) return Product(w, in, n, out);
  return gemm->Run(w, in, n, out, stream.get(), out_mode);
}

absl::Status CudaBackend::Impl::Products(std::initializer_list<std::pair<const cuda::DeviceMatrix*, float*>> outs,
                                         const float* in, int64_t n) {
  const cuda::GemmMode mode = gemm->mode();
  bool shared_input = n > cuda::kMatVecMaxRows && mode != cuda::GemmMode::kExact && outs.size() > 1;
  for (const auto& [w, y] : outs) {
    shared_input &= gemm->IsPrepared(*w, mode) && w->cols == outs.begin()->first->cols;
  }
  if (!shared_input) {
    for (const auto& [w, y] : outs) {
      if (absl::Status s = Product(*w, in, n, y); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  cudaStream_t st = stream.get();
  absl::StatusOr<cuda::DenseGemm::F16Input> x16 = gemm->ConvertInput(in, n, outs.begin()->first->cols, mode, st);
  if (!x16.ok()) return x16.status();
  for (const auto& [w, y] : outs) {
    if (absl::Status s = gemm->RunInput(*w, *x16, y, st); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaBackend::Impl::MixerStacked(
    const cuda::GpuLayer& w, int64_t n, std::initializer_list<std::pair<const cuda::DeviceMatrix*, float*>> also) {
  const cuda::GemmMode mode = gemm->mode();
  if (mixer_stack_rows == 0 || n <= cuda::kMatVecMaxRows || mode == cuda::GemmMode::kExact) return 0;
  const MixerStack stack = MixerStackOf(w);
  const int64_t rows = gemm->StackRows(stack.matrices()), cols = stack.parts[0]->cols;
  if (rows == 0 || rows > mixer_stack_rows || !gemm->IsPrepared(*stack.parts[0], mode)) return 0;
  for (const auto& [m, y] : also) {
    if (!gemm->IsPrepared(*m, mode) || m->cols != cols) return 0;
  }
  cudaStream_t st = stream.get();
  // One f16 conversion of x (none when the read's norm wrote the rows: Read, SetConverted).
  absl::StatusOr<cuda::DenseGemm::F16Input> x16 = gemm->ConvertInput(x, n, cols, mode, st);
  if (!x16.ok()) return x16.status();
  if (absl::Status s = gemm->RunStack(stack.matrices(), *x16, mixer_rows.as<float>(), st); !s.ok()) return s;
  for (const auto& [m, y] : also) {
    if (absl::Status s = gemm->RunInput(*m, *x16, y, st); !s.ok()) return s;
  }
  return rows;
}

absl::StatusOr<bool> CudaBackend::Impl::SharedExpertStacked(int64_t layer, const float* in, int64_t n, float* shared,
                                                            float* gate_logit, cudaStream_t st) {
  const cuda::GpuLayer& w = dm->layers[layer];
  if (shared_stack_rows == 0 || gemm->mode() == cuda::GemmMode::kExact) return false;
  const SharedExpertStack stack = SharedExpertStackOf(w);
  // A gate logit the stack does not carry (none, or over another input) is not this path's.
  if (w.shared_gate_inp.present() && !stack.with_gate_logit()) return false;
  const int64_t rows = gemm->StackRows(stack.matrices()), ffn = w.shared_gate.rows, cols = w.shared_gate.cols;
  // The shared expert's products are "accurate" (near f32 f16 triples) like the router's, unless
  // TANDEM_SHARED_SINGLE=1: one f16 product each (K = cols instead of 3 · cols), like the routed
  // experts' f16 products; the stack (and the gate logit in it) then reads the hi thirds of the
  // router's split rows. The copies are the split ones either way (they serve kFast products).
  // Measured on the H200 (2026-12-02): 8192-token prefill +2.3% with the dense products split, +2.1%
  // with them as one f16 product (and this shared expert inline: docs/PERF.md, thirteenth session,
  // third call); but on `tiny` one position where every routing pick agreed moved its logits by
  // 2.2e-2 (acceptance 1e-2). It comes after a sparse-attention block selection within 1e-2 of a
  // tie in the reference (docs/VALIDATION.md); not the default until the GPU's selections are
  // compared too.
  static const bool single = cuda::EnvSwitch("TANDEM_SHARED_SINGLE");
  const cuda::GemmMode mode = single ? cuda::GemmMode::kFast : cuda::GemmMode::kFastSplit;
  if (rows == 0 || rows > shared_stack_rows || w.shared_up.rows != ffn || !gemm->IsPrepared(w.shared_down, mode) ||
      w.shared_down.cols != ffn) {
    return false;
  }
  // The split rows (usually left by the router's product: no launch), read whole or as hi thirds.
  absl::StatusOr<cuda::DenseGemm::F16Input> x16 = gemm->ConvertInput(in, n, cols, cuda::GemmMode::kFastSplit, st);
  if (!x16.ok()) return x16.status();
  if (single) *x16 = cuda::DenseGemm::HiThirdsOf(*x16);
  float* gu = shared_gu.as<float>();
  if (absl::Status s = gemm->RunStack(stack.matrices(), *x16, gu, st); !s.ok()) return s;
  // SiLU(g)·u straight into the f16 rows of the down product (the GEMM above has read x16).
  if (absl::Status s = Launch(cuda::LaunchSiluMulToF16Rows(gu, n, rows, ffn, /*split=*/!single, gemm->input_scratch(),
                                                           2 * ffn, stack.with_gate_logit() ? gate_logit : nullptr, st),
                              "shared silu to f16");
      !s.ok()) {
    return s;
  }
  const cuda::DenseGemm::F16Input act{gemm->input_scratch(), n, ffn, mode};
  if (absl::Status s = gemm->RunInput(w.shared_down, act, shared, st); !s.ok()) return s;
  return true;
}

absl::Status CudaBackend::Impl::Fork() { return side_fork->Fork(stream.get(), side.get()); }

absl::Status CudaBackend::Impl::PrefetchToL2(std::initializer_list<const cuda::DeviceMatrix*> matrices) {
  cuda::L2PrefetchList list;
  for (const cuda::DeviceMatrix* m : matrices) {
    if (m == nullptr || !m->present()) continue;
    if (!list.Add(m->data, static_cast<uint64_t>(m->rows * m->row_bytes))) break;  // the first ones matter most
  }
  if (list.count == 0) return absl::OkStatus();
  if (absl::Status s = prefetch_fork->Fork(stream.get(), prefetch_stream.get()); !s.ok()) return s;
  prefetch_pending = true;
  return Launch(cuda::LaunchL2Prefetch(list, prefetch_stream.get()), "l2 prefetch");
}

absl::Status CudaBackend::Impl::JoinPrefetches() {
  if (!prefetch_pending) return absl::OkStatus();
  prefetch_pending = false;
  return prefetch_fork->Join(stream.get(), prefetch_stream.get());
}

absl::Status CudaBackend::Impl::Join() { return side_fork->Join(stream.get(), side.get()); }

cuda::GemmMode CudaBackend::Impl::ReadF16Mode(const cuda::GpuLayer& w, int64_t n, bool ffn) const {
  const cuda::GemmMode none = cuda::GemmMode::kExact;
  if (n <= cuda::kMatVecMaxRows || gemm->mode() == cuda::GemmMode::kExact) return none;
  if (ffn) {
    // The router's product ("accurate": split rows) and the stacked shared expert read x so.
    return gemm->IsPrepared(w.router, cuda::GemmMode::kFastSplit) ? cuda::GemmMode::kFastSplit : none;
  }
  // Products(): the mixer's input products share one conversion when all are prepared.
  const cuda::GemmMode mode = gemm->mode();
  const bool gdn = w.kind == LayerKind::kGdn;
  const std::array<const cuda::DeviceMatrix*, 3> inputs = {gdn ? &w.z : &w.k, gdn ? &w.ba : &w.v, gdn ? &w.qkv : &w.q};
  for (const cuda::DeviceMatrix* m : inputs) {
    if (!gemm->IsPrepared(*m, mode) || m->cols != c->h) return none;
  }
  return mode;
}

absl::Status CudaBackend::Impl::Read(const cuda::GpuHcRead& r, int64_t n, float* out, float* inject,
                                     const float* pending, cuda::GemmMode f16_for, const cuda::NormMmqOut* xq,
                                     const cuda::PendingShared* pending_shared, bool norm_in_product,
                                     const cuda::NormRoute* route) {
  const int64_t S = c->n_streams, h = c->h;
  cudaStream_t st = stream.get();
  // x is rewritten here: the f16 rows of the previous x in the GEMM scratch no longer count.
  gemm->ForgetConverted();
  // The pending inject (H += a·pending, a from the previous read) is fused into this read's norm;
  // the kernel reads a before this read writes the new weights below.
  const float* pending_a = pending != nullptr && !inject_is_one ? a : nullptr;
  const cuda::PendingShared* psh = pending != nullptr ? pending_shared : nullptr;
  // With an inject pending, H's rows were last written by the previous read's norm (before the
  // first, by the embedding or Engram), several kernels back: the norm may read them before its
  // PDL wait (norm_streams.cuh). Without one, the kernel just before (the embedding, Engram) may
  // have written them.
  const bool h_earlier = pending != nullptr;
  // The inject an earlier read left to this one (its norm was formed inside a product).
  const cuda::EarlierInject earlier = std::exchange(earlier_inject, cuda::EarlierInject{});
  if (route != nullptr && (r.down.present() || norm_in_product || f16_for != cuda::GemmMode::kExact)) {
    return absl::InternalError("routing logits asked of a read whose norm is not the plain f32 launch");
  }
  if (!r.down.present()) {  // plain: x = γ ⊙ ρ(H), a = 1
    if (norm_in_product) {
      // MixerNormInProduct: one stream, no inject weights, one token; x is formed by the product.
      if (S != 1 || pending_a != nullptr || n != 1 || earlier.y != nullptr || xq != nullptr ||
          f16_for != cuda::GemmMode::kExact) {
        return absl::InternalError("a read's norm left to its product, outside a one-token, one-stream step");
      }
      cuda::MatVecNormIn in;
      in.H = H;
      in.y = pending;
      if (psh != nullptr) in.sh = *psh;
      in.gamma = r.norm;
      in.eps = c->eps;
      in.h_written_earlier = h_earlier;
      x_norm_in = in;
      earlier_inject = cuda::EarlierInject{pending, in.sh};
      if (inject != nullptr) inject_is_one = true;  // one stream: the weights stay 1, as below
      return absl::OkStatus();
    }
    if (earlier.y != nullptr && f16_for != cuda::GemmMode::kExact) {
      return absl::InternalError("an earlier read's inject left to a norm that writes f16 rows");
    }
    if (f16_for != cuda::GemmMode::kExact) {
      // x and its f16 input rows in one pass, instead of a conversion per consumer (bit-identical:
      // the same f32 values and roundings as DenseGemm::ConvertInput).
      const int copies = f16_for == cuda::GemmMode::kFastSplit ? 3 : 1;
      if (absl::Status s = Launch(cuda::LaunchInjectRmsNormF16(H, n, 1, h, pending_a, pending, r.norm, c->eps, out,
                                                               copies, gemm->input_scratch(), st, xq, psh, h_earlier),
                                  "rms norm (f16 rows)");
          !s.ok()) {
        return s;
      }
      gemm->SetConverted(out, n, h, f16_for);
    } else if (absl::Status s =
                   Launch(cuda::LaunchInjectRmsNorm(H, n, 1, h, pending_a, pending, r.norm, c->eps, out, st, xq, psh,
                                                    h_earlier, &earlier, route),
                          route != nullptr ? "rms norm (with routing logits)" : "rms norm");
               !s.ok()) {
      return s;
    }
    if (inject == nullptr) return absl::OkStatus();
    if (S == 1) {  // one stream: the weights stay 1, and the kernels take nullptr for that
      inject_is_one = true;
      return absl::OkStatus();
    }
    inject_is_one = false;
    return Launch(cuda::LaunchInjectWeights(nullptr, n * S, inject, st), "inject weights");
  }
  if (earlier.y != nullptr) return absl::InternalError("an earlier read's inject left to a stream read");
  const int64_t lr = r.down.rows;
  if (absl::Status s = Launch(cuda::LaunchInjectRmsNorm(H, n, S, h, pending_a, pending, r.norm, c->eps, N, st,
                                                        nullptr, psh),
                              "stream norm");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Product(r.down, N, n, hz); !s.ok()) return s;
  if (absl::Status s = Launch(cuda::LaunchSiluInPlace(hz, n * lr, st), "silu"); !s.ok()) return s;
  if (absl::Status s = Product(r.up, hz, n, hm); !s.ok()) return s;
  if (absl::Status s = Launch(cuda::LaunchStreamFold(N, hm, n, S, h, out, st), "stream fold"); !s.ok()) return s;
  if (inject == nullptr) return absl::OkStatus();
  inject_is_one = false;
  if (!r.inject.present()) return Launch(cuda::LaunchInjectWeights(nullptr, n * S, inject, st), "inject weights");
  if (absl::Status s = Product(r.inject, N, n, inject); !s.ok()) return s;
  return Launch(cuda::LaunchInjectWeights(inject, n * S, inject, st), "inject weights");
}

absl::Status CudaBackend::Impl::RunLayer(int64_t layer, const StepPlan& plan) {
  const cuda::GpuLayer& w = dm->layers[layer];
  const int64_t T = plan.tokens, S = c->n_streams, h = c->h;
  cudaStream_t st = stream.get();
  cuda::StageTimer& t = *timer;
  // 1. Engram, per sequence (its table rows depend on the sequence's token history).
  if (w.has_engram) {
    t.Mark(Stage::kEngram, st);
    // Engram adds to H: the previous block's output goes in first, as in the reference.
    if (inject_pending) {
      const cuda::PendingShared shared_term = TakePendingShared();
      if (absl::Status s = Launch(cuda::LaunchStreamInject(H, T, S, h, inject_is_one ? nullptr : a, PendingY(), st, &shared_term),
                                  "stream inject");
          !s.ok()) {
        return s;
      }
      inject_pending = false;
    }
    const EngramConfig& ec = c->engram[c->engram_index(layer)];
    const LayerWeights& hw = model->weights().layers[layer];
    std::vector<int64_t> rows;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const int64_t n = plan.counts[i];
      rows.assign(static_cast<size_t>(n * ec.rows_per_token()), 0);
      EngramRows(ec, model->weights().engram_token_map, plan.seqs[i]->tokens, plan.starts[i], n, rows.data());
      if (absl::Status s = moe->RunEngram(layer, hw.engram.embd, rows, H + plan.offsets[i] * S * h, n,
                                          state(*plan.seqs[i]) + engram_off[layer], st);
          !s.ok()) {
        return s;
      }
    }
  }
  // Small steps: the weights read after the latency-bound middle of the layer go into L2 now.
  const bool prefetch = T <= cuda::kMatVecMaxRows && options.l2_prefetch > 0;
  if (prefetch) {
    const cuda::DeviceMatrix* mixer_out = w.kind == LayerKind::kGdn ? &w.ssm_out : &w.o;
    if (absl::Status s = PrefetchToL2({mixer_out, &w.router, &w.shared_gate_inp, &w.shared_gate, &w.shared_up,
                                       &w.shared_down});
        !s.ok()) {
      return s;
    }
  }
  // 2. Mixer.
  t.Mark(Stage::kStreams, st);
  mixer_y = nullptr;
  route_parts.reset();
  const cuda::PendingShared attn_shared_term = inject_pending ? TakePendingShared() : cuda::PendingShared{};
  if (cuda::Ablated(cuda::Ablate::kMixerNorm, T)) {
    // decode_ablation.h: timing only.
  } else if (absl::Status s = Read(w.attn_read, T, x, a, inject_pending ? PendingY() : nullptr,
                                   ReadF16Mode(w, T, /*ffn=*/false), nullptr, &attn_shared_term,
                                   MixerNormInProduct(w, T));
             !s.ok()) {
    return s;
  }
  if (cuda::Ablated(cuda::Ablate::kMixer, T)) {
    // decode_ablation.h: timing only.
  } else if (w.kind == LayerKind::kGdn) {
    t.Mark(Stage::kGdn, st);
    if (absl::Status s = RunGdn(layer, plan); !s.ok()) return s;
  } else {
    t.Mark(Stage::kAttention, st);
    if (absl::Status s = RunAttention(layer, plan); !s.ok()) return s;
  }
  x_norm_in.reset();  // its products have run (MixerNormInProduct)
  gemm->ForgetConverted();  // the f16 rows of x live from their read to the end of its block
  // ... and the next layer's mixer inputs, under the MoE stage.
  if (prefetch && options.l2_prefetch >= 2 && layer + 1 < c->n_layers) {
    const cuda::GpuLayer& next = dm->layers[layer + 1];
    const absl::Status s = next.kind == LayerKind::kGdn ? PrefetchToL2({&next.qkv, &next.z, &next.ba})
                                                        : PrefetchToL2({&next.q, &next.k, &next.v});
    if (!s.ok()) return s;
  }
  // 3. MoE (the mixer's output is injected by the read's norm).
  t.Mark(Stage::kStreams, st);
  // A plain read's norm also writes x in the form the MoE's experts read it when the stage would
  // make it: quantized for the integer-MMA experts (MoeStage::MmqInput), or as f16 rows for the streamed ones (StreamedF16Input; not with
  // TANDEM_OLD_STREAMED_INPUT=1): one launch fewer a layer.
  std::optional<cuda::MmqActivations> mmq_x;
  cuda::NormMmqOut xq;
  if (!w.ffn_read.down.present()) {
    if (cuda::NormMmqFits(c->h)) mmq_x = moe->MmqInput(layer, T, *experts);
    if (mmq_x.has_value()) {
      xq = cuda::NormMmqOut{mmq_x->hi, mmq_x->lo, mmq_x->scale, mmq_x->sumx};
    } else {
      xq.x16 = moe->StreamedF16Input(layer, T, *experts);
    }
  }
  const bool x_ready = mmq_x.has_value() || xq.x16 != nullptr;
  // The routing logits from the parts the mixer's output product summed (RouteThroughOutFor),
  // formed by the ffn norm's launch, where the MoE stage takes them ready (ReadyLogitsFor).
  const cuda::GemmMode ffn_f16 = ReadF16Mode(w, T, /*ffn=*/true);
  std::optional<cuda::NormRoute> route = std::exchange(route_parts, std::nullopt);
  if (route.has_value()) {
    const std::optional<cuda::MoeStage::ReadyLogits> ready = moe->ReadyLogitsFor(layer, T, *experts);
    if (ready.has_value() && ready->rows->rows <= route->rows && ffn_f16 == cuda::GemmMode::kExact &&
        !cuda::Ablated(cuda::Ablate::kFfnNorm, T) && !cuda::Ablated(cuda::Ablate::kMoe, T)) {
      route->w = static_cast<const float*>(ready->rows->data);
      route->rows = static_cast<int>(ready->rows->rows);
      route->logits = ready->logits;
    } else {
      route.reset();
    }
  }
  if (cuda::Ablated(cuda::Ablate::kFfnNorm, T)) {
    // decode_ablation.h: timing only.
  } else if (absl::Status s = Read(w.ffn_read, T, x, a, mixer_y != nullptr ? mixer_y : y, ffn_f16,
                                   x_ready ? &xq : nullptr, nullptr, false, route.has_value() ? &*route : nullptr);
             !s.ok()) {
    return s;
  }
  std::vector<int32_t>* picks = nullptr;
  if (routing_sink != nullptr) picks = &(*routing_sink)[layer].experts;
  uint64_t rows = 0;
  auto product = [this](const cuda::DeviceMatrix& m, const float* in, int64_t n, float* out, cudaStream_t on) {
    return Product(m, in, n, out, /*accurate=*/true, on);
  };
  // The stage may leave its shared expert's term out of y (one-token decode): pending_shared, added
  // by the launch that injects y (the next read's norm, Engram's inject or the head's norm).
  if (cuda::Ablated(cuda::Ablate::kMoe, T)) {
    // decode_ablation.h: timing only.
  } else if (absl::Status s = moe->Run(layer, x, T, y, *experts, st, side.get(), t, picks, &rows, product, x_ready,
                                       &pending_shared, &moe_y, route.has_value());
             !s.ok()) {
    return s;
  }
  gemm->ForgetConverted();
  local_rows += rows;
  // The MoE output is injected by the next read (the next layer's, or the head's).
  inject_pending = true;
  return absl::OkStatus();
}

}  // namespace tandem
