#include "common/model_gen/tensor_fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_gen/direct_quant.h"
#include "common/model_gen/gen_random.h"
#include "common/model_gen/routing_skew.h"

namespace tandem {
namespace {

constexpr int64_t kChunkElems = int64_t{1} << 20;  // floats drawn per piece (4 MiB)

// Values of one element-wise init kind (everything but the Gaussian matrices).
float DrawScalar(TensorInit init, float scale, GenRandom& rng) {
  switch (init) {
    case TensorInit::kNearOne:
      return 1.0f + scale * static_cast<float>(2.0 * rng.Uniform() - 1.0);
    case TensorInit::kSsmA:
      // A = −exp(A_log), A_log = log U(1, 16).
      return -static_cast<float>(1.0 + 15.0 * rng.Uniform());
    case TensorInit::kDtBias: {
      // dt log-uniform in [1e-3, 0.1]; the bias is softplus⁻¹(dt) = dt + log(−expm1(−dt)).
      const double lo = std::log(1e-3), hi = std::log(0.1);
      const double dt = std::exp(lo + (hi - lo) * rng.Uniform());
      return static_cast<float>(dt + std::log(-std::expm1(-dt)));
    }
    default:
      return scale * rng.Normal();
  }
}

// Rows [row0, row0 + n) of a float-valued tensor into out (n × cols floats).
void DrawRows(const GenModelSpec& spec, const PlannedTensor& t, GenRandom& rng, int64_t row0,
              int64_t n, const std::vector<float>& skew_dir, const std::vector<float>& router_coef,
              float* out) {
  const int64_t cols = t.cols();
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(spec.h));
  for (int64_t r = 0; r < n; ++r) {
    float* row = out + r * cols;
    for (int64_t j = 0; j < cols; ++j) row[j] = DrawScalar(t.init, t.scale, rng);
    if (t.init == TensorInit::kEmbedding && spec.zipf > 0) {
      for (int64_t j = 0; j < cols; ++j) row[j] += kSkewEmbeddingOffset * skew_dir[j];
    } else if (t.init == TensorInit::kRouter && spec.zipf > 0) {
      const float c = router_coef[row0 + r] * inv_sqrt_h;
      for (int64_t j = 0; j < cols; ++j) row[j] += c * skew_dir[j];
    }
  }
}

absl::Status FillFloatTensor(const GenModelSpec& spec, const PlannedTensor& t, GenRandom& rng,
                             absl::FunctionRef<absl::Status(absl::Span<const uint8_t>)> sink) {
  const WeightType type = static_cast<WeightType>(t.ggml_type);
  const int64_t cols = t.cols(), rows = t.rows();
  absl::StatusOr<int64_t> row_bytes = RowBytes(type, cols);
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", row_bytes.status().message()));
  }
  std::vector<float> skew_dir, router_coef;
  if (spec.zipf > 0 && (t.init == TensorInit::kEmbedding || t.init == TensorInit::kRouter)) {
    skew_dir = SkewDirection(spec);
    if (t.init == TensorInit::kRouter) router_coef = RouterSkewCoefficients(spec, t.layer);
  }
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / cols);
  std::vector<float> values(std::min(rows, rows_per_chunk) * cols);
  std::vector<uint8_t> bytes(std::min(rows, rows_per_chunk) * *row_bytes);
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, rows - r0);
    DrawRows(spec, t, rng, r0, n, skew_dir, router_coef, values.data());
    if (type == WeightType::kF32) {
      std::memcpy(bytes.data(), values.data(), n * cols * sizeof(float));
    } else {
      for (int64_t r = 0; r < n; ++r) {
        QuantizeRow(type, values.data() + r * cols, bytes.data() + r * *row_bytes, cols);
      }
    }
    if (absl::Status s = sink(absl::MakeConstSpan(bytes.data(), n * *row_bytes)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FillDirectTensor(const PlannedTensor& t, GenRandom& rng,
                              absl::FunctionRef<absl::Status(absl::Span<const uint8_t>)> sink) {
  const WeightType type = static_cast<WeightType>(t.ggml_type);
  const WeightTypeInfo& info = GetWeightTypeInfo(type);
  const int64_t total_blocks = t.cols() / info.block_elems * t.rows();
  const int64_t blocks_per_chunk = std::max<int64_t>(1, kChunkElems / info.block_elems);
  std::vector<uint8_t> bytes(std::min(total_blocks, blocks_per_chunk) * info.block_bytes);
  for (int64_t b0 = 0; b0 < total_blocks; b0 += blocks_per_chunk) {
    const int64_t n = std::min(blocks_per_chunk, total_blocks - b0);
    FillDirectQuantBlocks(type, n, t.scale, rng, bytes.data());
    if (absl::Status s = sink(absl::MakeConstSpan(bytes.data(), n * info.block_bytes)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status FillTokenMap(const PlannedTensor& t, GenRandom& rng,
                          absl::FunctionRef<absl::Status(absl::Span<const uint8_t>)> sink) {
  const int64_t v = t.ne[0];
  const uint32_t range = static_cast<uint32_t>(std::max<int64_t>(1, static_cast<int64_t>(t.scale * v)));
  std::vector<int32_t> map(v);
  for (int64_t i = 0; i < v; ++i) map[i] = static_cast<int32_t>(rng.Below(range));
  return sink(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(map.data()), v * sizeof(int32_t)));
}

}  // namespace

absl::Status FillTensor(const GenModelSpec& spec, const PlannedTensor& t,
                        absl::FunctionRef<absl::Status(absl::Span<const uint8_t>)> sink) {
  GenRandom rng(StreamSeed(spec.seed, t.name));
  if (t.init == TensorInit::kTokenMap) return FillTokenMap(t, rng, sink);
  if (t.direct_quant) {
    if (!HasDirectQuant(static_cast<WeightType>(t.ggml_type))) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': type ", t.ggml_type,
                                                     " has no direct block generator"));
    }
    return FillDirectTensor(t, rng, sink);
  }
  const WeightTypeInfo* info = FindWeightTypeInfo(t.ggml_type);
  if (info == nullptr || !info->supported) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ggml type ", t.ggml_type,
                                                   " cannot be generated"));
  }
  return FillFloatTensor(spec, t, rng, sink);
}

}  // namespace tandem
