// Per-sequence model state (docs/MODEL.md §3) in fixed-size pages from one pool, so that many
// concurrent sequences do not each reserve the maximum context.
//
// A sequence owns: a fixed set of recurrent pages (every GDN layer's conv history and S matrix,
// every Engram layer's conv history, packed first-fit so that no piece straddles a page), the same
// number of checkpoint pages (the recurrent state as it was before the last Advance, for
// speculative rollback), and per attention layer (the MTP layer included) a page table of KV pages,
// each holding `positions_per_page` positions of K, V and the raw index key, plus the block keys of
// the indexer blocks inside it. Pages come from a StatePool and go back when the sequence dies.
#ifndef TANDEM_COMMON_MODEL_STATE_POOL_H_
#define TANDEM_COMMON_MODEL_STATE_POOL_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/reference/attention.h"
#include "common/reference/gdn.h"

namespace tandem {

// Where each piece of state lives, computed once from the config.
struct StateLayout {
  struct Piece {
    int64_t page = 0;    // index among the sequence's recurrent pages
    int64_t offset = 0;  // floats into that page
    int64_t floats = 0;
  };
  int64_t page_floats = 0;
  int64_t recurrent_pages = 0;
  std::vector<Piece> gdn_conv, gdn_ssm;   // per layer (unused entries for attention layers)
  std::vector<Piece> engram_conv;         // per layer (unused entries for non-Engram layers)
  std::vector<int64_t> attention_slot;    // per layer: index among attention layers, or -1
  int64_t attention_layers = 0;
  int64_t positions_per_page = 0;         // a multiple of the indexer block size
  int64_t kv_floats = 0;                  // per position: K and V (kvh·hd each)
  int64_t index_key_floats = 0;           // per position: di (0 without indexer)
  int64_t block_size = 0;                 // indexer cr (0 without indexer)

  static StateLayout ForModel(const ModelConfig& c);
};

// A thread-safe pool of equally sized, zero-initialised f32 pages.
class StatePool {
 public:
  // max_pages = 0: unbounded (pages are allocated on demand and kept for reuse).
  StatePool(const StateLayout& layout, int64_t max_pages);
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;

  const StateLayout& layout() const { return layout_; }
  // A zeroed page, or ResourceExhausted when max_pages are in use.
  absl::StatusOr<float*> Acquire();
  void Release(float* page);
  int64_t pages_in_use() const;
  int64_t max_pages() const { return max_pages_; }

 private:
  StateLayout layout_;
  int64_t max_pages_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<float[]>> storage_;  // every page ever made
  std::vector<float*> free_;
  int64_t in_use_ = 0;
};

// One sequence's state. Not thread-safe; one sequence is advanced by one caller at a time.
class SequenceState {
 public:
  static absl::StatusOr<std::unique_ptr<SequenceState>> Create(StatePool* pool);
  ~SequenceState();
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  int64_t length() const { return length_; }  // positions the main model has processed
  void set_length(int64_t n) { length_ = n; }
  // Token ids of positions [0, length) (and pending ones the caller appended).
  std::vector<int32_t>& tokens() { return tokens_; }

  GdnState gdn(int64_t layer);
  float* engram_conv(int64_t layer);
  // Makes positions [0, n) addressable in every attention layer's cache (acquires pages).
  absl::Status ReserveAttention(int64_t n);
  // The cache of an attention layer (valid until the next ReserveAttention/Truncate).
  AttentionCache& attention(int64_t layer);

  // Copies the recurrent state into the checkpoint / back from it.
  void SaveCheckpoint();
  void RestoreCheckpoint();
  // Releases KV pages past position n (the positions themselves are simply overwritten later).
  void TruncateAttention(int64_t n);

  // State the model keeps between steps: the final residual streams of the last position (the
  // MTP head's input), S·h floats; and the MTP layer's processed length.
  std::vector<float>& last_hidden() { return last_hidden_; }
  int64_t mtp_length = 0;
  // Where the last Forward chunk started (for KeepFirst).
  int64_t last_chunk_start = 0;

  int64_t pages() const;

 private:
  class PagedCache;
  explicit SequenceState(StatePool* pool);

  StatePool* pool_;
  int64_t length_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<float*> recurrent_;
  std::vector<float*> checkpoint_;
  std::vector<std::unique_ptr<PagedCache>> caches_;  // per attention slot
  std::vector<float> last_hidden_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_STATE_POOL_H_
