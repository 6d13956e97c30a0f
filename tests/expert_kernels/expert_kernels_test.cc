// The expert kernels against the CPU reference FFN (FfnForward on the same stored weights) and
// every SIMD family against the scalar one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/reference/matmul.h"
#include "common/reference/moe.h"
#include "gtest/gtest.h"
#include "host_expert_worker/kernels/activation_blocks.h"
#include "host_expert_worker/kernels/expert_ffn_engine.h"
#include "host_expert_worker/kernels/kernel_isa.h"
#include "host_expert_worker/kernels/row_dot_kernels.h"
#include "host_expert_worker/kernels/row_split.h"
#include "host_expert_worker/kernels/worker_thread_pool.h"
#include "tests/expert_kernels/random_experts.h"

namespace tandem {
namespace {

constexpr int64_t kHidden = 512;
constexpr int64_t kInner = 256;
constexpr int64_t kExperts = 4;
// int8 activations against the f32 reference on N(0, 1) data (the acceptance bound): with
// one scale per 32 activations for gate / up and two-term int8 rows for down's input, the error is
// that of quantizing x alone, 0.7-0.8 % relative L2 for every weight type here (measured; one int8
// row per 256 for both, as ggml's Q8_K, cost 1.8 %). Kernel correctness is pinned far tighter by
// Int8Reference below.
constexpr double kInt8Tolerance = 1e-2;

double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  return std::sqrt(num / den);
}

struct Layer {
  RandomExpertTensor gate, up, down;
  ExpertLayerView view() const { return ExpertLayerView{gate.view, up.view, down.view, 0}; }
};

Layer MakeLayer(WeightType gate_up, WeightType down, uint32_t seed) {
  // Scales keep SiLU in its curved range and outputs of order 1.
  return Layer{MakeRandomExpertTensor(gate_up, kHidden, kInner, kExperts, 0.05f, seed),
               MakeRandomExpertTensor(gate_up, kHidden, kInner, kExperts, 0.05f, seed + 1),
               MakeRandomExpertTensor(down, kInner, kHidden, kExperts, 0.08f, seed + 2)};
}

// Pairs: for each expert e in `experts`, rows_per_expert pairs over the activation rows (rows
// repeat across experts, as tokens do); pair order interleaves experts, like a real batch.
std::vector<ExpertRowPair> MakePairs(const std::vector<uint32_t>& experts, int rows_per_expert,
                                     int activation_rows) {
  std::vector<ExpertRowPair> pairs;
  for (int r = 0; r < rows_per_expert; ++r) {
    for (size_t i = 0; i < experts.size(); ++i) {
      pairs.push_back({experts[i], static_cast<uint32_t>((r * 7 + i * 3) % activation_rows)});
    }
  }
  return pairs;
}

std::vector<float> Reference(const Layer& layer, const std::vector<ExpertRowPair>& pairs,
                             const std::vector<float>& x) {
  std::vector<float> out(pairs.size() * kHidden);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const uint32_t e = pairs[i].expert;
    FfnForward(layer.gate.view.expert(e), layer.up.view.expert(e), layer.down.view.expert(e),
               x.data() + pairs[i].row * kHidden, 1, out.data() + i * kHidden, nullptr);
  }
  return out;
}

// x with every block replaced by its int8 quantization (d * q): what the integer path sees.
std::vector<float> Int8View(const float* x, int64_t n, WeightType weight_type) {
  std::vector<float> out(x, x + n);
  const ActivationFormat format = IntegerActivationFormat(weight_type);
  if (format == ActivationFormat::kQ8K) {
    std::vector<ActivationBlockQ8K> q(n / 256);
    QuantizeActivationsQ8K(x, n, q.data());
    for (int64_t e = 0; e < n; ++e) out[e] = ActivationValue(q[e / 256], static_cast<int>(e % 256));
  } else if (format == ActivationFormat::kQ8x32) {
    std::vector<ActivationBlockQ8x32> q(n / 32);
    QuantizeActivationsQ8x32(x, n, q.data());
    for (int64_t e = 0; e < n; ++e) out[e] = ActivationValue(q[e / 32], static_cast<int>(e % 32));
  }
  return out;
}

// x as a two-term int8 row (hi + lo) for weights of weight_type: what down's integer path sees.
std::vector<float> TwoTermView(const float* x, int64_t n, WeightType weight_type) {
  std::vector<float> out(x, x + n);
  const ActivationFormat format = IntegerActivationFormat(weight_type);
  if (format == ActivationFormat::kF32) return out;
  std::vector<float> residual(n);
  if (format == ActivationFormat::kQ8K) {
    std::vector<ActivationBlockQ8K> hi(n / 256), lo(n / 256);
    QuantizeActivationsTwoTerm(format, x, n, residual.data(), hi.data(), lo.data());
    for (int64_t e = 0; e < n; ++e) {
      out[e] = ActivationValue(hi[e / 256], static_cast<int>(e % 256)) +
               ActivationValue(lo[e / 256], static_cast<int>(e % 256));
    }
  } else {
    std::vector<ActivationBlockQ8x32> hi(n / 32), lo(n / 32);
    QuantizeActivationsTwoTerm(format, x, n, residual.data(), hi.data(), lo.data());
    for (int64_t e = 0; e < n; ++e) {
      out[e] = ActivationValue(hi[e / 32], static_cast<int>(e % 32)) +
               ActivationValue(lo[e / 32], static_cast<int>(e % 32));
    }
  }
  return out;
}

// The reference FFN computed on int8-quantized activations and two-term intermediates (each
// quantized as the worker does): equal to the worker's int8 mode up to f32 rounding, which isolates kernel
// bugs from the (larger) error that int8 activations themselves bring.
std::vector<float> Int8Reference(const Layer& layer, const std::vector<ExpertRowPair>& pairs,
                                 const std::vector<float>& x) {
  std::vector<float> out(pairs.size() * kHidden);
  std::vector<float> g(kInner), u(kInner);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const uint32_t e = pairs[i].expert;
    const float* row = x.data() + pairs[i].row * kHidden;
    const std::vector<float> xg = Int8View(row, kHidden, layer.gate.view.type);
    const std::vector<float> xu = Int8View(row, kHidden, layer.up.view.type);
    MatMul(layer.gate.view.expert(e), xg.data(), 1, g.data(), nullptr);
    MatMul(layer.up.view.expert(e), xu.data(), 1, u.data(), nullptr);
    for (int64_t j = 0; j < kInner; ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    const std::vector<float> m = TwoTermView(g.data(), kInner, layer.down.view.type);
    MatMul(layer.down.view.expert(e), m.data(), 1, out.data() + i * kHidden, nullptr);
  }
  return out;
}

class EngineHarness {
 public:
  explicit EngineHarness(KernelIsa isa, int threads = 2, int64_t max_pairs = 256) {
    WorkerThreadPoolOptions po;
    po.threads = threads;
    pool_ = *WorkerThreadPool::Create(po);
    ExpertFfnEngineOptions eo;
    eo.hidden = kHidden;
    eo.inner = kInner;
    eo.max_pairs = max_pairs;
    eo.max_activation_rows = 64;
    eo.isa = isa;
    engine_ = *ExpertFfnEngine::Create(eo, pool_.get());
  }
  std::vector<float> Run(const Layer& layer, const std::vector<ExpertRowPair>& pairs,
                         const std::vector<float>& x, bool exact) {
    EXPECT_TRUE(engine_->CheckLayer(layer.view()).ok());
    std::vector<float> out(pairs.size() * kHidden, NAN);
    absl::Status s = engine_->Compute(layer.view(), pairs, x.data(),
                                      static_cast<int64_t>(x.size()) / kHidden, exact, out.data());
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  ExpertFfnEngine& engine() { return *engine_; }

 private:
  std::unique_ptr<WorkerThreadPool> pool_;
  std::unique_ptr<ExpertFfnEngine> engine_;
};

std::vector<KernelIsa> SupportedIsas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512Vnni}) {
    if (KernelIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

struct TypeCase {
  WeightType gate_up;
  WeightType down;
};

std::string CaseName(const testing::TestParamInfo<TypeCase>& info) {
  return std::string(GetWeightTypeInfo(info.param.gate_up).name) + "_" +
         std::string(GetWeightTypeInfo(info.param.down).name);
}

class ExpertFfnTypes : public testing::TestWithParam<TypeCase> {};

TEST_P(ExpertFfnTypes, MatchesReferenceOnEveryIsaAndRowCount) {
  const Layer layer = MakeLayer(GetParam().gate_up, GetParam().down, 11);
  const int activation_rows = 20;
  const std::vector<float> x = RandomActivations(activation_rows * kHidden, 5);
  double worst_int8 = 0;
  for (int rows : {1, 3, 8, 17}) {
    SCOPED_TRACE(rows);
    const std::vector<ExpertRowPair> pairs = MakePairs({2, 0, 3}, rows, activation_rows);
    const std::vector<float> want = Reference(layer, pairs, x);
    const std::vector<float> want_int8 = Int8Reference(layer, pairs, x);
    EngineHarness scalar(KernelIsa::kScalar);
    const std::vector<float> scalar_int8 = scalar.Run(layer, pairs, x, false);
    // A rare intermediate value may round to a neighbouring int8 step in one of the two.
    EXPECT_LE(RelativeL2(scalar_int8, want_int8), 1e-3);
    const double int8_error = RelativeL2(scalar_int8, want);
    worst_int8 = std::max(worst_int8, int8_error);
    EXPECT_LE(int8_error, kInt8Tolerance);
    EXPECT_LE(RelativeL2(scalar.Run(layer, pairs, x, true), want), 1e-5);
    for (KernelIsa isa : SupportedIsas()) {
      SCOPED_TRACE(std::string(KernelIsaName(isa)));
      EngineHarness h(isa);
      const std::vector<float> int8 = h.Run(layer, pairs, x, false);
      // Same integer sums per 32-element group, different f32 summation order of the group,
      // mins and block terms (which cancel in part: Q3_K / Q6_K centre their values that way).
      EXPECT_LE(RelativeL2(int8, scalar_int8), 2e-5);
      EXPECT_LE(RelativeL2(int8, want), kInt8Tolerance);
      EXPECT_LE(RelativeL2(h.Run(layer, pairs, x, true), want), 1e-5);
    }
  }
  // The figure docs/PERF.md quotes.
  std::printf("int8 mode vs reference, %s: worst relative L2 %.4f %%\n",
              CaseName(testing::TestParamInfo<TypeCase>(GetParam(), 0)).c_str(), 100 * worst_int8);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, ExpertFfnTypes,
    testing::Values(TypeCase{WeightType::kQ4_K, WeightType::kQ4_K},
                    TypeCase{WeightType::kQ5_K, WeightType::kQ5_K},
                    TypeCase{WeightType::kQ6_K, WeightType::kQ6_K},
                    TypeCase{WeightType::kQ8_0, WeightType::kQ8_0},
                    TypeCase{WeightType::kQ2_K, WeightType::kQ2_K},
                    TypeCase{WeightType::kQ3_K, WeightType::kQ3_K},
                    TypeCase{WeightType::kQ4_0, WeightType::kQ4_0},
                    TypeCase{WeightType::kQ4_K, WeightType::kQ6_K},
                    TypeCase{WeightType::kQ2_K, WeightType::kQ4_K},
                    TypeCase{WeightType::kF32, WeightType::kF32},
                    TypeCase{WeightType::kF16, WeightType::kQ8_0},
                    TypeCase{WeightType::kBF16, WeightType::kBF16}),
    CaseName);

// Every family's row kernel against the scalar one for each row-block size and term count, on
// rows with several super-blocks.
TEST(RowDotKernels, EveryIsaMatchesScalar) {
  for (WeightType type : {WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K,
                          WeightType::kQ6_K, WeightType::kQ8_0, WeightType::kQ4_0}) {
    SCOPED_TRACE(std::string(GetWeightTypeInfo(type).name));
    const int64_t cols = 1024, rows = 5;
    const RandomExpertTensor w = MakeRandomExpertTensor(type, cols, rows, 1, 1.0f, 3);
    const ActivationFormat format = IntegerActivationFormat(type);
    std::vector<std::vector<uint8_t>> act_bytes;
    std::vector<const void*> acts;
    for (int k = 0; k < kMaxRowBlock * kMaxTerms; ++k) {
      std::vector<float> x = RandomActivations(cols, 100 + k);
      // Some all-zero groups and one large outlier, so per-group scales differ widely.
      std::fill(x.begin() + 32 * (k % 5), x.begin() + 32 * (k % 5) + 32, 0.0f);
      x[(97 * k) % cols] = 40.0f;
      // 64 extra bytes to align the blocks.
      act_bytes.emplace_back(ActivationRowBytes(format, cols) + 64);
      uint8_t* p = act_bytes.back().data();
      p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
      if (format == ActivationFormat::kQ8K) {
        QuantizeActivationsQ8K(x.data(), cols, reinterpret_cast<ActivationBlockQ8K*>(p));
      } else {
        QuantizeActivationsQ8x32(x.data(), cols, reinterpret_cast<ActivationBlockQ8x32*>(p));
      }
      acts.push_back(p);
    }
    const int64_t blocks = cols / GetWeightTypeInfo(type).block_elems;
    // magnitude[a][r] = sum over e of |w_r[e] x_a[e]|: the f32 summation-order error of a result
    // scales with it (the outliers above make results small next to their terms).
    std::vector<std::vector<double>> magnitude(acts.size(), std::vector<double>(rows, 0.0));
    {
      std::vector<float> wrow(cols);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(type, static_cast<const uint8_t*>(w.view.data) + r * w.view.row_bytes, wrow.data(), cols);
        for (size_t a = 0; a < acts.size(); ++a) {
          for (int64_t e = 0; e < cols; ++e) {
            const float xe = format == ActivationFormat::kQ8K
                                 ? ActivationValue(static_cast<const ActivationBlockQ8K*>(acts[a])[e / 256], e % 256)
                                 : ActivationValue(static_cast<const ActivationBlockQ8x32*>(acts[a])[e / 32], e % 32);
            magnitude[a][r] += std::fabs(double{wrow[e]} * xe);
          }
        }
      }
    }
    for (int terms = 1; terms <= kMaxTerms; ++terms) {
      for (int n = 1; n <= kMaxRowBlock; ++n) {
        std::vector<std::vector<float>> want(n, std::vector<float>(rows));
        std::vector<float*> want_ptr;
        for (auto& v : want) want_ptr.push_back(v.data());
        FindRowDotKernel(KernelIsa::kScalar, type)(static_cast<const uint8_t*>(w.view.data),
                                                   w.view.row_bytes, rows, blocks, acts.data(), n,
                                                   terms, want_ptr.data());
        if (terms == 2) {
          // Two terms are the sum of the one-term results for the same rows.
          std::vector<std::vector<float>> single(2 * n, std::vector<float>(rows));
          std::vector<float*> single_ptr;
          for (auto& v : single) single_ptr.push_back(v.data());
          FindRowDotKernel(KernelIsa::kScalar, type)(static_cast<const uint8_t*>(w.view.data),
                                                     w.view.row_bytes, rows, blocks, acts.data(),
                                                     2 * n <= kMaxRowBlock ? 2 * n : kMaxRowBlock, 1,
                                                     single_ptr.data());
          for (int k = 0; 2 * k + 1 < std::min(2 * n, kMaxRowBlock); ++k) {
            for (int64_t r = 0; r < rows; ++r) {
              const float sum = single[2 * k][r] + single[2 * k + 1][r];
              EXPECT_NEAR(want[k][r], sum, 1e-6 * (magnitude[2 * k][r] + magnitude[2 * k + 1][r]))
                  << "n=" << n << " k=" << k;
            }
          }
        }
        for (KernelIsa isa : SupportedIsas()) {
          RowDotKernel kernel = FindRowDotKernel(isa, type);
          ASSERT_NE(kernel, nullptr) << KernelIsaName(isa);
          std::vector<std::vector<float>> got(n, std::vector<float>(rows));
          std::vector<float*> got_ptr;
          for (auto& v : got) got_ptr.push_back(v.data());
          kernel(static_cast<const uint8_t*>(w.view.data), w.view.row_bytes, rows, blocks,
                 acts.data(), n, terms, got_ptr.data());
          for (int k = 0; k < n; ++k) {
            for (int64_t r = 0; r < rows; ++r) {
              double scale = 0;
              for (int t = 0; t < terms; ++t) scale += magnitude[k * terms + t][r];
              EXPECT_NEAR(got[k][r], want[k][r], 1e-6 * scale)
                  << KernelIsaName(isa) << " n=" << n << " terms=" << terms << " k=" << k
                  << " r=" << r;
            }
          }
        }
      }
    }
  }
}

// The scalar kernel on plain rows equals the dequantized weights dotted with the dequantized
// activations (the integer bookkeeping of per-32 scales and mins is right).
TEST(RowDotKernels, ScalarEqualsDequantizedDot) {
  for (WeightType type : {WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K,
                          WeightType::kQ6_K, WeightType::kQ8_0, WeightType::kQ4_0}) {
    SCOPED_TRACE(std::string(GetWeightTypeInfo(type).name));
    const int64_t cols = 512, rows = 3;
    const RandomExpertTensor w = MakeRandomExpertTensor(type, cols, rows, 1, 1.0f, 7);
    std::vector<float> x = RandomActivations(cols, 8);
    for (int64_t e = 0; e < cols; e += 37) x[e] *= 9.0f;  // uneven group scales
    const std::vector<float> xq = Int8View(x.data(), cols, type);
    const ActivationFormat format = IntegerActivationFormat(type);
    std::vector<uint8_t> bytes(ActivationRowBytes(format, cols) + 64);
    uint8_t* p = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    if (format == ActivationFormat::kQ8K) {
      QuantizeActivationsQ8K(x.data(), cols, reinterpret_cast<ActivationBlockQ8K*>(p));
    } else {
      QuantizeActivationsQ8x32(x.data(), cols, reinterpret_cast<ActivationBlockQ8x32*>(p));
    }
    const void* act = p;
    std::vector<float> got(rows), want(rows), row(cols);
    float* got_ptr = got.data();
    FindRowDotKernel(KernelIsa::kScalar, type)(static_cast<const uint8_t*>(w.view.data), w.view.row_bytes,
                                               rows, cols / GetWeightTypeInfo(type).block_elems, &act,
                                               1, 1, &got_ptr);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(type, static_cast<const uint8_t*>(w.view.data) + r * w.view.row_bytes, row.data(), cols);
      double dot = 0, norm = 0;
      for (int64_t e = 0; e < cols; ++e) {
        dot += double{row[e]} * xq[e];
        norm += std::fabs(double{row[e]} * xq[e]);
      }
      EXPECT_NEAR(got[r], dot, 1e-5 * norm) << "r=" << r;
    }
  }
}

// Per-32 scales: each group's scale is its own max|x| / 127 and every value is within half a step;
// the AVX-512 lane scales and the scaled per-16 sums agree with them.
TEST(ActivationBlocks, Q8KHasOneScalePer32) {
  std::vector<float> x = RandomActivations(512, 4);
  for (int e = 64; e < 96; ++e) x[e] = 0.0f;  // an all-zero group
  x[300] = 50.0f;                             // an outlier that must not coarsen its neighbours
  std::vector<ActivationBlockQ8K> q(2);
  QuantizeActivationsQ8K(x.data(), 512, q.data());
  for (int e = 0; e < 512; ++e) {
    const ActivationBlockQ8K& b = q[e / 256];
    const int g = (e % 256) / 32;
    float amax = 0;
    for (int i = e / 32 * 32; i < e / 32 * 32 + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    ASSERT_FLOAT_EQ(b.d[g], amax / 127.0f) << "e=" << e;
    EXPECT_LE(std::fabs(ActivationValue(b, e % 256) - x[e]), b.d[g] / 2 * (1 + 1e-5f)) << "e=" << e;
  }
  for (const ActivationBlockQ8K& b : q) {
    for (int j = 0; j < 4; ++j) {
      for (int lane = 0; lane < 16; ++lane) EXPECT_EQ(b.lane_d[j][lane], b.d[2 * j + lane / 8]);
    }
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int e = 16 * s; e < 16 * s + 16; ++e) sum += b.qs[e];
      EXPECT_EQ(b.bsum_d[s], b.d[s / 2] * static_cast<float>(sum));
    }
  }
  EXPECT_EQ(q[0].d[2], 0.0f);
}

// Two-term rows leave at most half a step of the residual's own scale (about 1/254 of one row's).
TEST(ActivationBlocks, TwoTermRowsKeepAboutFourteenBits) {
  std::vector<float> x = RandomActivations(512, 6);
  for (int e = 0; e < 512; e += 29) x[e] *= 8.0f;  // heavy tails, like SiLU(g)·u
  std::vector<float> residual(512);
  std::vector<ActivationBlockQ8K> hi(2), lo(2);
  QuantizeActivationsTwoTerm(ActivationFormat::kQ8K, x.data(), 512, residual.data(), hi.data(), lo.data());
  std::vector<ActivationBlockQ8x32> hi32(16), lo32(16);
  QuantizeActivationsTwoTerm(ActivationFormat::kQ8x32, x.data(), 512, residual.data(), hi32.data(), lo32.data());
  for (int e = 0; e < 512; ++e) {
    const float step = hi[e / 256].d[(e % 256) / 32];
    const float k = ActivationValue(hi[e / 256], e % 256) + ActivationValue(lo[e / 256], e % 256);
    EXPECT_LE(std::fabs(k - x[e]), step / 254 * 1.01f + 1e-6f * std::fabs(x[e])) << "e=" << e;
    const float k32 = ActivationValue(hi32[e / 32], e % 32) + ActivationValue(lo32[e / 32], e % 32);
    EXPECT_LE(std::fabs(k32 - x[e]), hi32[e / 32].d / 254 * 1.01f + 1e-6f * std::fabs(x[e])) << "e=" << e;
  }
}

TEST(ExpertFfnEngine, SplitsBatchesLargerThanItsPairCapacity) {
  const Layer layer = MakeLayer(WeightType::kQ4_K, WeightType::kQ6_K, 21);
  const std::vector<float> x = RandomActivations(10 * kHidden, 9);
  const std::vector<ExpertRowPair> pairs = MakePairs({1, 3, 0, 2}, 5, 10);  // 20 pairs
  EngineHarness big(BestKernelIsa(), 2, 256);
  EngineHarness small(BestKernelIsa(), 2, 6);
  EXPECT_EQ(big.Run(layer, pairs, x, false), small.Run(layer, pairs, x, false));
}

TEST(ExpertFfnEngine, ResultsDoNotDependOnThreadCount) {
  const Layer layer = MakeLayer(WeightType::kQ4_K, WeightType::kQ4_K, 31);
  const std::vector<float> x = RandomActivations(4 * kHidden, 2);
  const std::vector<ExpertRowPair> pairs = MakePairs({0, 1, 2, 3}, 3, 4);
  EngineHarness one(BestKernelIsa(), 1);
  EngineHarness three(BestKernelIsa(), 3);
  EXPECT_EQ(one.Run(layer, pairs, x, false), three.Run(layer, pairs, x, false));
}

// Uneven tiles (one expert with 9 pairs: a tile of 8 and one of 1; others with 1 or 2), more
// threads than some phases have tiles: each thread's static range spans tile boundaries and down
// waits for tiles that other threads complete.
TEST(ExpertFfnEngine, UnevenTilesGiveTheSameResultsOnAnyTeam) {
  const Layer layer = MakeLayer(WeightType::kQ4_K, WeightType::kQ6_K, 51);
  const std::vector<float> x = RandomActivations(9 * kHidden, 4);
  std::vector<ExpertRowPair> pairs;
  for (uint32_t r = 0; r < 9; ++r) pairs.push_back({0, r});
  pairs.push_back({2, 3});
  pairs.push_back({3, 1});
  pairs.push_back({3, 5});
  EngineHarness one(BestKernelIsa(), 1);
  const std::vector<float> want = one.Run(layer, pairs, x, false);
  for (int threads : {2, 5}) {
    EngineHarness team(BestKernelIsa(), threads);
    for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(team.Run(layer, pairs, x, false), want) << threads;
  }
  EXPECT_LT(RelativeL2(want, Reference(layer, pairs, x)), kInt8Tolerance);
}

// Every row is covered exactly once (static ranges, then tail claims), boundaries fall on steps,
// and the static ranges carry equal cost to within a step of the costliest tile.
TEST(RowSplit, CoversEveryRowOnceWithBalancedStaticRanges) {
  const std::vector<int64_t> cost = {3, 10, 3, 3, 6, 10, 3};
  const int64_t dim = 512;
  for (int threads : {1, 2, 3, 16}) {
    SCOPED_TRACE(threads);
    std::vector<int64_t> bounds(threads + 1);
    const RowSplit s = MakeRowSplit(cost.data(), cost.size(), dim, threads, bounds.data());
    ASSERT_EQ(s.total, 7 * dim);
    std::vector<int> seen(s.total, 0);
    std::vector<int64_t> static_cost(threads, 0);
    std::atomic<int64_t> next{0};
    for (int t = 0; t < threads; ++t) {
      EXPECT_LE(bounds[t], bounds[t + 1]);
      EXPECT_EQ(bounds[t] % kRowSplitStep, 0);
      ForEachRowRange(s, t, next, [&](int64_t tile, int64_t r0, int64_t rows) {
        ASSERT_GE(r0, 0);
        ASSERT_LE(r0 + rows, dim);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t g = tile * dim + r0 + r;
          ++seen[g];
          if (g < s.tail_begin) static_cost[t] += cost[tile];
        }
      });
    }
    for (int64_t g = 0; g < s.total; ++g) ASSERT_EQ(seen[g], 1) << "row " << g;
    int64_t all = 0;
    for (int64_t c : cost) all += c * dim;
    EXPECT_EQ(s.tail_begin == s.total, threads == 1);
    const int64_t ideal = (threads == 1 ? all : all - all / 8) / threads;
    for (int t = 0; t < threads; ++t) EXPECT_NEAR(static_cost[t], ideal, kRowSplitStep * 10) << "thread " << t;
  }
}

TEST(ExpertFfnEngine, RefusesTooManyActivationRowsAndBadLayers) {
  const Layer layer = MakeLayer(WeightType::kQ4_K, WeightType::kQ4_K, 41);
  EngineHarness h(KernelIsa::kScalar);
  std::vector<float> x(65 * kHidden, 0.0f);
  std::vector<ExpertRowPair> pairs = {{0, 0}};
  std::vector<float> out(kHidden);
  absl::Status s = h.engine().Compute(layer.view(), pairs, x.data(), 65, false, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("activation_row_count"), std::string_view::npos) << s;

  ExpertLayerView bad = layer.view();
  bad.down.rows = kHidden / 2;
  s = h.engine().CheckLayer(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ffn_down_exps"), std::string_view::npos) << s;
}

TEST(WorkerThreadPool, RunsEveryThreadAndBarriers) {
  WorkerThreadPoolOptions o;
  o.threads = 3;
  std::unique_ptr<WorkerThreadPool> pool = *WorkerThreadPool::Create(o);
  std::vector<int> phase1(3, 0), phase2(3, 0);
  for (int rep = 0; rep < 100; ++rep) {
    pool->Run([&](int t) {
      phase1[t] = rep + 1;
      pool->Barrier();
      // After the barrier every thread sees every phase-1 write.
      phase2[t] = phase1[0] + phase1[1] + phase1[2];
    });
    for (int t = 0; t < 3; ++t) ASSERT_EQ(phase2[t], 3 * (rep + 1));
  }
}

TEST(WorkerThreadPool, RefusesCpusOutsideTheAffinityMask) {
  WorkerThreadPoolOptions o;
  o.threads = 2;
  o.cpus = {CPU_SETSIZE - 1};
  absl::StatusOr<std::unique_ptr<WorkerThreadPool>> pool = WorkerThreadPool::Create(o);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseCpuList, RangesAndErrors) {
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_FALSE(ParseCpuList("3-1").ok());
  EXPECT_FALSE(ParseCpuList("x").ok());
  EXPECT_FALSE(ParseCpuList("").ok());
}

}  // namespace
}  // namespace tandem
