#include "gpu_service/backend/expert_placement.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

uint64_t ExpertBudget::Resolve(uint64_t all_expert_bytes) const {
  if (fraction >= 0) {
    return static_cast<uint64_t>(std::floor(fraction * static_cast<double>(all_expert_bytes)));
  }
  return bytes;
}

absl::StatusOr<ExpertBudget> ParseExpertBudget(const std::string& text) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-expert-budget: '", text, "' ", why,
                     " (want a fraction like 0.5 or 50%, or bytes like 8GiB)"));
  };
  std::string t(absl::StripAsciiWhitespace(text));
  if (t.empty()) return bad("is empty");
  if (absl::EndsWith(t, "%")) {
    double pct;
    if (!absl::SimpleAtod(t.substr(0, t.size() - 1), &pct)) return bad("is not a percentage");
    if (!(pct >= 0 && pct <= 100)) return bad("is outside 0%..100%");
    return ExpertBudget{pct / 100.0, 0};
  }
  if (t.find('.') != std::string::npos) {
    double f;
    if (!absl::SimpleAtod(t, &f)) return bad("is not a number");
    if (!(f >= 0 && f <= 1)) return bad("is a fraction outside [0, 1]");
    return ExpertBudget{f, 0};
  }
  size_t digits = 0;
  while (digits < t.size() && absl::ascii_isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits == 0) return bad("does not start with a number");
  uint64_t n;
  if (!absl::SimpleAtoi(t.substr(0, digits), &n)) return bad("is too large");
  std::string unit = absl::AsciiStrToUpper(t.substr(digits));
  uint64_t scale = 1;
  if (unit.empty() || unit == "B") {
    // A bare "0" or "1" is ambiguous; whole numbers are bytes, fractions need a dot.
  } else {
    const char prefixes[] = "KMGT";
    const size_t p = std::string(prefixes).find(unit[0]);
    if (p == std::string::npos) return bad("has an unknown unit");
    const std::string rest = unit.substr(1);
    const bool binary = rest.empty() || rest == "IB";
    if (!binary && rest != "B") return bad("has an unknown unit");
    for (size_t i = 0; i <= p; ++i) scale *= binary ? 1024 : 1000;
  }
  if (n > UINT64_MAX / scale) return bad("is too large");
  return ExpertBudget{-1, n * scale};
}

uint64_t ExpertBytes(const MoeWeights& moe) {
  auto slice = [](const ExpertMatrixView& m) -> uint64_t {
    return m.present() ? static_cast<uint64_t>(m.rows * m.row_bytes) : 0;
  };
  return slice(moe.gate) + slice(moe.up) + slice(moe.down);
}

StaticExpertPlacement StaticExpertPlacement::AllLocal(int64_t layers, int64_t experts) {
  StaticExpertPlacement p;
  p.layers_ = layers;
  p.experts_ = experts;
  p.local_.assign(static_cast<size_t>(layers * experts), 1);
  p.local_count_ = layers * experts;
  return p;
}

StaticExpertPlacement StaticExpertPlacement::FromBudget(const ModelWeights& weights,
                                                        int64_t experts,
                                                        const ExpertBudget& budget) {
  const int64_t layers = static_cast<int64_t>(weights.layers.size());
  StaticExpertPlacement p;
  p.layers_ = layers;
  p.experts_ = experts;
  p.local_.assign(static_cast<size_t>(layers * experts), 0);
  std::vector<uint64_t> per_expert(layers);
  for (int64_t l = 0; l < layers; ++l) {
    per_expert[l] = ExpertBytes(weights.layers[l].moe);
    p.all_bytes_ += per_expert[l] * static_cast<uint64_t>(experts);
  }
  const uint64_t limit = budget.Resolve(p.all_bytes_);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t l = 0; l < layers; ++l) {
      if (per_expert[l] == 0) continue;
      if (p.local_bytes_ + per_expert[l] > limit) {
        ++p.remote_count_;
        continue;
      }
      p.local_[static_cast<size_t>(l * experts + e)] = 1;
      p.local_bytes_ += per_expert[l];
      ++p.local_count_;
    }
  }
  return p;
}

}  // namespace tandem
