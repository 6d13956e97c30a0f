// A measuring tool, not a mode: TANDEM_DECODE_ABLATE=name[,name...] leaves the named launches out of
// one-token steps (batch-1 decode), so that a benchmark times the step without them. The logits are
// then wrong; the point is the time a perfect fusion or overlap of that piece could at most save,
// with every other kernel's overlap as it really is (a CUPTI timeline attributes time to kernels,
// but cannot say what the step would take without one: its neighbours' early starts move with it).
// Names: mixer_norm, ffn_norm (the two reads' RMS norms), mixer (the whole GDN / attention mixer),
// gdn_in (the GDN input products), gdn_core (the fused GDN decode kernel), gdn_out (GDN's output
// product), router (the router product), shared (the shared expert), moe (the whole MoE stage).
// An unknown name is reported once on stderr and ignored. Read once per process.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DECODE_ABLATION_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DECODE_ABLATION_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tandem::cuda {

enum class Ablate : unsigned {
  kMixerNorm = 1u << 0,
  kFfnNorm = 1u << 1,
  kMixer = 1u << 2,
  kGdnIn = 1u << 3,
  kGdnCore = 1u << 4,
  kGdnOut = 1u << 5,
  kRouter = 1u << 6,
  kShared = 1u << 7,
  kMoe = 1u << 8,
};

// The names of a TANDEM_DECODE_ABLATE value (comma-separated; empty items skipped) as a mask of
// Ablate bits, and the names that are none of them.
struct DecodeAblation {
  unsigned mask = 0;
  std::vector<std::string> unknown;
};
inline DecodeAblation ParseDecodeAblation(absl::string_view spec) {
  constexpr std::pair<absl::string_view, Ablate> kNames[] = {
      {"mixer_norm", Ablate::kMixerNorm}, {"ffn_norm", Ablate::kFfnNorm}, {"mixer", Ablate::kMixer},
      {"gdn_in", Ablate::kGdnIn},         {"gdn_core", Ablate::kGdnCore}, {"gdn_out", Ablate::kGdnOut},
      {"router", Ablate::kRouter},        {"shared", Ablate::kShared},    {"moe", Ablate::kMoe}};
  DecodeAblation out;
  for (absl::string_view name : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    bool known = false;
    for (const auto& [n, bit] : kNames) {
      if (n == name) {
        out.mask |= static_cast<unsigned>(bit);
        known = true;
      }
    }
    if (!known) out.unknown.emplace_back(name);
  }
  return out;
}

// The set named by TANDEM_DECODE_ABLATE (empty when unset), read once; says on stderr what it
// leaves out and which names it ignored.
inline unsigned DecodeAblationMask() {
  static const unsigned mask = [] {
    const char* v = std::getenv("TANDEM_DECODE_ABLATE");
    if (v == nullptr) return 0u;
    const DecodeAblation parsed = ParseDecodeAblation(v);
    for (const std::string& name : parsed.unknown) {
      std::fprintf(stderr, "TANDEM_DECODE_ABLATE: unknown name '%s' ignored\n", name.c_str());
    }
    if (parsed.mask != 0) {
      std::fprintf(stderr, "TANDEM_DECODE_ABLATE=%s: one-token steps leave launches out; logits are wrong\n", v);
    }
    return parsed.mask;
  }();
  return mask;
}

// Whether a step of `tokens` tokens leaves `what` out.
inline bool Ablated(Ablate what, int64_t tokens) {
  return tokens == 1 && (DecodeAblationMask() & static_cast<unsigned>(what)) != 0;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_DECODE_ABLATION_H_
