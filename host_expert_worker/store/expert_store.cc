#include "host_expert_worker/store/expert_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/offload/model_fingerprint.h"

namespace tandem {

absl::StatusOr<ExpertShare> ParseExpertShare(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, '/');
  ExpertShare share;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &share.index) ||
      !absl::SimpleAtoi(parts[1], &share.count) || share.count < 1 || share.index < 0 ||
      share.index >= share.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("--share '", text, "' must be K/N with 0 <= K < N, e.g. 0/1 or 1/2"));
  }
  return share;
}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Load(const GgufFile& file,
                                                               const ExpertStoreOptions& options,
                                                               WorkerThreadPool* pool) {
  absl::StatusOr<ModelConfig> config = ReadModelConfig(file);
  if (!config.ok()) return config.status();
  absl::StatusOr<ModelWeights> weights = BindModelWeights(file, *config);
  if (!weights.ok()) return weights.status();
  if (absl::Status s = CheckNumaNode(options.numa_node); !s.ok()) return s;

  std::unique_ptr<ExpertStore> store(new ExpertStore());
  const uint32_t layer_count = static_cast<uint32_t>(weights->layers.size());
  const uint32_t experts = static_cast<uint32_t>(config->moe.E);
  ExpertModelShape& shape = store->shape_;
  shape.layer_count = layer_count;
  shape.expert_count = experts;
  shape.hidden_size = static_cast<uint32_t>(config->h);
  shape.expert_begin = options.share.begin(experts);
  shape.expert_end = options.share.end(experts);
  if (shape.expert_begin == shape.expert_end) {
    return absl::InvalidArgumentError(absl::StrCat("--share ", options.share.index, "/",
                                                   options.share.count, " holds no expert of ",
                                                   experts));
  }
  absl::StatusOr<uint64_t> fingerprint = ExpertTensorsFingerprint(file, layer_count);
  if (!fingerprint.ok()) return fingerprint.status();
  shape.fingerprint = *fingerprint;
  store->inner_ = config->expert_ffn;

  // Where each slice goes: one region, every slice 64-byte aligned.
  struct Slice {
    const uint8_t* source;
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<Slice> slices;
  uint64_t total = 0;
  const uint32_t held = shape.expert_end - shape.expert_begin;
  for (const LayerWeights& lw : weights->layers) {
    for (const ExpertMatrixView* m : {&lw.moe.gate, &lw.moe.up, &lw.moe.down}) {
      const uint64_t expert_bytes = static_cast<uint64_t>(m->rows * m->row_bytes);
      slices.push_back({static_cast<const uint8_t*>(m->data) + expert_bytes * shape.expert_begin, total,
                        expert_bytes * held});
      total += (expert_bytes * held + 63) / 64 * 64;
    }
  }
  absl::StatusOr<std::unique_ptr<NumaRegion>> region = NumaRegion::Allocate(total, options.numa_node);
  if (!region.ok()) return region.status();
  store->region_ = std::move(*region);

  // Copy in 4 MiB pieces claimed by the pinned threads (first touch on the right node; reading the
  // file in parallel also makes page-cache misses overlap).
  constexpr uint64_t kPiece = uint64_t{4} << 20;
  std::vector<std::pair<size_t, uint64_t>> pieces;  // (slice, offset inside the slice)
  for (size_t i = 0; i < slices.size(); ++i) {
    for (uint64_t o = 0; o < slices[i].bytes; o += kPiece) pieces.emplace_back(i, o);
  }
  std::atomic<size_t> next{0};
  uint8_t* base = store->region_->data();
  pool->Run([&](int) {
    for (size_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < pieces.size();) {
      const Slice& s = slices[pieces[p].first];
      const uint64_t o = pieces[p].second;
      std::memcpy(base + s.offset + o, s.source + o, std::min(kPiece, s.bytes - o));
    }
  });

  size_t i = 0;
  for (const LayerWeights& lw : weights->layers) {
    ExpertLayerView view;
    view.first_expert = shape.expert_begin;
    for (ExpertMatrixView* out : {&view.gate, &view.up, &view.down}) {
      const ExpertMatrixView& m = out == &view.gate ? lw.moe.gate : out == &view.up ? lw.moe.up : lw.moe.down;
      *out = m;
      out->data = base + slices[i++].offset;
      out->experts = held;
    }
    store->layers_.push_back(view);
  }
  return store;
}

absl::Status HostExpertComputer::Compute(const ExpertBatch& batch, float* outputs) {
  return engine_->Compute(store_->layer(batch.layer), batch.pairs, batch.activations,
                          batch.activation_row_count, batch.exact || force_exact_, outputs);
}

}  // namespace tandem
