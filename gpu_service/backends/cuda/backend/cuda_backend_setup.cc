// CudaBackend's load-time half: the state-and-scratch arena plan, the persistent f16 copies of the
// dense weights (PrepareDenseWeights) and CudaBackend::Open / Create. The per-step half (sequences,
// Step, the forward pass's enqueueing) is in cuda_backend.cc, the layer loop in layer_loop.cc.
#include "gpu_service/backends/cuda/backend/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem {

namespace {

// Requests for slices of the state-and-scratch arena, made before its size is known.
class ArenaPlan {
 public:
  template <typename T>
  void Want(T** dst, int64_t count) {
    wants_.push_back({reinterpret_cast<void**>(dst), static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)});
  }
  size_t bytes() const {
    size_t total = 0;
    for (const W& w : wants_) total += (w.bytes + 255) / 256 * 256;
    return total;
  }
  absl::Status Carve(cuda::DeviceArena& arena) {
    for (const W& w : wants_) {
      absl::StatusOr<void*> p = arena.Take(w.bytes);
      if (!p.ok()) return p.status();
      *w.dst = *p;
    }
    return absl::OkStatus();
  }

 private:
  struct W {
    void** dst;
    size_t bytes;
  };
  std::vector<W> wants_;
};

int64_t MaxCols(const cuda::DeviceModel& m) {
  int64_t cols = std::max(m.token_embd.cols, m.output.cols);
  auto see = [&](const cuda::DeviceMatrix& g) { cols = std::max(cols, g.cols); };
  auto see_read = [&](const cuda::GpuHcRead& r) { see(r.down); see(r.up); see(r.inject); };
  see_read(m.output_read);
  for (const cuda::GpuLayer& l : m.layers) {
    see_read(l.attn_read);
    see_read(l.ffn_read);
    for (const cuda::DeviceMatrix* g : {&l.qkv, &l.z, &l.ba, &l.ssm_out, &l.q, &l.k, &l.v, &l.o, &l.idx_qk}) see(*g);
  }
  return cols;
}

}  // namespace


absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Open(const std::string& model_path,
                                                               const CudaBackendOptions& options) {
  ReferenceModelOptions ro;
  ro.threads = 1;  // the CPU engine is not used; only the file, config, views and tokenizer
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model = ReferenceModel::Open(model_path, ro);
  if (!model.ok()) return model.status();
  return Create(*std::move(model), options);
}

namespace {

// The persistent f16 copies of every dense matrix that prefill multiplies through the GEMM
// (CudaBackendOptions::prepare_dense_weights): the mixer and stream-read products in the plan's
// mode; the router, the shared-expert gate and the shared expert itself (when it runs as dense
// GEMMs) as near-f32 triples (the layer loop runs them "accurate"); the mixers' output products
// (ssm_out, o) in out_mode (only their f16 hi copy under TANDEM_DENSE_OUT_SINGLE, as OutProduct
// reads). Not the head: a prefill step sends only a few rows through it.
absl::Status PrepareDenseWeights(CudaBackend::Impl& m) {
  const CudaBackendOptions& o = m.options;
  if (o.mode != CudaMode::kFast || !o.fast_dense_gemm || !o.prepare_dense_weights ||
      o.max_batch_tokens <= cuda::kMatVecMaxRows) {
    return absl::OkStatus();
  }
  cudaStream_t st = m.stream.get();
  auto prepare = [&](const cuda::DeviceMatrix& w, bool accurate) -> absl::Status {
    if (!w.present()) return absl::OkStatus();
    return accurate ? m.gemm->Prepare(w, cuda::GemmMode::kFastSplit, st) : m.gemm->Prepare(w, st);
  };
  auto prepare_read = [&](const cuda::GpuHcRead& r) -> absl::Status {
    for (const cuda::DeviceMatrix* w : {&r.down, &r.up, &r.inject}) {
      if (absl::Status s = prepare(*w, false); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  for (const cuda::GpuLayer& l : m.dm->layers) {
    // The shared expert's gate and up (and its gate logit) as one stacked copy: one GEMM for the
    // three (SharedExpertStacked). Refused stacks (scales far apart) fall back to separate copies.
    if (cuda::SharedExpertRunsAsDenseGemms(l) && o.max_batch_tokens > cuda::kMaxUnitRows) {
      const SharedExpertStack stack = SharedExpertStackOf(l);
      absl::StatusOr<int64_t> rows = m.gemm->PrepareStack(stack.matrices(), cuda::GemmMode::kFastSplit, st);
      if (rows.ok()) {
        m.shared_stack_rows = std::max(m.shared_stack_rows, *rows);
      } else if (rows.status().code() != absl::StatusCode::kFailedPrecondition) {
        return rows.status();
      }
    }
    // The mixer's input products of one x as one stacked copy (MixerStacked); refused stacks (scales
    // far apart, cols differ) fall back to separate copies, made below like all the others.
    if (const MixerStack stack = MixerStackOf(l); stack.present()) {
      absl::StatusOr<int64_t> rows = m.gemm->PrepareStack(stack.matrices(), m.gemm->mode(), st);
      if (rows.ok()) {
        m.mixer_stack_rows = std::max(m.mixer_stack_rows, *rows);
      } else if (rows.status().code() != absl::StatusCode::kFailedPrecondition) {
        return rows.status();
      }
    }
    for (const cuda::DeviceMatrix* w : {&l.qkv, &l.z, &l.ba, &l.ssm_out, &l.q, &l.k, &l.v, &l.o, &l.idx_qk}) {
      if (w == &l.ssm_out || w == &l.o) {  // the output products: in out_mode
        if (!w->present()) continue;
        if (absl::Status s = m.gemm->Prepare(*w, m.out_mode, st); !s.ok()) return s;
      } else if (absl::Status s = prepare(*w, false); !s.ok()) {
        return s;
      }
    }
    for (const cuda::DeviceMatrix* w : {&l.router, &l.shared_gate_inp}) {
      if (absl::Status s = prepare(*w, true); !s.ok()) return s;
    }
    if (cuda::SharedExpertRunsAsDenseGemms(l)) {  // else the grouped expert kernel runs it
      for (const cuda::DeviceMatrix* w : {&l.shared_gate, &l.shared_up, &l.shared_down}) {
        if (absl::Status s = prepare(*w, true); !s.ok()) return s;
      }
    }
    if (absl::Status s = prepare_read(l.attn_read); !s.ok()) return s;
    if (absl::Status s = prepare_read(l.ffn_read); !s.ok()) return s;
  }
  if (m.shared_stack_rows > 0) {
    absl::StatusOr<cuda::DeviceBuffer> gu =
        cuda::DeviceBuffer::Allocate(static_cast<size_t>(o.max_batch_tokens * m.shared_stack_rows) * sizeof(float));
    if (!gu.ok()) return gu.status();
    m.shared_gu = *std::move(gu);
  }
  if (m.mixer_stack_rows > 0) {
    absl::StatusOr<cuda::DeviceBuffer> rows =
        cuda::DeviceBuffer::Allocate(static_cast<size_t>(o.max_batch_tokens * m.mixer_stack_rows) * sizeof(float));
    if (!rows.ok()) return rows.status();
    m.mixer_rows = *std::move(rows);
  }
  return prepare_read(m.dm->output_read);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(std::unique_ptr<ReferenceModel> model,
                                                                 const CudaBackendOptions& options) {
  if (options.max_batch_tokens < 1 || options.max_sequences < 1 || options.max_context < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CudaBackendOptions: max_batch_tokens=", options.max_batch_tokens,
                                                   " max_sequences=", options.max_sequences, " max_context=",
                                                   options.max_context, " must all be >= 1"));
  }
  if (options.l2_prefetch < 0 || options.l2_prefetch > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackendOptions: l2_prefetch=", options.l2_prefetch, " must be 0, 1 or 2"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.model = std::move(model);
  m.options = options;
  m.c = &m.model->config();
  const ModelConfig& c = *m.c;
  const int64_t T = options.max_batch_tokens, S = c.n_streams, h = c.h, L = c.n_layers;

  absl::StatusOr<std::unique_ptr<cuda::DeviceModel>> dm = cuda::UploadModel(c, m.model->weights());
  if (!dm.ok()) return dm.status();
  m.dm = *std::move(dm);
  absl::StatusOr<cuda::Stream> stream = cuda::Stream::Create();
  if (!stream.ok()) return stream.status();
  m.stream = *std::move(stream);
  absl::StatusOr<cuda::Stream> side = cuda::Stream::Create();
  if (!side.ok()) return side.status();
  m.side = *std::move(side);
  absl::StatusOr<cuda::StreamFork> fork = cuda::StreamFork::Create();
  if (!fork.ok()) return fork.status();
  m.side_fork.emplace(*std::move(fork));
  absl::StatusOr<cuda::Stream> prefetch_stream = cuda::Stream::Create();
  if (!prefetch_stream.ok()) return prefetch_stream.status();
  m.prefetch_stream = *std::move(prefetch_stream);
  absl::StatusOr<cuda::StreamFork> prefetch_fork = cuda::StreamFork::Create();
  if (!prefetch_fork.ok()) return prefetch_fork.status();
  m.prefetch_fork.emplace(*std::move(prefetch_fork));
  // TANDEM_DENSE_SPLIT, where set, overrides fast_dense_split (an A/B switch: 0 gives one f16
  // product for every dense product that is not "accurate", the mixers' input products included).
  if (std::getenv("TANDEM_DENSE_SPLIT") != nullptr) m.options.fast_dense_split = cuda::EnvSwitch("TANDEM_DENSE_SPLIT");
  cuda::DenseGemmOptions go;
  go.mode = options.mode == CudaMode::kFast && options.fast_dense_gemm
                ? (m.options.fast_dense_split ? cuda::GemmMode::kFastSplit : cuda::GemmMode::kFast)
                : cuda::GemmMode::kExact;
  go.max_n = T;
  go.max_cols = std::max<int64_t>(MaxCols(*m.dm), 256);
  go.tile_bytes = std::max<int64_t>(128ll << 20, go.max_cols * 4);
  absl::StatusOr<std::unique_ptr<cuda::DenseGemm>> gemm = cuda::DenseGemm::Create(go);
  if (!gemm.ok()) return gemm.status();
  m.gemm = *std::move(gemm);
  // The output products' mode (OutProduct), set before their copies are prepared in it.
  // TANDEM_DENSE_OUT_SINGLE, where set, overrides the option (the A/B switch: 0 gives the split).
  if (std::getenv("TANDEM_DENSE_OUT_SINGLE") != nullptr) {
    m.options.fast_dense_out_single = cuda::EnvSwitch("TANDEM_DENSE_OUT_SINGLE");
  }
  m.out_mode = go.mode == cuda::GemmMode::kFastSplit && m.options.fast_dense_out_single ? cuda::GemmMode::kFast
                                                                                         : go.mode;
  if (absl::Status s = PrepareDenseWeights(m); !s.ok()) return s;
  // Small steps' stacked mixer input products (GpuLayer::mixer_in) write their rows into mixer_rows,
  // grown here when the prefill stacks did not make it large enough (no allocation in a step).
  int64_t in_rows = 0;
  for (const cuda::GpuLayer& l : m.dm->layers) in_rows = std::max(in_rows, l.mixer_in.rows);
  if (in_rows > 0) {
    const size_t need = static_cast<size_t>(std::min<int64_t>(T, cuda::kMatVecMaxRows) * in_rows) * sizeof(float);
    if (m.mixer_rows.bytes() < need) {
      absl::StatusOr<cuda::DeviceBuffer> rows = cuda::DeviceBuffer::Allocate(need);
      if (!rows.ok()) return rows.status();
      m.mixer_rows = *std::move(rows);
    }
    m.decode_in_rows = in_rows;
  }
  absl::StatusOr<std::unique_ptr<cuda::MoeStage>> moe =
      cuda::MoeStage::Create(c, *m.dm, {options.mode == CudaMode::kFast && options.fast_expert_gemm, T});
  if (!moe.ok()) return moe.status();
  m.moe = *std::move(moe);
  if (m.shared_stack_rows > 0) {
    m.moe->SetSharedExpertFn([&m](int64_t layer, const float* x, int64_t n, float* shared, float* gate_logit,
                                  cudaStream_t st) {
      return m.SharedExpertStacked(layer, x, n, shared, gate_logit, st);
    });
  }
  absl::StatusOr<std::unique_ptr<cuda::ResidentExperts>> resident = cuda::ResidentExperts::Create(m.dm.get(), c.moe.E);
  if (!resident.ok()) return resident.status();
  m.experts = *std::move(resident);
  // Marks per step: a few per layer (engram, streams, mixer, route, experts, shared) plus the ends.
  absl::StatusOr<cuda::StageTimer> timer = cuda::StageTimer::Create(options.profile, static_cast<int>(12 * L + 16));
  if (!timer.ok()) return timer.status();
  m.timer.emplace(*std::move(timer));
  for (int64_t l = 0; l < c.n_layers; ++l) m.has_engram |= m.dm->layers[l].has_engram;
  if (options.cuda_graphs) m.graphs.emplace(std::max(1, options.graph_capacity));
  cuda::SetPdlEnabled(options.pdl);

  // State layout per sequence row.
  const GdnDims& gd = c.gdn;
  const AttnDims& ad = c.attn;
  m.attn_shape = {static_cast<int>(ad.nh), static_cast<int>(ad.kvh), static_cast<int>(ad.hd), static_cast<int>(ad.rot),
                  ad.eps};
  m.gdn_shape = {static_cast<int>(gd.nk), static_cast<int>(gd.nv), static_cast<int>(gd.dk), static_cast<int>(gd.dv),
                 static_cast<int>(gd.kk)};
  m.gdn_conv_off.assign(L, -1);
  m.gdn_ssm_off.assign(L, -1);
  m.engram_off.assign(L, -1);
  m.attn_slot.assign(L, -1);
  int64_t attn_layers = 0;
  for (int64_t l = 0; l < L; ++l) {
    if (c.is_gdn(l)) {
      m.gdn_conv_off[l] = m.recurrent_floats;
      m.recurrent_floats += (gd.conv_state_floats() + 3) / 4 * 4;
      m.gdn_ssm_off[l] = m.recurrent_floats;
      m.recurrent_floats += gd.ssm_state_floats();
    } else {
      m.attn_slot[l] = attn_layers++;
    }
    if (c.engram_index(l) >= 0) {
      m.engram_off[l] = m.recurrent_floats;
      m.recurrent_floats += (c.engram[c.engram_index(l)].conv_history() * c.width() + 3) / 4 * 4;
    }
  }
  m.recurrent_floats = std::max<int64_t>(m.recurrent_floats, 4);
  m.max_pages = (options.max_context + cuda::kKvPageSize - 1) / cuda::kKvPageSize;
  m.total_pages = options.kv_pages > 0 ? options.kv_pages : options.max_sequences * m.max_pages;
  m.kv_width = ad.kv_width();
  m.block_slots = ad.has_indexer() ? options.max_context / ad.cr + 1 : 1;

  const int64_t Ts = T * S * h, cd = gd.c_dim(), vw = gd.nv * gd.dv;
  int64_t lr = 1;
  for (const cuda::GpuLayer& l : m.dm->layers) lr = std::max({lr, l.attn_read.down.rows, l.ffn_read.down.rows});
  lr = std::max(lr, m.dm->output_read.down.rows);
  ArenaPlan plan;
  plan.Want(&m.recurrent, options.max_sequences * m.recurrent_floats);
  plan.Want(&m.checkpoint, options.max_sequences * m.recurrent_floats);
  m.k_pool.assign(attn_layers, nullptr);
  m.v_pool.assign(attn_layers, nullptr);
  m.index_keys.assign(attn_layers, nullptr);
  m.block_keys.assign(attn_layers, nullptr);
  for (int64_t i = 0; i < attn_layers; ++i) {
    plan.Want(&m.k_pool[i], m.total_pages * cuda::kKvPageSize * m.kv_width);
    plan.Want(&m.v_pool[i], m.total_pages * cuda::kKvPageSize * m.kv_width);
    if (ad.has_indexer()) {
      plan.Want(&m.index_keys[i], options.max_sequences * options.max_context * ad.di);
      plan.Want(&m.block_keys[i], options.max_sequences * m.block_slots * ad.di);
    }
  }
  plan.Want(&m.page_table, options.max_sequences * m.max_pages);
  for (float** p : {&m.H, &m.N, &m.hm}) plan.Want(p, Ts);
  for (float** p : {&m.x, &m.y, &m.xh}) plan.Want(p, T * h);
  plan.Want(&m.a, T * S);
  plan.Want(&m.hz, T * lr);
  if (c.gdn.nk > 0) {
    plan.Want(&m.qkv, T * cd);
    plan.Want(&m.conv, T * cd);
    plan.Want(&m.zg, T * vw);
    plan.Want(&m.go, T * vw);
    plan.Want(&m.ba, T * 2 * gd.nv);
    plan.Want(&m.g, T * gd.nv);
    plan.Want(&m.beta, T * gd.nv);
    // Prefill runs the chunked delta rule in passes of up to 2048 tokens through this scratch (one
    // pass over 8192 tokens measured even end to end on the H200, 2026-12-02, for 253 MB more).
    m.gdn_scratch_bytes = T > 1 ? cuda::GdnChunkedScratchBytes(m.gdn_shape, std::min<int64_t>(T, 2048)) : 0;
    if (m.gdn_scratch_bytes > 0) plan.Want(&m.gdn_scratch, (m.gdn_scratch_bytes + 3) / 4);
  }
  // The per-layer mixer outputs of fast one-token steps, only for a model with a layer whose output
  // product can add into them (RunGdn, AttnOutProduct): else no buffer, and no memset a step.
  bool mixer_out = false;
  for (const cuda::GpuLayer& l : m.dm->layers) {
    mixer_out |= l.kind == LayerKind::kGdn ? cuda::GdnDecodeOutFits(m.gdn_shape, l.ssm_out)
                                            : cuda::ColumnSplitMatVecFits(l.o);
  }
  m.mixer_out_stride = h;
  for (const cuda::GpuLayer& l : m.dm->layers) {
    m.mixer_out_stride = std::max(m.mixer_out_stride, cuda::RouteOutRows(h, l.route_rows));
  }
  if (options.mode == CudaMode::kFast && mixer_out) plan.Want(&m.mixer_out_y, c.n_layers * m.mixer_out_stride);
  // The GDN layers' polled rows (Impl::gdn_polled_rows): the widest stacked product, 16-byte rows,
  // one row for each layer that can use them (none for attention layers).
  m.gdn_polled_slot.assign(m.dm->layers.size(), -1);
  for (size_t i = 0; i < m.dm->layers.size(); ++i) {
    const cuda::GpuLayer& l = m.dm->layers[i];
    if (l.kind == LayerKind::kGdn && cuda::GdnDecodeOutFits(m.gdn_shape, l.ssm_out)) {
      m.gdn_polled_stride = std::max(m.gdn_polled_stride, (l.mixer_in.rows + 3) / 4 * 4);
      m.gdn_polled_slot[i] = m.gdn_polled_layers++;
    }
  }
  if (options.mode == CudaMode::kFast && m.gdn_polled_stride > 0) {
    plan.Want(&m.gdn_polled_rows, m.gdn_polled_layers * m.gdn_polled_stride);
  }
  if (options.mode == CudaMode::kFast && m.mixer_out_stride > h) {  // NormRoute::h_reads (RouteThroughOutFor)
    absl::StatusOr<cuda::DeviceBuffer> counter = cuda::DeviceBuffer::Allocate(sizeof(int));
    if (!counter.ok()) return counter.status();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(counter->get(), 0, sizeof(int)));
    m.route_h_reads = *std::move(counter);
  }
  plan.Want(&m.attn_scratch, static_cast<int64_t>(cuda::AttentionMaxScratchBytes(m.attn_shape) + 3) / 4);
  // One f16 tile set for every attention layer: each call converts the tiles it reads (attention.cuh).
  if (cuda::AttnKv16() && options.mode == CudaMode::kFast && options.fast_attention) {
    const size_t bytes = cuda::AttnKv16ScratchBytes(m.attn_shape, m.total_pages);
    if (bytes > 0) plan.Want(&m.attn_f16_tiles, static_cast<int64_t>(bytes));
  }
  plan.Want(&m.qg, T * ad.nh * 2 * ad.hd);
  plan.Want(&m.q, T * ad.nh * ad.hd);
  plan.Want(&m.ao, T * ad.nh * ad.hd);
  plan.Want(&m.kb, T * m.kv_width);
  plan.Want(&m.vb, T * m.kv_width);
  if (ad.has_indexer()) {
    plan.Want(&m.iqk, T * (ad.ih * ad.di + ad.di));
    plan.Want(&m.iq, T * ad.ih * ad.di);
    plan.Want(&m.scores, T * m.block_slots);
    plan.Want(&m.sel_blocks, T * (ad.keep + 1));
    plan.Want(&m.sel_counts, T);
  }
  plan.Want(&m.logits, T * c.vocab);
  plan.Want(&m.step_block, Impl::kStepPrefixInts + 5 * T);
  absl::StatusOr<cuda::DeviceArena> arena = cuda::DeviceArena::Create(plan.bytes());
  if (!arena.ok()) return arena.status();
  m.arena.emplace(*std::move(arena));
  if (absl::Status s = plan.Carve(*m.arena); !s.ok()) return s;
  m.step_ints = m.step_block + Impl::kStepPrefixInts;

  absl::StatusOr<cuda::PinnedBuffer> pt = cuda::PinnedBuffer::Allocate(
      static_cast<size_t>(options.max_sequences * m.max_pages) * sizeof(int32_t));
  if (!pt.ok()) return pt.status();
  m.host_page_table = *std::move(pt);
  std::fill(m.host_page_table.as<int32_t>(), m.host_page_table.as<int32_t>() + options.max_sequences * m.max_pages, 0);
  absl::StatusOr<cuda::PinnedBuffer> staging = cuda::PinnedBuffer::Allocate(static_cast<size_t>(Impl::kStepPrefixInts + 5 * T) * sizeof(int32_t));
  if (!staging.ok()) return staging.status();
  m.staging = *std::move(staging);
  absl::StatusOr<cuda::PinnedBuffer> hl = cuda::PinnedBuffer::Allocate(static_cast<size_t>(T * c.vocab) * sizeof(float));
  if (!hl.ok()) return hl.status();
  m.host_logits = *std::move(hl);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(m.page_table, 0, static_cast<size_t>(options.max_sequences * m.max_pages) * 4));
  // The attention scratch starts with the split tickets, which must start at zero (attention.cuh).
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(m.attn_scratch, 0, cuda::AttentionMaxScratchBytes(m.attn_shape)));

  for (int64_t r = options.max_sequences - 1; r >= 0; --r) m.free_rows.push_back(static_cast<int32_t>(r));
  for (int64_t p = m.total_pages - 1; p >= 0; --p) m.free_pages.push_back(static_cast<int32_t>(p));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

}  // namespace tandem
