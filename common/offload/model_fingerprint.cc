#include "common/offload/model_fingerprint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// FNV-1a over an unambiguous encoding (every variable-length field is length-prefixed), followed
// by a 64-bit finalizer so that nearby inputs spread over all bits.
class Fnv1a64 {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      state_ ^= p[i];
      state_ *= 0x100000001b3ull;
    }
  }
  void U64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, 8);
  }
  uint64_t Finish() const {
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_ = 0xcbf29ce484222325ull;
};

}  // namespace

uint64_t ModelFingerprint(std::span<const FingerprintTensor> tensors) {
  std::vector<const FingerprintTensor*> sorted;
  sorted.reserve(tensors.size());
  for (const FingerprintTensor& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const FingerprintTensor* a, const FingerprintTensor* b) { return a->name < b->name; });
  Fnv1a64 hash;
  hash.U64(sorted.size());
  for (const FingerprintTensor* t : sorted) {
    hash.U64(t->name.size());
    hash.Bytes(t->name.data(), t->name.size());
    hash.U64(t->ggml_type);
    hash.U64(t->shape.size());
    for (int64_t d : t->shape) hash.U64(static_cast<uint64_t>(d));
  }
  return hash.Finish();
}

absl::StatusOr<uint64_t> ExpertTensorsFingerprint(const GgufFile& file, uint32_t layer_count) {
  std::vector<FingerprintTensor> tensors;
  for (uint32_t l = 0; l < layer_count; ++l) {
    for (const char* kind : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const std::string name = absl::StrCat("blk.", l, ".", kind, ".weight");
      absl::StatusOr<const GgufTensorInfo*> t = file.GetTensor(name);
      if (!t.ok()) return t.status();
      tensors.push_back({name, (*t)->ggml_type,
                         std::vector<int64_t>((*t)->ne.begin(), (*t)->ne.begin() + (*t)->n_dims)});
    }
  }
  return ModelFingerprint(tensors);
}

}  // namespace tandem
