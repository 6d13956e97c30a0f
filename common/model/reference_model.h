// The CPU reference engine: a loaded model and the layer loop (docs/MODEL.md §4.2) that advances
// sequences, composing the blocks of common/reference. It is the oracle every other path is
// checked against and the engine of the CPU backend.
//
//   auto model = ReferenceModel::Open("tiny.gguf", {});
//   auto seq = (*model)->NewSequence();
//   std::vector<float> logits((*model)->config().vocab);
//   ReferenceModel::Step step{seq->get(), prompt_ids, logits.data()};
//   (*model)->Forward(absl::MakeSpan(&step, 1));
#ifndef TANDEM_COMMON_MODEL_REFERENCE_MODEL_H_
#define TANDEM_COMMON_MODEL_REFERENCE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/state_pool.h"
#include "common/reference/attention.h"
#include "common/reference/gdn.h"
#include "common/reference/moe.h"
#include "common/reference/thread_pool.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

struct ReferenceModelOptions {
  int threads = 0;                 // 0: every hardware thread
  int64_t max_state_pages = 0;     // 0: unbounded
  // GDN form for chunks of more than one token (decode always runs the recurrent form).
  GdnMode prefill_gdn_mode = GdnMode::kChunked;
};

class ReferenceModel {
 public:
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> Open(const std::string& path,
                                                              const ReferenceModelOptions& options);
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> FromFile(
      std::unique_ptr<GgufFile> file, const ReferenceModelOptions& options);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& file() const { return *file_; }
  StatePool& state_pool() { return *pool_; }
  ThreadPool* threads() { return &threads_; }

  absl::StatusOr<std::unique_ptr<SequenceState>> NewSequence();

  // One sequence's share of a step: its new tokens (appended at its current length).
  struct Step {
    SequenceState* seq = nullptr;
    std::span<const int32_t> tokens;
    // Receives vocab floats for the last new position, or tokens.size() × vocab when
    // all_positions; nullptr: no logits.
    float* logits = nullptr;
    bool all_positions = false;
  };

  // Where the routed experts of a layer are computed; nullptr from the factory (or no factory):
  // here, by the reference executor.
  using ExecutorFactory = std::function<ExpertExecutor*(int64_t layer)>;
  struct ForwardOptions {
    ExecutorFactory experts;
    // When non-null, receives the routing of every MoE layer: (*routing)[layer] for the batch's
    // tokens in step order.
    std::vector<MoeRouting>* routing = nullptr;
    // When non-null, receives every attention layer's block-selection margins
    // (AttentionForward's select_margin): (*select_margins)[layer] for the batch's tokens in step
    // order (empty for the other layers).
    std::vector<std::vector<float>>* select_margins = nullptr;
    // When non-null, receives every attention layer's block selections (AttentionForward's
    // selected blocks): (*selections)[layer] for the batch's tokens in step order, keep = the
    // indexer's keep; empty (keep 0, no entries) for GDN layers and attention without an indexer.
    std::vector<BlockSelection>* selections = nullptr;
    // When non-null, receives every layer's residual rows H as its mixer reads them (after Engram):
    // (*block_inputs)[layer], T × S × h for the batch's tokens in step order.
    std::vector<std::vector<float>>* block_inputs = nullptr;
  };

  // Advances every step's sequence by its tokens, the sequences batched through each layer. Before
  // changing any state, each sequence's recurrent state is checkpointed (for KeepFirst).
  absl::Status Forward(std::span<Step> steps, const ForwardOptions& options);
  absl::Status Forward(std::span<Step> steps) { return Forward(steps, ForwardOptions{}); }

  // Keeps only the first m positions of the sequence's last Forward chunk (speculative
  // verification): the state becomes exactly that of having advanced by those m tokens.
  absl::Status KeepFirst(SequenceState* seq, int64_t m);

  // MTP drafting (nextn = 1): given the token that follows the sequence, drafts k more tokens
  // greedily with the draft head (docs/MODEL.md §4.7). The main model's state is unchanged.
  // draft_logits, when non-null, receives k × vocab floats.
  absl::StatusOr<std::vector<int32_t>> DraftGreedy(SequenceState* seq, int32_t next_token, int k,
                                                   std::vector<float>* draft_logits = nullptr);

  // Total weight bytes of the file's tensors (for throughput reports).
  uint64_t weight_bytes() const;

 private:
  ReferenceModel(std::unique_ptr<GgufFile> file, const ReferenceModelOptions& options);
  // Runs one layer (Engram, mixer, MoE) over a batch of sequence chunks; H is T × S × h.
  absl::Status RunLayer(int64_t layer, std::span<Step> steps, std::span<const int64_t> starts,
                        float* H, int64_t T, const ForwardOptions& options, MoeRouting* routing);
  void Embed(const MatrixView& table, std::span<const int32_t> tokens, float* H);

  std::unique_ptr<GgufFile> file_;
  ReferenceModelOptions options_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<StatePool> pool_;
  ThreadPool threads_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_REFERENCE_MODEL_H_
