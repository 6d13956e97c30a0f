// Gated full attention with optional query-selected sparse attention (docs/MODEL.md §4.5).
#ifndef TANDEM_COMMON_REFERENCE_ATTENTION_H_
#define TANDEM_COMMON_REFERENCE_ATTENTION_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

struct AttnDims {
  int64_t h = 0;    // model width
  int64_t nh = 0;   // query heads
  int64_t kvh = 0;  // key/value heads (nh is a multiple)
  int64_t hd = 0;   // head dim
  int64_t rot = 0;  // rotated dims (even, <= hd; also <= di with an indexer)
  double theta = 10000.0;
  float eps = 1e-6f;
  // Indexer (qwen4exp); ih = 0: dense attention.
  int64_t ih = 0;    // index query heads
  int64_t di = 0;    // index head dim
  int64_t cr = 0;    // positions per block
  int64_t keep = 0;  // blocks selected besides the query's own

  bool has_indexer() const { return ih > 0; }
  int64_t kv_width() const { return kvh * hd; }
};

struct AttnWeights {
  MatrixView q;        // attn_q {h, nh·2·hd}: per head hd query rows then hd gate rows
  MatrixView k;        // attn_k {h, kvh·hd}
  MatrixView v;        // attn_v {h, kvh·hd}
  MatrixView output;   // attn_output {nh·hd, h}
  VectorView q_norm;   // attn_q_norm {hd}
  VectorView k_norm;   // attn_k_norm {hd}
  // Indexer; absent when dims.ih == 0.
  MatrixView idx_qk;      // attn_idx_qk {h, ih·di + di}: ih query heads, then the index key
  VectorView idx_q_norm;  // {di}
  VectorView idx_k_norm;  // {di}
};

absl::Status CheckAttnWeights(const AttnWeights& w, const AttnDims& d);

// One sequence's attention memory, addressed by position. Implementations back it with whatever
// storage they like (fixed-size pages in the service); every pointer returned addresses f32 data
// that stays valid and unmoved for the duration of one AttentionForward call. The caller makes
// positions [0, start_pos + n) addressable before AttentionForward(start_pos, n). The accessors are
// called concurrently from the pool's threads, so they must be pure lookups.
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  virtual float* key(int64_t pos) = 0;          // kvh·hd: K after norm and RoPE
  virtual float* value(int64_t pos) = 0;        // kvh·hd
  virtual float* index_key(int64_t pos) = 0;    // di: the raw index key (indexer only)
  virtual float* block_key(int64_t block) = 0;  // di: K_b (indexer only)
};

// The plain implementation: contiguous arrays for up to `capacity` positions.
class ContiguousAttentionCache : public AttentionCache {
 public:
  ContiguousAttentionCache(const AttnDims& d, int64_t capacity);
  float* key(int64_t pos) override { return keys_.data() + pos * kv_width_; }
  float* value(int64_t pos) override { return values_.data() + pos * kv_width_; }
  float* index_key(int64_t pos) override { return index_keys_.data() + pos * di_; }
  float* block_key(int64_t block) override { return block_keys_.data() + block * di_; }
  int64_t capacity() const { return capacity_; }

 private:
  int64_t capacity_, kv_width_, di_;
  std::vector<float> keys_, values_, index_keys_, block_keys_;
};

// Indexer scores of the nb complete blocks before the query's own: s_b = Σ_j ReLU(⟨iq_j, K_b⟩)/√di,
// iq holding the ih index queries (after norm and RoPE), ih × di.
void IndexerBlockScores(const AttnDims& d, AttentionCache& cache, const float* iq, int64_t nb,
                        float* scores);

// The blocks attended besides the query's own, ascending: all of them when scores.size() <= keep,
// else the keep highest scores (ties: the lower block).
std::vector<int64_t> SelectTopBlocks(std::span<const float> scores, int64_t keep);

// The blocks each of n positions of one attention layer attends besides its own block, positions in
// step order: position t's ids, ascending, are blocks[t·keep .. t·keep + counts[t]): SelectTopBlocks
// of its block scores, or every earlier block (counts[t] = p / cr) where p / cr <= keep. A block
// selection is a discrete choice like a routing pick; tests compare the ids as sets.
struct BlockSelection {
  int64_t keep = 0;
  std::vector<int32_t> blocks;  // n × keep
  std::vector<int32_t> counts;  // n
  std::span<const int32_t> of(int64_t t) const {
    return std::span<const int32_t>(blocks).subspan(static_cast<size_t>(t * keep), static_cast<size_t>(counts[t]));
  }
};

// Appends positions start_pos .. start_pos + n − 1 (x: n × h) to `cache` (K and V after norm and
// RoPE; with the indexer the raw index keys, and the block key of every block completed) and writes
// their causal attention outputs y (n × h). Earlier positions must already be in the cache.
// select_margin, when non-null, receives n floats: for a position that selects blocks, how close
// the selection came to another one, (s_keep − s_keep+1) / max(|s_keep|, 1e-30) of its sorted
// block scores (0 for a tie); +inf where every block is attended (no indexer, or p / cr <= keep).
// A rounding difference of that relative size in the scores can flip the selection (tests compare
// fast-mode logits only where nothing could have flipped).
// selected_blocks / selected_counts, when non-null (both or neither), receive the attended blocks
// besides the own one in BlockSelection's layout: n × keep ids (ascending, unused entries left
// alone) and n counts; without an indexer every count is 0.
void AttentionForward(const AttnWeights& w, const AttnDims& d, AttentionCache& cache,
                      int64_t start_pos, const float* x, int64_t n, float* y, ThreadPool* pool,
                      float* select_margin = nullptr, int32_t* selected_blocks = nullptr,
                      int32_t* selected_counts = nullptr);

// The select_margin of AttentionForward for one position's block scores (more than keep of them).
float SelectMargin(std::span<const float> scores, int64_t keep);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_ATTENTION_H_
