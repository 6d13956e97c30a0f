#include "gpu_service/backends/cuda/backend/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/backend_impl.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/embedding.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem {

using cuda::Stage;

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

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

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
// GEMMs) as near-f32 triples (the layer loop runs them "accurate"). Not the head: a prefill step sends only a few rows through it.
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
    for (const cuda::DeviceMatrix* w : {&l.qkv, &l.z, &l.ba, &l.ssm_out, &l.q, &l.k, &l.v, &l.o, &l.idx_qk}) {
      if (absl::Status s = prepare(*w, false); !s.ok()) return s;
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
  cuda::DenseGemmOptions go;
  go.mode = options.mode == CudaMode::kFast && options.fast_dense_gemm
                ? (options.fast_dense_split ? cuda::GemmMode::kFastSplit : cuda::GemmMode::kFast)
                : cuda::GemmMode::kExact;
  go.max_n = T;
  go.max_cols = std::max<int64_t>(MaxCols(*m.dm), 256);
  go.tile_bytes = std::max<int64_t>(128ll << 20, go.max_cols * 4);
  absl::StatusOr<std::unique_ptr<cuda::DenseGemm>> gemm = cuda::DenseGemm::Create(go);
  if (!gemm.ok()) return gemm.status();
  m.gemm = *std::move(gemm);
  if (absl::Status s = PrepareDenseWeights(m); !s.ok()) return s;
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
    // Prefill runs the chunked delta rule in passes of up to 2048 tokens through this scratch.
    m.gdn_scratch_bytes = T > 1 ? cuda::GdnChunkedScratchBytes(m.gdn_shape, std::min<int64_t>(T, 2048)) : 0;
    if (m.gdn_scratch_bytes > 0) plan.Want(&m.gdn_scratch, (m.gdn_scratch_bytes + 3) / 4);
  }
  plan.Want(&m.attn_scratch, static_cast<int64_t>(cuda::AttentionMaxScratchBytes(m.attn_shape) + 3) / 4);
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
  plan.Want(&m.step_ints, 5 * T);
  absl::StatusOr<cuda::DeviceArena> arena = cuda::DeviceArena::Create(plan.bytes());
  if (!arena.ok()) return arena.status();
  m.arena.emplace(*std::move(arena));
  if (absl::Status s = plan.Carve(*m.arena); !s.ok()) return s;

  absl::StatusOr<cuda::PinnedBuffer> pt = cuda::PinnedBuffer::Allocate(
      static_cast<size_t>(options.max_sequences * m.max_pages) * sizeof(int32_t));
  if (!pt.ok()) return pt.status();
  m.host_page_table = *std::move(pt);
  std::fill(m.host_page_table.as<int32_t>(), m.host_page_table.as<int32_t>() + options.max_sequences * m.max_pages, 0);
  absl::StatusOr<cuda::PinnedBuffer> staging = cuda::PinnedBuffer::Allocate(static_cast<size_t>(5 * T) * sizeof(int32_t));
  if (!staging.ok()) return staging.status();
  m.staging = *std::move(staging);
  absl::StatusOr<cuda::PinnedBuffer> hl = cuda::PinnedBuffer::Allocate(static_cast<size_t>(T * c.vocab) * sizeof(float));
  if (!hl.ok()) return hl.status();
  m.host_logits = *std::move(hl);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(m.page_table, 0, static_cast<size_t>(options.max_sequences * m.max_pages) * 4));

  for (int64_t r = options.max_sequences - 1; r >= 0; --r) m.free_rows.push_back(static_cast<int32_t>(r));
  for (int64_t p = m.total_pages - 1; p >= 0; --p) m.free_pages.push_back(static_cast<int32_t>(p));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

const ModelConfig& CudaBackend::config() const { return *impl_->c; }
const Tokenizer& CudaBackend::tokenizer() const { return impl_->model->tokenizer(); }
uint64_t CudaBackend::parameter_count() const {
  uint64_t total = 0;
  for (const GgufTensorInfo& t : impl_->model->file().tensors()) {
    total += static_cast<uint64_t>(t.n_elements);
  }
  return total;
}
uint64_t CudaBackend::weight_bytes() const { return impl_->dm->bytes; }
uint64_t CudaBackend::state_bytes() const { return impl_->arena->capacity(); }
void CudaBackend::set_routing_sink(std::vector<MoeRouting>* routing) { impl_->routing_sink = routing; }
std::string CudaDeviceUnavailableReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for whoever uses CUDA next
    return absl::StrCat("no usable CUDA device (", cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
  }
  if (count == 0) return "no CUDA device present";
  return "";
}

void CudaBackend::set_profile(bool on) { impl_->timer->set_enabled(on); }

int64_t CudaBackend::graph_captures() const { return impl_->graphs.has_value() ? impl_->graphs->captures() : 0; }
int64_t CudaBackend::graph_replays() const { return impl_->graphs.has_value() ? impl_->graphs->replays() : 0; }

std::string CudaBackend::last_profile() const {
  std::lock_guard<std::mutex> lock(impl_->profile_mu);
  return impl_->profile_line;
}

absl::StatusOr<SequenceSlot> CudaBackend::CreateSequence() {
  Impl& m = *impl_;
  if (m.free_rows.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("all ", m.options.max_sequences, " sequence slots are in use"));
  }
  CudaSequence s;
  s.row = m.free_rows.back();
  m.free_rows.pop_back();
  // A new sequence starts from zero recurrent state (GDN conv and S, Engram conv history).
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m.state(s), 0, static_cast<size_t>(m.recurrent_floats) * sizeof(float),
                                              m.stream.get()));
  const SequenceSlot slot = m.next_slot++;
  m.seqs.emplace(slot, std::move(s));
  return slot;
}

void CudaBackend::ReleaseSequence(SequenceSlot slot) {
  Impl& m = *impl_;
  auto it = m.seqs.find(slot);
  if (it == m.seqs.end()) return;
  for (int32_t p : it->second.pages) m.free_pages.push_back(p);
  m.pages_in_use -= static_cast<int64_t>(it->second.pages.size());
  m.free_rows.push_back(it->second.row);
  m.seqs.erase(it);
}

StateUsage CudaBackend::state_usage() const { return {impl_->pages_in_use.load(), impl_->total_pages}; }

ExpertPlacementTotals CudaBackend::placement() const {
  ExpertPlacementTotals t;
  t.local_rows = impl_->local_rows.load();
  return t;
}

absl::Status CudaBackend::Step(std::span<const StepInput> inputs) {
  Impl& m = *impl_;
  const ModelConfig& c = *m.c;
  if (inputs.empty()) return absl::OkStatus();
  const int64_t T_max = m.options.max_batch_tokens;
  StepPlan plan;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    auto it = m.seqs.find(in.slot);
    if (it == m.seqs.end()) return absl::NotFoundError(absl::StrCat("input ", i, ": unknown slot ", in.slot));
    if (in.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("input ", i, ": no tokens"));
    CudaSequence* s = &it->second;
    if (std::find(plan.seqs.begin(), plan.seqs.end(), s) != plan.seqs.end()) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, ": slot ", in.slot, " appears twice"));
    }
    for (size_t j = 0; j < in.tokens.size(); ++j) {
      if (in.tokens[j] < 0 || in.tokens[j] >= c.vocab) {
        return absl::InvalidArgumentError(absl::StrCat("input ", i, ": token ", j, " = ", in.tokens[j],
                                                       " is outside [0, ", c.vocab, ")"));
      }
    }
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (s->length + n > m.options.max_context) {
      return absl::OutOfRangeError(absl::StrCat("input ", i, ": ", s->length, " + ", n,
                                                       " positions exceed max_context = ", m.options.max_context));
    }
    plan.seqs.push_back(s);
    plan.starts.push_back(s->length);
    plan.counts.push_back(n);
    plan.offsets.push_back(plan.tokens);
    plan.tokens += n;
  }
  if (plan.tokens > T_max) {
    return absl::InvalidArgumentError(absl::StrCat("the step has ", plan.tokens, " tokens; max_batch_tokens = ", T_max));
  }
  cudaStream_t st = m.stream.get();
  m.timer->Begin();
  m.timer->Mark(Stage::kIo, st);

  // Room in the KV cache for the whole step, checked before anything changes: ResourceExhausted
  // leaves every slot as it was, so the engine can retry with fewer sequences (backend.h).
  {
    int64_t new_pages = 0;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const int64_t need = (plan.starts[i] + plan.counts[i] + cuda::kKvPageSize - 1) / cuda::kKvPageSize;
      new_pages += std::max<int64_t>(0, need - static_cast<int64_t>(plan.seqs[i]->pages.size()));
    }
    if (new_pages > static_cast<int64_t>(m.free_pages.size())) {
      return absl::ResourceExhaustedError(absl::StrCat("the step needs ", new_pages, " more KV pages of ",
                                                       cuda::kKvPageSize, " positions; ", m.free_pages.size(),
                                                       " of ", m.total_pages, " are free"));
    }
  }
  // KV pages, checkpoints of the recurrent state (for KeepFirst), token histories.
  int32_t* host_ints = m.staging.as<int32_t>();
  std::vector<int32_t> token_seq(static_cast<size_t>(plan.tokens));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    CudaSequence& s = *plan.seqs[i];
    const int64_t start = plan.starts[i], n = plan.counts[i];
    const int64_t need = (start + n + cuda::kKvPageSize - 1) / cuda::kKvPageSize;
    const size_t had = s.pages.size();
    while (static_cast<int64_t>(s.pages.size()) < need) {
      if (m.free_pages.empty()) {
        return absl::ResourceExhaustedError(absl::StrCat("out of KV pages (", m.total_pages, " of ",
                                                         cuda::kKvPageSize, " positions)"));
      }
      s.pages.push_back(m.free_pages.back());
      m.free_pages.pop_back();
      ++m.pages_in_use;
    }
    if (s.pages.size() != had) {
      int32_t* row = m.host_page_table.as<int32_t>() + s.row * m.max_pages;
      std::copy(s.pages.begin(), s.pages.end(), row);
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.page_table + s.row * m.max_pages, row,
                                                  s.pages.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    }
    if (inputs[i].rewindable) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.checkpoint + s.row * m.recurrent_floats, m.state(s),
                                                  static_cast<size_t>(m.recurrent_floats) * sizeof(float),
                                                  cudaMemcpyDeviceToDevice, st));
    }
    s.rewindable = inputs[i].rewindable;
    s.last_chunk_start = start;
    s.tokens.resize(static_cast<size_t>(start));
    s.tokens.insert(s.tokens.end(), inputs[i].tokens.begin(), inputs[i].tokens.end());
    for (int64_t t = 0; t < n; ++t) {
      const int64_t r = plan.offsets[i] + t;
      host_ints[r] = inputs[i].tokens[t];
      host_ints[T_max + r] = s.row;
      host_ints[2 * T_max + r] = static_cast<int32_t>(start + t);
      token_seq[r] = s.row;
    }
  }
  plan.attn = cuda::PlanAttention(token_seq, m.attn_shape,
                                  m.options.mode == CudaMode::kFast && m.options.fast_attention
                                      ? cuda::AttentionPrecision::kF16TensorCores
                                      : cuda::AttentionPrecision::kF32);
  const std::vector<int32_t>& items = plan.attn.items;
  std::copy(items.begin(), items.end(), host_ints + 3 * T_max);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.step_ints, host_ints, (3 * T_max + items.size()) * sizeof(int32_t),
                                              cudaMemcpyHostToDevice, st));

  // Embedding, layers, head: replayed as a graph when the step's shape allows, else enqueued.
  m.PlanHead(plan, inputs);
  std::vector<int32_t> key;
  bool ran = false;
  if (m.graphs.has_value() && !m.graphs_refused && m.GraphKey(plan, inputs, &key)) {
    absl::Status s = m.graphs->Launch(key, st, [&] { return m.EnqueueForward(plan, inputs); });
    if (s.ok()) {
      ran = true;
      m.local_rows += static_cast<uint64_t>(plan.tokens * c.moe.K * c.n_layers);
    } else if (absl::IsUnavailable(s)) {
      fprintf(stderr, "cuda backend: decode steps run without CUDA graphs from now on (%s)\n", s.ToString().c_str());
      m.graphs_refused = true;
    } else {
      return s;
    }
  }
  if (!ran) {
    if (absl::Status s = m.EnqueueForward(plan, inputs); !s.ok()) return s;
  }
  if (absl::Status s = m.moe->EnqueueErrorReadback(st); !s.ok()) return s;
  if (absl::Status s = m.timer->Finish(st); !s.ok()) return s;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st));
  if (absl::Status s = m.moe->CheckDeviceErrors(); !s.ok()) return s;
  m.CopyLogitsOut(plan, inputs);
  for (size_t i = 0; i < plan.seqs.size(); ++i) plan.seqs[i]->length = plan.starts[i] + plan.counts[i];
  if (m.timer->enabled()) {
    std::string line = m.timer->Line(plan.tokens, static_cast<int64_t>(plan.seqs.size()));
    if (m.options.print_profile) fprintf(stderr, "cuda step: %s\n", line.c_str());
    std::lock_guard<std::mutex> lock(m.profile_mu);
    m.profile_line = std::move(line);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::EnqueueForward(const StepPlan& plan, std::span<const Backend::StepInput> inputs) {
  cudaStream_t st = stream.get();
  timer->Mark(Stage::kStreams, st);
  if (absl::Status s = cuda::CudaStatus(
          cuda::LaunchEmbeddingGather(dm->token_embd, tokens_dev(), plan.tokens, c->n_streams, H, st),
          "embedding gather", __FILE__, __LINE__);
      !s.ok()) {
    return s;
  }
  if (routing_sink != nullptr) routing_sink->assign(static_cast<size_t>(c->n_layers), MoeRouting{});
  inject_pending = false;
  inject_is_one = false;
  for (int64_t layer = 0; layer < c->n_layers; ++layer) {
    if (absl::Status s = RunLayer(layer, plan); !s.ok()) return s;
  }
  if (absl::Status s = JoinPrefetches(); !s.ok()) return s;
  return EnqueueHead(plan, inputs);
}

bool CudaBackend::Impl::GraphKey(const StepPlan& plan, std::span<const Backend::StepInput> /*inputs*/,
                                 std::vector<int32_t>* key) const {
  // Only steps whose every layer plans on the device and whose kernels take nothing per step from
  // the host: decode (one token per sequence), no Engram (host-gathered rows), no indexer (block
  // counts as launch arguments), no profiling or routing capture (both wait on the host).
  if (timer->enabled() || routing_sink != nullptr || has_engram || c->attn.has_indexer()) return false;
  if (plan.tokens > cuda::kDevicePlanMaxTokens) return false;
  // The kernels find each token's sequence state through device memory (seq_dev), so the key is the
  // batch size and which rows want logits, not which sequences run.
  key->assign(1, static_cast<int32_t>(plan.tokens));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (plan.counts[i] != 1) return false;
    key->push_back(head_first[i] >= 0 ? 1 : 0);
  }
  return true;
}

absl::Status CudaBackend::KeepFirst(SequenceSlot slot, int64_t keep) {
  Impl& m = *impl_;
  auto it = m.seqs.find(slot);
  if (it == m.seqs.end()) return absl::NotFoundError(absl::StrCat("KeepFirst: unknown slot ", slot));
  CudaSequence& s = it->second;
  const int64_t start = s.last_chunk_start, n = s.length - start;
  if (keep < 0 || keep > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("KeepFirst: m = ", keep, " is outside [0, ", n, "] (the last chunk's size)"));
  }
  if (keep == n) return absl::OkStatus();
  if (!s.rewindable) {
    return absl::FailedPreconditionError("KeepFirst: the slot's last step was not rewindable (StepInput::rewindable)");
  }
  // Back to the state before the chunk (the checkpoint), then advance by its first m tokens
  // again: the recurrent state is restored exactly and the KV positions are rewritten.
  const std::vector<int32_t> kept(s.tokens.begin() + start, s.tokens.begin() + start + keep);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.state(s), m.checkpoint + s.row * m.recurrent_floats,
                                              static_cast<size_t>(m.recurrent_floats) * sizeof(float),
                                              cudaMemcpyDeviceToDevice, m.stream.get()));
  s.length = start;
  s.tokens.resize(static_cast<size_t>(start));
  const size_t need = static_cast<size_t>((start + cuda::kKvPageSize - 1) / cuda::kKvPageSize);
  while (s.pages.size() > need) {
    m.free_pages.push_back(s.pages.back());
    s.pages.pop_back();
    --m.pages_in_use;
  }
  if (keep == 0) return cuda::CudaStatus(cudaStreamSynchronize(m.stream.get()), "KeepFirst", __FILE__, __LINE__);
  const StepInput again{slot, kept, nullptr, false};
  return Step(std::span<const StepInput>(&again, 1));
}

}  // namespace tandem
