// A whole MoE layer on the GPU (router, units on the GPU, the rest "offloaded" to the host
// reference, the gated shared expert, the scatter-sum) against MoeForward; and the scatter-sum's
// independence from where rows sit.
#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/reference/matmul.h"
#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/router.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

TEST(MoeLayerTest, GpuAndOffloadedExpertsMatchMoeForward) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 256, I = 256, Ish = 256, E = 16, K = 4;  // Q6_K rows need 256 columns
  const WeightType et = WeightType::kQ4_K, dt = WeightType::kQ6_K, st = WeightType::kQ8_0;
  const std::vector<uint8_t> router = RandomMatrix(rng, WeightType::kF32, h, E, 0.2f);
  const std::vector<uint8_t> gate = RandomMatrix(rng, et, h, I * E, 0.05f);
  const std::vector<uint8_t> up = RandomMatrix(rng, et, h, I * E, 0.05f);
  const std::vector<uint8_t> down = RandomMatrix(rng, dt, I, h * E, 0.05f);
  const std::vector<uint8_t> sgate_inp = RandomMatrix(rng, WeightType::kF32, h, 1, 0.1f);
  const std::vector<uint8_t> sgate = RandomMatrix(rng, st, h, Ish, 0.05f);
  const std::vector<uint8_t> sup = RandomMatrix(rng, st, h, Ish, 0.05f);
  const std::vector<uint8_t> sdown = RandomMatrix(rng, st, Ish, h, 0.05f);
  MoeWeights w;
  w.router = testing::HostMatrix(WeightType::kF32, router, h, E);
  w.gate = ExpertMatrixView{et, gate.data(), h, I, E, *RowBytes(et, h)};
  w.up = ExpertMatrixView{et, up.data(), h, I, E, *RowBytes(et, h)};
  w.down = ExpertMatrixView{dt, down.data(), I, h, E, *RowBytes(dt, I)};
  w.shared_gate_inp = testing::HostMatrix(WeightType::kF32, sgate_inp, h, 1);
  w.shared_gate = testing::HostMatrix(st, sgate, h, Ish);
  w.shared_up = testing::HostMatrix(st, sup, h, Ish);
  w.shared_down = testing::HostMatrix(st, sdown, Ish, h);
  const MoeDims dims{h, E, K};
  ASSERT_TRUE(CheckMoeWeights(w, dims).ok());

  DeviceBuffer drouter = Upload(router), dgate = Upload(gate), dup = Upload(up), ddown = Upload(down);
  DeviceBuffer dsgi = Upload(sgate_inp), dsg = Upload(sgate), dsu = Upload(sup), dsd = Upload(sdown);
  for (int64_t n : {1, 6}) {
    const std::vector<float> x = testing::RandomVector(rng, n * h);
    std::vector<float> ref(static_cast<size_t>(n * h));
    ReferenceExpertExecutor exec(w, nullptr);
    MoeRouting routing;
    ASSERT_TRUE(MoeForward(w, dims, x.data(), n, exec, ref.data(), nullptr, &routing).ok());

    DeviceBuffer dx = Upload(x);
    DeviceBuffer logits = PoisonedBuffer(static_cast<size_t>(n * E) * sizeof(float));
    absl::StatusOr<GpuRouter> r = GpuRouter::Create(8, E, K);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->Route(DeviceMatrix{kTypeF32, drouter.get(), h, E}, dx.as<float>(), n, logits.as<float>(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int32_t> picks(r->experts(), r->experts() + n * K);
    std::vector<float> weights(r->weights(), r->weights() + n * K);
    ASSERT_EQ(picks, routing.experts) << "routing differs from the reference (a near-tie on random weights?)";

    // Odd experts on the GPU, even ones computed by the host reference.
    auto locate = [&](int32_t e) -> std::optional<ExpertLocation> {
      if (e % 2 == 0) return std::nullopt;
      return ExpertLocation{dgate.as<uint8_t>() + (w.gate.expert(e).row(0) - gate.data()),
                            dup.as<uint8_t>() + (w.up.expert(e).row(0) - up.data()),
                            ddown.as<uint8_t>() + (w.down.expert(e).row(0) - down.data())};
    };
    absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, locate);
    ASSERT_TRUE(plan.ok()) << plan.status();
    DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(plan->total_slots * h) * sizeof(float));
    DeviceBuffer act = PoisonedBuffer(static_cast<size_t>(std::max<int64_t>(plan->total_slots, n) * Ish) * sizeof(float));
    absl::StatusOr<ExpertDecodeRunner> runner = ExpertDecodeRunner::Create(64);
    ASSERT_TRUE(runner.ok());
    ASSERT_TRUE(runner->Run(plan->units, {et, dt, h, I}, dx.as<float>(), act.as<float>(), partial.as<float>(), nullptr).ok());
    for (const OffloadedPair& p : plan->offloaded) {
      std::vector<float> row(static_cast<size_t>(h));
      ExpertFfn(w, p.expert, x.data() + p.token * h, 1, row.data(), nullptr);
      ASSERT_EQ(cudaMemcpy(partial.as<float>() + p.slot * h, row.data(), h * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
    // Shared expert through the same units, and its gate logit.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    absl::StatusOr<ExpertDecodeRunner> shared_runner = ExpertDecodeRunner::Create(8);
    ASSERT_TRUE(shared_runner.ok());
    DeviceBuffer shared = PoisonedBuffer(static_cast<size_t>(n * h) * sizeof(float));
    const std::vector<ExpertUnit> shared_units = DenseExpertUnits({dsg.get(), dsu.get(), dsd.get()}, n, 0);
    ASSERT_TRUE(shared_runner->Run(shared_units, {st, st, h, Ish}, dx.as<float>(), act.as<float>(), shared.as<float>(), nullptr).ok());
    DeviceBuffer gate_logit = PoisonedBuffer(static_cast<size_t>(n) * sizeof(float));
    ASSERT_TRUE(DenseMatVec("ffn_gate_inp_shexp", DeviceMatrix{kTypeF32, dsgi.get(), h, 1}, dx.as<float>(), n, gate_logit.as<float>(), nullptr).ok());

    DeviceBuffer dslot = Upload(plan->slot), dweights = Upload(weights);
    DeviceBuffer y = PoisonedBuffer(static_cast<size_t>(n * h) * sizeof(float));
    ASSERT_EQ(LaunchMoeScatterSum(partial.as<float>(), dslot.as<int32_t>(), dweights.as<float>(), static_cast<int>(n),
                                  static_cast<int>(K), static_cast<int>(h), shared.as<float>(), gate_logit.as<float>(),
                                  y.as<float>(), nullptr),
              cudaSuccess);
    const std::vector<float> got = Download<float>(y.get(), static_cast<size_t>(n * h));
    ASSERT_TRUE(testing::AllFinite(got));
    EXPECT_LE(testing::RelativeL2(got, ref), 1e-5) << "n=" << n;
  }
}

// The same partial rows placed in different slots (as a different GPU/host split would) give
// bit-identical sums.
TEST(MoeScatterSumTest, ResultDoesNotDependOnWhereRowsSit) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int n = 5, K = 8, h = 1000;
  const std::vector<float> rows = testing::RandomVector(rng, n * K * h);  // row of pair (t, k) at t·K + k
  const std::vector<float> weights = testing::UniformVector(rng, n * K, 0.0f, 1.0f);
  std::vector<float> outs[2];
  for (int trial = 0; trial < 2; ++trial) {
    std::vector<int32_t> perm(n * K);
    std::iota(perm.begin(), perm.end(), 0);
    if (trial == 1) std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<float> partial(rows.size());
    std::vector<int32_t> slot(n * K);
    for (int pair = 0; pair < n * K; ++pair) {
      slot[pair] = perm[pair];
      std::memcpy(partial.data() + perm[pair] * h, rows.data() + pair * h, h * sizeof(float));
    }
    DeviceBuffer dp = Upload(partial), ds = Upload(slot), dw = Upload(weights);
    DeviceBuffer y = PoisonedBuffer(static_cast<size_t>(n * h) * sizeof(float));
    ASSERT_EQ(LaunchMoeScatterSum(dp.as<float>(), ds.as<int32_t>(), dw.as<float>(), n, K, h, nullptr, nullptr,
                                  y.as<float>(), nullptr),
              cudaSuccess);
    outs[trial] = Download<float>(y.get(), static_cast<size_t>(n * h));
  }
  ASSERT_TRUE(testing::AllFinite(outs[0]));
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)), 0);
  // And the sum itself.
  std::vector<float> ref(static_cast<size_t>(n * h), 0.0f);
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < h; ++j) {
      double acc = 0.0;
      for (int k = 0; k < K; ++k) acc += static_cast<double>(weights[t * K + k]) * rows[(t * K + k) * h + j];
      ref[t * h + j] = static_cast<float>(acc);
    }
  }
  EXPECT_LE(testing::RelativeL2(outs[0], ref), 1e-6);
}

// The vector kernel (LaunchMoeScatterSum with h a multiple of 4 and aligned rows) against the
// per-element kernel: bit for bit the same sums (same fmaf order: picks, then the shared term),
// with the 80B shape (K 10, h 2048, gated shared expert), more picks than one chunk of the vector
// kernel (K 20), no shared expert, an ungated one, and h not a multiple of 4 (the per-element
// kernel on both sides).
TEST(MoeScatterSumTest, VectorKernelBitIdenticalToPerElement) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int n, K, h;
    bool shared, gated;
  };
  for (const Case& c : {Case{37, 10, 2048, true, true}, Case{3, 20, 1000, true, false}, Case{16, 8, 516, false, false},
                        Case{5, 10, 1002, true, true}, Case{1, 10, 2048, true, true}}) {
    const int n = c.n, K = c.K, h = c.h, slots = n * K + 7;  // rows no pick uses among them
    const std::vector<float> partial = testing::RandomVector(rng, static_cast<int64_t>(slots) * h);
    std::vector<int32_t> slot(static_cast<size_t>(slots));
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    slot.resize(static_cast<size_t>(n * K));
    const std::vector<float> weights = testing::UniformVector(rng, n * K, 0.0f, 1.0f);
    const std::vector<float> shared = testing::RandomVector(rng, static_cast<int64_t>(n) * h);
    const std::vector<float> logit = testing::RandomVector(rng, n, 3.0f);
    DeviceBuffer dp = Upload(partial), ds = Upload(slot), dw = Upload(weights), dsh = Upload(shared), dl = Upload(logit);
    const float* sp = c.shared ? dsh.as<float>() : nullptr;
    const float* lp = c.gated ? dl.as<float>() : nullptr;
    DeviceBuffer y0 = PoisonedBuffer(static_cast<size_t>(n) * h * sizeof(float));
    DeviceBuffer y1 = PoisonedBuffer(static_cast<size_t>(n) * h * sizeof(float));
    ASSERT_EQ(LaunchMoeScatterSumPerElement(dp.as<float>(), ds.as<int32_t>(), dw.as<float>(), n, K, h, sp, lp,
                                            y0.as<float>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(LaunchMoeScatterSum(dp.as<float>(), ds.as<int32_t>(), dw.as<float>(), n, K, h, sp, lp, y1.as<float>(),
                                  nullptr),
              cudaSuccess);
    const std::vector<float> a = Download<float>(y0.get(), static_cast<size_t>(n) * h);
    const std::vector<float> b = Download<float>(y1.get(), static_cast<size_t>(n) * h);
    ASSERT_TRUE(testing::AllFinite(a)) << "n=" << n << " K=" << K << " h=" << h;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "n=" << n << " K=" << K << " h=" << h;
    // And against the sum in double.
    std::vector<float> ref(a.size());
    for (int t = 0; t < n; ++t) {
      const double g = c.gated ? 1.0 / (1.0 + std::exp(-static_cast<double>(logit[t]))) : 1.0;
      for (int j = 0; j < h; ++j) {
        double acc = 0.0;
        for (int k = 0; k < K; ++k) {
          acc += static_cast<double>(weights[t * K + k]) * partial[static_cast<size_t>(slot[t * K + k]) * h + j];
        }
        if (c.shared) acc += g * shared[static_cast<size_t>(t) * h + j];
        ref[static_cast<size_t>(t) * h + j] = static_cast<float>(acc);
      }
    }
    EXPECT_LE(testing::RelativeL2(b, ref), 1e-5) << "n=" << n << " K=" << K << " h=" << h;
  }
}

}  // namespace
}  // namespace tandem::cuda
