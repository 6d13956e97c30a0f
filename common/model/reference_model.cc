#include "common/model/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/model_tokenizer.h"
#include "common/reference/attention.h"
#include "common/reference/engram.h"
#include "common/reference/matmul.h"
#include "common/reference/mtp.h"
#include "common/reference/streams.h"

namespace tandem {

ReferenceModel::ReferenceModel(std::unique_ptr<GgufFile> file, const ReferenceModelOptions& options)
    : file_(std::move(file)), options_(options), threads_(options.threads) {}

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::Open(
    const std::string& path, const ReferenceModelOptions& options) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  return FromFile(*std::move(file), options);
}

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::FromFile(
    std::unique_ptr<GgufFile> file, const ReferenceModelOptions& options) {
  std::unique_ptr<ReferenceModel> m(new ReferenceModel(std::move(file), options));
  absl::StatusOr<ModelConfig> config = ReadModelConfig(*m->file_);
  if (!config.ok()) return config.status();
  m->config_ = *std::move(config);
  absl::StatusOr<ModelWeights> weights = BindModelWeights(*m->file_, m->config_);
  if (!weights.ok()) return weights.status();
  m->weights_ = *std::move(weights);
  absl::StatusOr<Tokenizer> tokenizer = LoadTokenizer(*m->file_);
  if (!tokenizer.ok()) return tokenizer.status();
  m->tokenizer_ = std::make_unique<Tokenizer>(*std::move(tokenizer));
  if (m->tokenizer_->vocab_size() > m->config_.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        m->file_->source(), ": the tokenizer has ", m->tokenizer_->vocab_size(),
        " tokens but token_embd has only ", m->config_.vocab, " rows"));
  }
  m->pool_ = std::make_unique<StatePool>(StateLayout::ForModel(m->config_), options.max_state_pages);
  return m;
}

absl::StatusOr<std::unique_ptr<SequenceState>> ReferenceModel::NewSequence() {
  return SequenceState::Create(pool_.get());
}

uint64_t ReferenceModel::weight_bytes() const {
  uint64_t total = 0;
  for (const GgufTensorInfo& t : file_->tensors()) total += t.n_bytes;
  return total;
}

void ReferenceModel::Embed(const MatrixView& table, std::span<const int32_t> tokens, float* H) {
  const int64_t S = config_.n_streams, h = config_.h;
  ParallelFor(&threads_, 0, static_cast<int64_t>(tokens.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* row = H + t * S * h;
      DequantizeMatrixRow(table, tokens[t], row);
      for (int64_t s = 1; s < S; ++s) std::memcpy(row + s * h, row, h * sizeof(float));
    }
  });
}

absl::Status ReferenceModel::RunLayer(int64_t layer, std::span<Step> steps,
                                      std::span<const int64_t> starts, float* H, int64_t T,
                                      const ForwardOptions& options, MoeRouting* routing) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[layer];
  const int64_t S = c.n_streams, h = c.h;
  std::vector<float> x(T * h), y(T * h), a(T * S);

  // 1. Engram, per sequence (its rows depend on the sequence's token history).
  if (w.has_engram) {
    const EngramConfig& ec = c.engram[c.engram_index(layer)];
    int64_t off = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const int64_t n = static_cast<int64_t>(steps[i].tokens.size());
      std::vector<int64_t> rows(n * ec.rows_per_token());
      EngramRows(ec, weights_.engram_token_map, steps[i].seq->tokens(), starts[i], n, rows.data());
      EngramForward(w.engram, ec, rows.data(), H + off * S * h, n, S, h, c.eps,
                    steps[i].seq->engram_conv(layer), &threads_);
      off += n;
    }
  }

  // 2. Mixer: read, per-sequence mixer, inject.
  if (options.block_inputs != nullptr) (*options.block_inputs)[static_cast<size_t>(layer)].assign(H, H + T * S * h);
  StreamRead(w.attn_read, H, T, S, h, c.eps, x.data(), a.data(), &threads_);
  int64_t off = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    SequenceState* seq = steps[i].seq;
    const int64_t n = static_cast<int64_t>(steps[i].tokens.size());
    if (w.kind == LayerKind::kGdn) {
      GdnOptions go;
      go.mode = n > 1 ? options_.prefill_gdn_mode : GdnMode::kRecurrent;
      GdnForward(w.gdn, c.gdn, seq->gdn(layer), x.data() + off * h, n, y.data() + off * h, go,
                 &threads_);
    } else {
      float* margins = nullptr;
      if (options.select_margins != nullptr) {
        std::vector<float>& m = (*options.select_margins)[static_cast<size_t>(layer)];
        m.resize(static_cast<size_t>(T));
        margins = m.data() + off;
      }
      int32_t *sel_blocks = nullptr, *sel_counts = nullptr;
      if (options.selections != nullptr && c.attn.has_indexer()) {
        BlockSelection& sel = (*options.selections)[static_cast<size_t>(layer)];
        sel.keep = c.attn.keep;
        sel.blocks.resize(static_cast<size_t>(T * c.attn.keep), -1);
        sel.counts.resize(static_cast<size_t>(T), 0);
        sel_blocks = sel.blocks.data() + off * c.attn.keep;
        sel_counts = sel.counts.data() + off;
      }
      AttentionForward(w.attn, c.attn, seq->attention(layer), starts[i], x.data() + off * h, n,
                       y.data() + off * h, &threads_, margins, sel_blocks, sel_counts);
    }
    off += n;
  }
  StreamInject(H, T, S, h, a.data(), y.data());

  // 3. MoE over the whole batch.
  StreamRead(w.ffn_read, H, T, S, h, c.eps, x.data(), a.data(), &threads_);
  ReferenceExpertExecutor local(w.moe, &threads_);
  ExpertExecutor* executor = options.experts ? options.experts(layer) : nullptr;
  if (executor == nullptr) executor = &local;
  if (absl::Status s = MoeForward(w.moe, c.moe, x.data(), T, *executor, y.data(), &threads_, routing);
      !s.ok()) {
    return s;
  }
  StreamInject(H, T, S, h, a.data(), y.data());
  return absl::OkStatus();
}

absl::Status ReferenceModel::Forward(std::span<Step> steps, const ForwardOptions& options) {
  const ModelConfig& c = config_;
  const int64_t S = c.n_streams, h = c.h, V = c.vocab;
  int64_t T = 0;
  std::vector<int64_t> starts(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    if (st.seq == nullptr || st.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", i, ": no sequence or no tokens"));
    }
    for (size_t j = 0; j < st.tokens.size(); ++j) {
      if (st.tokens[j] < 0 || st.tokens[j] >= V) {
        return absl::InvalidArgumentError(absl::StrCat("step ", i, ": token ", j, " = ",
                                                       st.tokens[j], " is outside [0, ", V, ")"));
      }
    }
    starts[i] = st.seq->length();
    T += static_cast<int64_t>(st.tokens.size());
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    SequenceState* seq = steps[i].seq;
    const int64_t n = static_cast<int64_t>(steps[i].tokens.size());
    if (absl::Status s = seq->ReserveAttention(starts[i] + n); !s.ok()) return s;
    seq->SaveCheckpoint();
    seq->last_chunk_start = starts[i];
    seq->tokens().resize(starts[i]);
    seq->tokens().insert(seq->tokens().end(), steps[i].tokens.begin(), steps[i].tokens.end());
  }

  std::vector<int32_t> all_tokens;
  all_tokens.reserve(T);
  for (const Step& st : steps) all_tokens.insert(all_tokens.end(), st.tokens.begin(), st.tokens.end());
  std::vector<float> H(T * S * h);
  Embed(weights_.token_embd, all_tokens, H.data());

  if (options.routing != nullptr) options.routing->assign(c.n_layers, MoeRouting{});
  if (options.select_margins != nullptr) options.select_margins->assign(c.n_layers, std::vector<float>{});
  if (options.selections != nullptr) options.selections->assign(c.n_layers, BlockSelection{});
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    MoeRouting* routing = options.routing ? &(*options.routing)[layer] : nullptr;
    if (absl::Status s = RunLayer(layer, steps, starts, H.data(), T, options, routing); !s.ok()) {
      return s;
    }
  }

  // The head, and the MTP head's input (output_norm ⊙ ρ(H) when S = 1, else the final H).
  std::vector<float> x(T * h);
  StreamRead(weights_.output_read, H.data(), T, S, h, c.eps, x.data(), nullptr, &threads_);
  int64_t off = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    Step& st = steps[i];
    const int64_t n = static_cast<int64_t>(st.tokens.size());
    SequenceState* seq = st.seq;
    seq->set_length(starts[i] + n);
    if (c.nextn > 0) {
      // Keep every new position's MTP input until the draft head has consumed it.
      const int64_t row = S > 1 ? S * h : h;
      const float* src = S > 1 ? H.data() + off * S * h : x.data() + off * h;
      std::vector<float>& pending = seq->last_hidden();
      pending.resize((starts[i] - seq->mtp_length) * row);
      pending.insert(pending.end(), src, src + n * row);
    }
    if (st.logits != nullptr) {
      const int64_t first = st.all_positions ? 0 : n - 1;
      MatMul(weights_.output, x.data() + (off + first) * h, n - first, st.logits, &threads_);
    }
    off += n;
  }
  return absl::OkStatus();
}

absl::Status ReferenceModel::KeepFirst(SequenceState* seq, int64_t m) {
  const int64_t start = seq->last_chunk_start;
  const int64_t n = seq->length() - start;
  if (m < 0 || m > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("KeepFirst: m = ", m, " is outside [0, ", n, "] (the last chunk's size)"));
  }
  if (m == n) return absl::OkStatus();
  std::vector<int32_t> kept(seq->tokens().begin() + start, seq->tokens().begin() + start + m);
  // Back to the state before the chunk, then advance by its first m tokens again: the recurrent
  // state is restored exactly and the attention caches are rewritten position by position.
  seq->RestoreCheckpoint();
  seq->set_length(start);
  seq->tokens().resize(start);
  seq->TruncateAttention(start);
  const int64_t row = config_.n_streams > 1 ? config_.n_streams * config_.h : config_.h;
  seq->mtp_length = std::min(seq->mtp_length, start);
  seq->last_hidden().resize((start - seq->mtp_length) * row);
  if (m == 0) return absl::OkStatus();
  Step step{seq, kept, nullptr, false};
  return Forward(std::span<Step>(&step, 1));
}

absl::StatusOr<std::vector<int32_t>> ReferenceModel::DraftGreedy(SequenceState* seq,
                                                                 int32_t next_token, int k,
                                                                 std::vector<float>* draft_logits) {
  const ModelConfig& c = config_;
  if (c.nextn == 0) return absl::FailedPreconditionError("the model has no MTP draft head");
  if (seq->length() == 0) return absl::FailedPreconditionError("DraftGreedy on an empty sequence");
  if (next_token < 0 || next_token >= c.vocab || k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("DraftGreedy: next_token ", next_token,
                                                   " or k ", k, " out of range"));
  }
  const int64_t L = c.n_layers, S = c.n_streams, h = c.h, V = c.vocab;
  const LayerWeights& w = weights_.layers[L];
  const MatrixView& embed_table = w.mtp_embed.present() ? w.mtp_embed : weights_.token_embd;
  const MatrixView& head = w.mtp_head.present() ? w.mtp_head : weights_.output;
  const int64_t row = S > 1 ? S * h : h;
  const int64_t length = seq->length();
  if (absl::Status s = seq->ReserveAttention(length + k); !s.ok()) return s;

  // Pairs (hsrc_p, t_{p+1}) for the positions the draft head has not seen yet, the last of them
  // pairing the newest position with next_token. Pair p runs at position p of the MTP layer.
  std::vector<float> hsrc = seq->last_hidden();
  std::vector<int32_t> pair_tokens;
  for (int64_t p = seq->mtp_length; p < length; ++p) {
    pair_tokens.push_back(p + 1 < length ? seq->tokens()[p + 1] : next_token);
  }
  int64_t start = seq->mtp_length;
  std::vector<int32_t> drafts;
  if (draft_logits) draft_logits->assign(static_cast<size_t>(k) * V, 0.0f);
  std::vector<float> logits(V);
  for (int j = 0; j < k; ++j) {
    const int64_t n = static_cast<int64_t>(pair_tokens.size());
    std::vector<float> embd(n * h), Hp(n * S * h), x(n * h);
    for (int64_t t = 0; t < n; ++t) DequantizeMatrixRow(embed_table, pair_tokens[t], embd.data() + t * h);
    // With S = 1 the stored hsrc rows are already output_norm ⊙ ρ(H); MtpMixInputs applies hnorm.
    MtpMixInputs(w.mtp_in, hsrc.data(), embd.data(), n, S, h, c.eps, Hp.data(), &threads_);
    Step step{seq, pair_tokens, nullptr, false};
    const int64_t starts[1] = {start};
    if (absl::Status s = RunLayer(L, std::span<Step>(&step, 1), starts, Hp.data(), n,
                                  ForwardOptions{}, nullptr);
        !s.ok()) {
      return s;
    }
    StreamRead(w.mtp_head_read, Hp.data(), n, S, h, c.eps, x.data(), nullptr, &threads_);
    MatMul(head, x.data() + (n - 1) * h, 1, logits.data(), &threads_);
    const int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    drafts.push_back(best);
    if (draft_logits) std::copy(logits.begin(), logits.end(), draft_logits->begin() + j * V);
    if (j == 0) {
      // The committed positions are now in the MTP cache; drafts past them are overwritten later.
      seq->mtp_length = length;
      seq->last_hidden().clear();
    }
    // The next draft step continues from this one's own last state.
    const float* last = S > 1 ? Hp.data() + (n - 1) * S * h : x.data() + (n - 1) * h;
    hsrc.assign(last, last + row);
    pair_tokens.assign(1, best);
    start += n;
  }
  return drafts;
}

}  // namespace tandem
