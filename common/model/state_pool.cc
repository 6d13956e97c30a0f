#include "common/model/state_pool.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {

StateLayout StateLayout::ForModel(const ModelConfig& c) {
  StateLayout l;
  const int64_t total = c.n_layers + c.nextn;
  const AttnDims& a = c.attn;
  l.kv_floats = 2 * a.kvh * a.hd;
  l.index_key_floats = a.has_indexer() ? a.di : 0;
  l.block_size = a.has_indexer() ? a.cr : 0;
  // 64 positions per page, rounded up to whole indexer blocks.
  l.positions_per_page = 64;
  if (l.block_size > 0) {
    l.positions_per_page = (l.positions_per_page + l.block_size - 1) / l.block_size * l.block_size;
  }
  const int64_t blocks_per_page = l.block_size > 0 ? l.positions_per_page / l.block_size : 0;
  const int64_t kv_page = l.positions_per_page * (l.kv_floats + l.index_key_floats) +
                          blocks_per_page * l.index_key_floats;

  // Recurrent pieces, largest first for the page size.
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < total; ++i) {
    if (c.is_gdn(i)) {
      sizes.push_back(c.gdn.conv_state_floats());
      sizes.push_back(c.gdn.ssm_state_floats());
    }
    if (const int64_t e = c.engram_index(i); e >= 0) {
      sizes.push_back(c.engram[e].conv_history() * c.width());
    }
  }
  l.page_floats = kv_page;
  for (int64_t s : sizes) l.page_floats = std::max(l.page_floats, s);
  l.page_floats = std::max<int64_t>(l.page_floats, 16);

  // First-fit packing of the pieces into recurrent pages.
  std::vector<int64_t> used;  // floats used per page
  auto place = [&](int64_t floats) {
    Piece p{0, 0, floats};
    if (floats == 0) return p;
    for (size_t i = 0; i < used.size(); ++i) {
      if (used[i] + floats <= l.page_floats) {
        p.page = static_cast<int64_t>(i);
        p.offset = used[i];
        used[i] += floats;
        return p;
      }
    }
    used.push_back(floats);
    p.page = static_cast<int64_t>(used.size()) - 1;
    return p;
  };
  l.gdn_conv.resize(total);
  l.gdn_ssm.resize(total);
  l.engram_conv.resize(total);
  l.attention_slot.assign(total, -1);
  for (int64_t i = 0; i < total; ++i) {
    if (c.is_gdn(i)) {
      l.gdn_conv[i] = place(c.gdn.conv_state_floats());
      l.gdn_ssm[i] = place(c.gdn.ssm_state_floats());
    } else {
      l.attention_slot[i] = l.attention_layers++;
    }
    if (const int64_t e = c.engram_index(i); e >= 0) {
      l.engram_conv[i] = place(c.engram[e].conv_history() * c.width());
    }
  }
  l.recurrent_pages = static_cast<int64_t>(used.size());
  return l;
}

StatePool::StatePool(const StateLayout& layout, int64_t max_pages)
    : layout_(layout), max_pages_(max_pages) {}

absl::StatusOr<float*> StatePool::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_pages_ > 0 && in_use_ >= max_pages_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the state pool is full (", max_pages_, " pages of ",
                     layout_.page_floats * 4, " bytes in use)"));
  }
  float* page;
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
    std::memset(page, 0, layout_.page_floats * sizeof(float));
  } else {
    storage_.push_back(std::make_unique<float[]>(layout_.page_floats));  // value-initialised: zeros
    page = storage_.back().get();
  }
  ++in_use_;
  return page;
}

void StatePool::Release(float* page) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(page);
  --in_use_;
}

int64_t StatePool::pages_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

// One attention layer's cache over KV pages.
class SequenceState::PagedCache : public AttentionCache {
 public:
  explicit PagedCache(const StateLayout& l) : l_(l) {}
  float* key(int64_t pos) override { return slot(pos); }
  float* value(int64_t pos) override { return slot(pos) + l_.kv_floats / 2; }
  float* index_key(int64_t pos) override { return slot(pos) + l_.kv_floats; }
  float* block_key(int64_t block) override {
    const int64_t per_page = l_.positions_per_page / l_.block_size;
    return pages[block / per_page] +
           l_.positions_per_page * (l_.kv_floats + l_.index_key_floats) +
           (block % per_page) * l_.index_key_floats;
  }
  std::vector<float*> pages;

 private:
  float* slot(int64_t pos) {
    return pages[pos / l_.positions_per_page] +
           (pos % l_.positions_per_page) * (l_.kv_floats + l_.index_key_floats);
  }
  const StateLayout& l_;
};

SequenceState::SequenceState(StatePool* pool) : pool_(pool) {}

absl::StatusOr<std::unique_ptr<SequenceState>> SequenceState::Create(StatePool* pool) {
  std::unique_ptr<SequenceState> s(new SequenceState(pool));
  const StateLayout& l = pool->layout();
  for (int64_t i = 0; i < 2 * l.recurrent_pages; ++i) {
    absl::StatusOr<float*> page = pool->Acquire();
    if (!page.ok()) return page.status();  // the destructor returns what was taken
    (i < l.recurrent_pages ? s->recurrent_ : s->checkpoint_).push_back(*page);
  }
  for (int64_t i = 0; i < l.attention_layers; ++i) {
    s->caches_.push_back(std::make_unique<PagedCache>(pool->layout()));
  }
  return s;
}

SequenceState::~SequenceState() {
  for (float* p : recurrent_) pool_->Release(p);
  for (float* p : checkpoint_) pool_->Release(p);
  for (auto& c : caches_) {
    for (float* p : c->pages) pool_->Release(p);
  }
}

GdnState SequenceState::gdn(int64_t layer) {
  const StateLayout& l = pool_->layout();
  const StateLayout::Piece& conv = l.gdn_conv[layer];
  const StateLayout::Piece& ssm = l.gdn_ssm[layer];
  return GdnState{recurrent_[conv.page] + conv.offset, recurrent_[ssm.page] + ssm.offset};
}

float* SequenceState::engram_conv(int64_t layer) {
  const StateLayout::Piece& p = pool_->layout().engram_conv[layer];
  return recurrent_[p.page] + p.offset;
}

absl::Status SequenceState::ReserveAttention(int64_t n) {
  const int64_t need = (n + pool_->layout().positions_per_page - 1) /
                       pool_->layout().positions_per_page;
  for (auto& c : caches_) {
    while (static_cast<int64_t>(c->pages.size()) < need) {
      absl::StatusOr<float*> page = pool_->Acquire();
      if (!page.ok()) return page.status();
      c->pages.push_back(*page);
    }
  }
  return absl::OkStatus();
}

AttentionCache& SequenceState::attention(int64_t layer) {
  return *caches_[pool_->layout().attention_slot[layer]];
}

void SequenceState::SaveCheckpoint() {
  const int64_t bytes = pool_->layout().page_floats * sizeof(float);
  for (size_t i = 0; i < recurrent_.size(); ++i) std::memcpy(checkpoint_[i], recurrent_[i], bytes);
}

void SequenceState::RestoreCheckpoint() {
  const int64_t bytes = pool_->layout().page_floats * sizeof(float);
  for (size_t i = 0; i < recurrent_.size(); ++i) std::memcpy(recurrent_[i], checkpoint_[i], bytes);
}

void SequenceState::TruncateAttention(int64_t n) {
  const int64_t keep = (n + pool_->layout().positions_per_page - 1) /
                       pool_->layout().positions_per_page;
  for (auto& c : caches_) {
    while (static_cast<int64_t>(c->pages.size()) > keep) {
      pool_->Release(c->pages.back());
      c->pages.pop_back();
    }
  }
}

int64_t SequenceState::pages() const {
  int64_t n = static_cast<int64_t>(recurrent_.size() + checkpoint_.size());
  for (const auto& c : caches_) n += static_cast<int64_t>(c->pages.size());
  return n;
}

}  // namespace tandem
