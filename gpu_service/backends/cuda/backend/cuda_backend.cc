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
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/embedding.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"

namespace tandem {

using cuda::Stage;

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

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
uint64_t CudaBackend::state_bytes() const {
  return impl_->arena->capacity() + impl_->shared_gu.bytes() + impl_->mixer_rows.bytes();
}
uint64_t CudaBackend::prepared_weight_bytes() const {
  return impl_->gemm != nullptr ? static_cast<uint64_t>(impl_->gemm->prepared_bytes()) : 0;
}
int64_t CudaBackend::stacked_mixer_rows() const { return impl_->mixer_stack_rows; }
bool CudaBackend::dense_out_single() const {
  return impl_->gemm != nullptr && impl_->gemm->mode() == cuda::GemmMode::kFastSplit &&
         impl_->out_mode == cuda::GemmMode::kFast;
}
void CudaBackend::set_routing_sink(std::vector<MoeRouting>* routing) { impl_->routing_sink = routing; }
void CudaBackend::set_selection_sink(std::vector<BlockSelection>* selections) {
  impl_->selection_sink = selections;
}
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

Backend::LogitsBuffer CudaBackend::AllocateLogits(size_t floats) {
  void* p = nullptr;
  if (cudaMallocHost(&p, floats * sizeof(float)) != cudaSuccess) {
    (void)cudaGetLastError();
    return Backend::AllocateLogits(floats);  // pageable: Step stages its rows
  }
  return LogitsBuffer(static_cast<float*>(p), LogitsDeleter{[](float* q) { (void)cudaFreeHost(q); }});
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
  int32_t* host_ints = m.staging.as<int32_t>() + Impl::kStepPrefixInts;
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
  // Short prompts' tensor-core tile items cut into key-tile slices (PlanAttention's default
  // max_tc_splits; measured faster than whole items, docs/PERF.md "Seventh session").
  plan.attn = cuda::PlanAttention(token_seq, m.attn_shape,
                                  m.options.mode == CudaMode::kFast && m.options.fast_attention
                                      ? cuda::AttentionPrecision::kF16TensorCores
                                      : cuda::AttentionPrecision::kF32);
  const std::vector<int32_t>& items = plan.attn.items;
  std::copy(items.begin(), items.end(), host_ints + 3 * T_max);
  // The head's rows and, in the step's input block, the one-row head kernel's destination.
  m.PlanHead(plan, inputs);
  float* const head_dest = m.HeadDestination(inputs);
  std::memcpy(m.staging.get(), &head_dest, sizeof(head_dest));
  static_assert(sizeof(float*) <= Impl::kStepPrefixInts * sizeof(int32_t));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      m.step_block, m.staging.get(), (Impl::kStepPrefixInts + 3 * T_max + items.size()) * sizeof(int32_t),
      cudaMemcpyHostToDevice, st));

  // Embedding, layers, head: replayed as a graph when the step's shape allows, else enqueued.
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
  if (absl::Status s = m.EnqueueLogitsCopy(plan, inputs); !s.ok()) return s;
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
  // The step's accumulators are zeroed, and the polled rows filled, by extra blocks of the embedding
  // gather's launch (one node of the PDL chain instead of a memset node each before it);
  // TANDEM_OLD_STEP_MEMSETS=1: memsets.
  static const bool old_memsets = cuda::EnvSwitch("TANDEM_OLD_STEP_MEMSETS");
  cuda::GatherRanges ranges;
  if (absl::Status s = moe->PrepareStep(plan.tokens, st, old_memsets ? nullptr : &ranges); !s.ok()) return s;
  mixer_out_step =
      plan.tokens == 1 && mixer_out_y != nullptr && (cuda::GetGdnDecodeFused() >= 3 || cuda::AttnOutColumnSplit());
  if (mixer_out_step) {
    const size_t bytes = static_cast<size_t>(c->n_layers * mixer_out_stride) * sizeof(float);
    if (old_memsets || !ranges.Add(mixer_out_y, bytes)) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(mixer_out_y, 0, bytes, st));
    }
  }
  // The GDN layers' polled rows (RunGdn): unwritten (every byte 0xFF) until this step's products.
  if (mixer_out_step && gdn_polled_rows != nullptr && cuda::GdnRowsPolled()) {
    static_assert(cuda::kRowUnwrittenBits == 0xFFFFFFFFu, "a fill of 0xFF bytes");
    const size_t bytes = static_cast<size_t>(gdn_polled_layers * gdn_polled_stride) * sizeof(float);
    if (old_memsets || !ranges.Add(gdn_polled_rows, bytes, 0xFF)) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(gdn_polled_rows, 0xFF, bytes, st));
    }
  }
  timer->Mark(Stage::kStreams, st);
  if (absl::Status s = cuda::CudaStatus(
          cuda::LaunchEmbeddingGather(dm->token_embd, tokens_dev(), plan.tokens, c->n_streams, H, ranges, st),
          "embedding gather", __FILE__, __LINE__);
      !s.ok()) {
    return s;
  }
  if (routing_sink != nullptr) routing_sink->assign(static_cast<size_t>(c->n_layers), MoeRouting{});
  if (selection_sink != nullptr) selection_sink->assign(static_cast<size_t>(c->n_layers), BlockSelection{});
  inject_pending = false;
  inject_is_one = false;
  pending_shared = {};
  moe_y = nullptr;
  x_norm_in.reset();
  earlier_inject = {};
  for (int64_t layer = 0; layer < c->n_layers; ++layer) {
    if (absl::Status s = RunLayer(layer, plan); !s.ok()) return s;
  }
  if (x_norm_in.has_value() || earlier_inject.y != nullptr) {
    return absl::InternalError("a layer left its norm to a product that did not run, or its inject to no read");
  }
  if (absl::Status s = JoinPrefetches(); !s.ok()) return s;
  return EnqueueHead(plan, inputs);
}

bool CudaBackend::Impl::GraphKey(const StepPlan& plan, std::span<const Backend::StepInput> /*inputs*/,
                                 std::vector<int32_t>* key) const {
  // Only steps whose every layer plans on the device and whose kernels take nothing per step from
  // the host: decode (one token per sequence), no Engram (host-gathered rows), no indexer (block
  // counts as launch arguments), no profiling, routing or selection capture (they wait on the host).
  if (timer->enabled() || routing_sink != nullptr || selection_sink != nullptr || has_engram ||
      c->attn.has_indexer()) {
    return false;
  }
  if (plan.tokens > cuda::kDevicePlanMaxTokens) return false;
  // The kernels find each token's sequence state through device memory (seq_dev), so the key is the
  // batch size and which rows want logits, not which sequences run.
  key->assign(1, static_cast<int32_t>(plan.tokens));
  key->push_back(AttnOutFusedStep(plan) ? 1 : 0);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (plan.counts[i] != 1) return false;
    key->push_back(head_first[i] >= 0 ? 1 : 0);
  }
  return true;
}

bool CudaBackend::Impl::AttnOutFusedStep(const StepPlan& plan) const {
  return plan.tokens == 1 && plan.seqs.size() == 1 && cuda::AttnOutFused() &&
         plan.starts[0] + plan.counts[0] <= cuda::kAttnOutFusedMaxKeys;
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
