// Parity of the stream read / inject kernels (norm_streams.cuh, docs/MODEL.md §4.1) with the CPU
// reference: the pending inject fused into the next read's norm, the plain norm, the register-row
// norm. Fresh random inputs, outputs poisoned before every run.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/reference/streams.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

class GpuStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// The pending inject of the previous block fused into the next read's norm, then the whole §4.1
// read (down, SiLU, up, fold, inject weights), against StreamInject + StreamRead.
TEST_F(GpuStreamsTest, InjectThenReadMatchesReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t S = 4, h = 256, lr = 32, n = 3, width = S * h;
  const float eps = 1e-6f;
  std::vector<float> H = Random(rng, static_cast<size_t>(n * width), 1.5f);
  const std::vector<float> y_prev = Random(rng, static_cast<size_t>(n * h));
  std::vector<float> a_prev = Random(rng, static_cast<size_t>(n * S), 0.3f, 1.0f);
  const std::vector<float> gamma = Random(rng, static_cast<size_t>(width), 0.2f, 1.0f);
  const std::vector<float> down = Random(rng, static_cast<size_t>(width * lr), 0.05f);
  const std::vector<float> up = Random(rng, static_cast<size_t>(lr * width), 0.3f);
  const std::vector<float> inject = Random(rng, static_cast<size_t>(width * S), 0.05f);
  const gpu_testing::TestMatrix D = gpu_testing::F32TestMatrix(down, width, lr);
  const gpu_testing::TestMatrix U = gpu_testing::F32TestMatrix(up, lr, width);
  const gpu_testing::TestMatrix J = gpu_testing::F32TestMatrix(inject, width, S);

  auto d_H = Upload(H);
  auto d_y = Upload(y_prev);
  auto d_aprev = Upload(a_prev);
  auto d_gamma = Upload(gamma);
  auto d_N = Poisoned<float>(static_cast<size_t>(n * width));
  auto d_z = Poisoned<float>(static_cast<size_t>(n * lr));
  auto d_m = Poisoned<float>(static_cast<size_t>(n * width));
  auto d_x = Poisoned<float>(static_cast<size_t>(n * h));
  auto d_a = Poisoned<float>(static_cast<size_t>(n * S));
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(d_H.get(), n, S, h, d_aprev.get(), d_y.get(), d_gamma.get(), eps,
                                               d_N.get(), nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(D.gpu(), d_N.get(), width, n, d_z.get(), lr, nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchSiluInPlace(d_z.get(), n * lr, nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(U.gpu(), d_z.get(), lr, n, d_m.get(), width, nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchStreamFold(d_N.get(), d_m.get(), n, S, h, d_x.get(), nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchDenseMatVec(J.gpu(), d_N.get(), width, n, d_a.get(), S, nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectWeights(d_a.get(), n * S, d_a.get(), nullptr));

  StreamInject(H.data(), n, S, h, a_prev.data(), y_prev.data());
  HcWeights w;
  w.norm = gamma;
  w.down = D.view();
  w.up = U.view();
  w.inject = J.view();
  ASSERT_TRUE(CheckHcWeights(w, S, h).ok());
  std::vector<float> x(static_cast<size_t>(n * h)), a(static_cast<size_t>(n * S));
  StreamRead(w, H.data(), n, S, h, eps, x.data(), a.data(), nullptr);
  EXPECT_LE(gpu_testing::LogError("inject_H", RelL2(Download(d_H), H)), 1e-6);
  EXPECT_LE(gpu_testing::LogError("stream_read_x", RelL2(Download(d_x), x)), 1e-5);
  EXPECT_LE(gpu_testing::LogError("stream_read_a", RelL2(Download(d_a), a)), 1e-5);
}

TEST_F(GpuStreamsTest, PlainNormAndUnfusedInject) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 2048, n = 5;
  std::vector<float> H = Random(rng, static_cast<size_t>(n * h), 3.0f);
  const std::vector<float> gamma = Random(rng, static_cast<size_t>(h), 0.2f, 1.0f);
  const std::vector<float> y = Random(rng, static_cast<size_t>(n * h));
  auto d_H = Upload(H);
  auto d_gamma = Upload(gamma);
  auto d_y = Upload(y);
  auto d_a = Poisoned<float>(static_cast<size_t>(n));
  auto d_x = Poisoned<float>(static_cast<size_t>(n * h));
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(d_H.get(), n, 1, h, nullptr, nullptr, d_gamma.get(), 1e-6f,
                                               d_x.get(), nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectWeights(nullptr, n, d_a.get(), nullptr));
  HcWeights w;
  w.norm = gamma;
  std::vector<float> x(static_cast<size_t>(n * h)), a(static_cast<size_t>(n));
  StreamRead(w, H.data(), n, 1, h, 1e-6f, x.data(), a.data(), nullptr);
  EXPECT_LE(gpu_testing::LogError("plain_norm", RelL2(Download(d_x), x)), 1e-6);
  EXPECT_EQ(Download(d_a), a);
  TANDEM_ASSERT_CUDA(cuda::LaunchStreamInject(d_H.get(), n, 1, h, d_a.get(), d_y.get(), nullptr));
  StreamInject(H.data(), n, 1, h, a.data(), y.data());
  EXPECT_LE(RelL2(Download(d_H), H), 1e-7);
}

// The register-row norm (rows of up to 4096 floats) against the general two-pass kernel, with and
// without the fused inject, over row widths that fill 1, 2, 4 and 8 vectors per thread, one that
// leaves threads idle (260) and one past the register path (8192: the fallback).
TEST_F(GpuStreamsTest, RegisterRowNormMatchesGeneralKernel) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int64_t h : {256, 260, 1024, 2048, 4096, 8192}) {
    for (int64_t S : {1, 3}) {
      for (int inject = 0; inject < 3; ++inject) {  // 0: none, 1: y with a = 1, 2: y and a
        const int64_t n = 37, rows = n * S;
        const std::vector<float> H = Random(rng, static_cast<size_t>(rows * h), 2.0f);
        const auto gamma = Upload(Random(rng, static_cast<size_t>(S * h), 0.2f, 1.0f));
        const auto y = Upload(Random(rng, static_cast<size_t>(n * h)));
        const auto a = Upload(Random(rng, static_cast<size_t>(rows), 0.3f, 1.0f));
        auto H_reg = Upload(H), H_general = Upload(H);
        auto N_reg = Poisoned<float>(static_cast<size_t>(rows * h)), N_general = Poisoned<float>(static_cast<size_t>(rows * h));
        const float* yp = inject > 0 ? y.get() : nullptr;
        const float* ap = inject > 1 ? a.get() : nullptr;
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_reg.get(), n, S, h, ap, yp, gamma.get(), 1e-6f, N_reg.get(), nullptr));
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormGeneral(H_general.get(), n, S, h, ap, yp, gamma.get(), 1e-6f,
                                                            N_general.get(), nullptr));
        const std::string tag = "reg_norm_h" + std::to_string(h) + "_S" + std::to_string(S) + "_inject" +
                                std::to_string(inject);
        EXPECT_LE(gpu_testing::LogError(tag, RelL2(Download(N_reg), Download(N_general))), 1e-6);
        EXPECT_LE(RelL2(Download(H_reg), Download(H_general)), 1e-7) << tag;
      }
    }
  }
}

// The norm that also writes the products' f16 input rows (LaunchInjectRmsNormF16, glue512) against
// the old two launches (LaunchInjectRmsNorm, then LaunchF32ToF16SplitRows over N for kFastSplit or
// LaunchF32ToF16 for kFast): bit for bit, for the f32 rows, the injected H and the f16 rows, with
// and without the f32 rows (N nullptr), over the register kernels' widths, one past them (8192:
// the two-pass kernel) and a step of 4096 inject rows (the two-pass kernel by row count).
TEST_F(GpuStreamsTest, NormWithF16RowsIsBitIdenticalToNormThenConvert) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, S, n;
  };
  const Case cases[] = {{256, 1, 37}, {260, 1, 37}, {1024, 3, 37}, {2048, 1, 37}, {2048, 1, 4096},
                        {2048, 3, 37}, {4096, 1, 37}, {8192, 1, 37}};
  for (const Case& cs : cases) {
    const int64_t h = cs.h, S = cs.S, n = cs.n, rows = n * S, cols = S * h;
    for (int inject = 0; inject < 3; ++inject) {  // 0: none, 1: y with a = 1, 2: y and a
      if (n >= 4096 && inject == 0) continue;
      const std::vector<float> H = Random(rng, static_cast<size_t>(rows * h), 2.0f);
      const std::vector<float> gamma_host = Random(rng, static_cast<size_t>(S * h), 0.2f, 1.0f);
      const auto gamma = Upload(gamma_host);
      const auto y = Upload(Random(rng, static_cast<size_t>(n * h)));
      const auto a = Upload(Random(rng, static_cast<size_t>(rows), 0.3f, 1.0f));
      const float* yp = inject > 0 ? y.get() : nullptr;
      const float* ap = inject > 1 ? a.get() : nullptr;
      for (int copies : {3, 1}) {
        auto H_old = Upload(H), H_new = Upload(H), H_rows = Upload(H);
        auto N_old = Poisoned<float>(static_cast<size_t>(rows * h)), N_new = Poisoned<float>(static_cast<size_t>(rows * h));
        const size_t f16_count = static_cast<size_t>(n * copies * cols);
        auto R_old = Poisoned<uint16_t>(f16_count), R_new = Poisoned<uint16_t>(f16_count),
             R_only = Poisoned<uint16_t>(f16_count);
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_old.get(), n, S, h, ap, yp, gamma.get(), 1e-6f, N_old.get(), nullptr));
        if (copies == 3) {
          TANDEM_ASSERT_CUDA(cuda::LaunchF32ToF16SplitRows(N_old.get(), n, cols, R_old.get(), nullptr));
        } else {
          TANDEM_ASSERT_CUDA(cuda::LaunchF32ToF16(N_old.get(), n * cols, R_old.get(), nullptr));
        }
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormF16(H_new.get(), n, S, h, ap, yp, gamma.get(), 1e-6f, N_new.get(),
                                                        copies, R_new.get(), nullptr));
        TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormF16(H_rows.get(), n, S, h, ap, yp, gamma.get(), 1e-6f, nullptr,
                                                        copies, R_only.get(), nullptr));
        const std::string tag = "norm_f16_h" + std::to_string(h) + "_S" + std::to_string(S) + "_n" +
                                std::to_string(n) + "_inject" + std::to_string(inject) + "_copies" +
                                std::to_string(copies);
        const std::vector<uint16_t> r_old = Download(R_old);
        EXPECT_EQ(Download(N_new), Download(N_old)) << tag;
        EXPECT_EQ(Download(H_new), Download(H_old)) << tag;
        EXPECT_EQ(Download(H_rows), Download(H_old)) << tag;
        EXPECT_EQ(Download(R_new), r_old) << tag;
        EXPECT_EQ(Download(R_only), r_old) << tag;
        // and the norm itself still matches the CPU reference (the rows hold real values)
        if (inject == 0 && S == 1) {
          HcWeights w;
          w.norm = gamma_host;
          std::vector<float> x(static_cast<size_t>(n * h)), wa(static_cast<size_t>(n));
          StreamRead(w, H.data(), n, 1, h, 1e-6f, x.data(), wa.data(), nullptr);
          std::vector<float> from_rows(static_cast<size_t>(n * h));
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t j = 0; j < h; ++j) {
              const uint16_t* row = r_old.data() + t * copies * h;
              from_rows[t * h + j] =
                  copies == 3 ? Fp16ToFp32(row[cuda::kSplitHiThird * h + j]) + Fp16ToFp32(row[cuda::kSplitLoThird * h + j])
                              : Fp16ToFp32(row[j]);
            }
          }
          EXPECT_LE(gpu_testing::LogError(tag, RelL2(from_rows, x)), copies == 3 ? 1e-6 : 1e-3) << tag;
        }
      }
    }
  }
  auto R = Poisoned<uint16_t>(64);
  EXPECT_EQ(cuda::LaunchInjectRmsNormF16(nullptr, 1, 1, 8, nullptr, nullptr, nullptr, 1e-6f, nullptr, 2, R.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchInjectRmsNormF16(nullptr, 1, 1, 8, nullptr, nullptr, nullptr, 1e-6f, nullptr, 3, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// The one-token MoE step's shared term left to y's consumer (cuda::PendingShared): every launch
// that injects y (LaunchInjectRmsNorm on the register and the two-pass kernels, LaunchInjectRmsNormF16,
// LaunchInjectRmsNormGeneral, LaunchStreamInject) given y and {shared, gate logit} against the same
// launch given y_eff = fmaf(1 / (1 + exp(-gate)), shared, y) computed here on the host (the down
// kernel's expression). Bit for bit when the gate needs no exponential rounding (no gate: g = 1;
// gate logits 0: g = 0.5, exact on both sides; fmaf is correctly rounded on both); within 1e-6
// for random gate logits, where the host's expf may differ from the device's in the last place
// (the device-only bit-identity with the down kernel's own sum is OneTokenMoeTest's).
TEST_F(GpuStreamsTest, PendingSharedTermEqualsNormOfYWithTheTerm) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, S, n;
  };
  const Case cases[] = {{256, 1, 1}, {2048, 1, 1}, {2048, 1, 3}, {2048, 3, 2}, {4096, 1, 1}, {8192, 1, 2}, {2048, 1, 4096}};
  enum Gate { kNoGate, kZeroGate, kRandomGate };
  for (const Case& cs : cases) {
    const int64_t h = cs.h, S = cs.S, n = cs.n, rows = n * S;
    for (const Gate gate : {kNoGate, kZeroGate, kRandomGate}) {
      for (const bool with_a : {false, true}) {
        const std::vector<float> H = Random(rng, static_cast<size_t>(rows * h), 2.0f);
        const auto gamma = Upload(Random(rng, static_cast<size_t>(S * h), 0.2f, 1.0f));
        const std::vector<float> y = Random(rng, static_cast<size_t>(n * h));
        const std::vector<float> shared = Random(rng, static_cast<size_t>(n * h), 0.1f);
        std::vector<float> logit = Random(rng, static_cast<size_t>(n));
        if (gate == kZeroGate) std::fill(logit.begin(), logit.end(), 0.0f);
        std::vector<float> y_eff(y.size());
        for (int64_t t = 0; t < n; ++t) {
          float g = 1.0f;
          if (gate != kNoGate) g = 1.0f / (1.0f + std::exp(-logit[static_cast<size_t>(t)]));
          for (int64_t j = 0; j < h; ++j) {
            const size_t i = static_cast<size_t>(t * h + j);
            y_eff[i] = std::fma(g, shared[i], y[i]);  // the float overload: fmaf
          }
        }
        const auto d_y = Upload(y), d_y_eff = Upload(y_eff), d_shared = Upload(shared), d_logit = Upload(logit);
        const auto d_a = Upload(Random(rng, static_cast<size_t>(rows), 0.3f, 1.0f));
        const float* ap = with_a ? d_a.get() : nullptr;
        cuda::PendingShared sh;
        sh.shared = d_shared.get();
        sh.gate_logit = gate == kNoGate ? nullptr : d_logit.get();
        const std::string tag = "pending_shared_h" + std::to_string(h) + "_S" + std::to_string(S) + "_n" +
                                std::to_string(n) + "_gate" + std::to_string(static_cast<int>(gate)) +
                                (with_a ? "_a" : "");
        const bool exact = gate != kRandomGate;
        auto expect_same = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
          if (exact) {
            EXPECT_EQ(got, want) << tag << " " << what;
          } else {
            EXPECT_LE(gpu_testing::LogError(tag + "_" + what, RelL2(got, want)), 1e-6);
          }
        };
        // LaunchInjectRmsNorm (the register kernel, or the two-pass one past h 4096 or at 4096 rows).
        {
          auto H_new = Upload(H), H_old = Upload(H);
          auto N_new = Poisoned<float>(static_cast<size_t>(rows * h)), N_old = Poisoned<float>(static_cast<size_t>(rows * h));
          TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H_new.get(), n, S, h, ap, d_y.get(), gamma.get(), 1e-6f,
                                                       N_new.get(), nullptr, nullptr, &sh));
          TANDEM_ASSERT_CUDA(
              cuda::LaunchInjectRmsNorm(H_old.get(), n, S, h, ap, d_y_eff.get(), gamma.get(), 1e-6f, N_old.get(), nullptr));
          expect_same(Download(N_new), Download(N_old), "norm_N");
          expect_same(Download(H_new), Download(H_old), "norm_H");
        }
        // LaunchInjectRmsNormGeneral (the two-pass kernel at every width).
        {
          auto H_new = Upload(H), H_old = Upload(H);
          auto N_new = Poisoned<float>(static_cast<size_t>(rows * h)), N_old = Poisoned<float>(static_cast<size_t>(rows * h));
          TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormGeneral(H_new.get(), n, S, h, ap, d_y.get(), gamma.get(), 1e-6f,
                                                              N_new.get(), nullptr, &sh));
          TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormGeneral(H_old.get(), n, S, h, ap, d_y_eff.get(), gamma.get(), 1e-6f,
                                                              N_old.get(), nullptr));
          expect_same(Download(N_new), Download(N_old), "general_N");
          expect_same(Download(H_new), Download(H_old), "general_H");
        }
        // LaunchInjectRmsNormF16 (split rows, with the f32 rows).
        {
          auto H_new = Upload(H), H_old = Upload(H);
          auto N_new = Poisoned<float>(static_cast<size_t>(rows * h)), N_old = Poisoned<float>(static_cast<size_t>(rows * h));
          const size_t f16_count = static_cast<size_t>(n * 3 * S * h);
          auto R_new = Poisoned<uint16_t>(f16_count), R_old = Poisoned<uint16_t>(f16_count);
          TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormF16(H_new.get(), n, S, h, ap, d_y.get(), gamma.get(), 1e-6f,
                                                          N_new.get(), 3, R_new.get(), nullptr, nullptr, &sh));
          TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNormF16(H_old.get(), n, S, h, ap, d_y_eff.get(), gamma.get(), 1e-6f,
                                                          N_old.get(), 3, R_old.get(), nullptr));
          expect_same(Download(N_new), Download(N_old), "f16_N");
          expect_same(Download(H_new), Download(H_old), "f16_H");
          if (exact) {
            EXPECT_EQ(Download(R_new), Download(R_old)) << tag << " f16 rows";
          }
        }
        // LaunchStreamInject (no norm follows).
        {
          auto H_new = Upload(H), H_old = Upload(H);
          TANDEM_ASSERT_CUDA(cuda::LaunchStreamInject(H_new.get(), n, S, h, ap, d_y.get(), nullptr, &sh));
          TANDEM_ASSERT_CUDA(cuda::LaunchStreamInject(H_old.get(), n, S, h, ap, d_y_eff.get(), nullptr));
          expect_same(Download(H_new), Download(H_old), "inject_H");
        }
      }
    }
  }
  // A shared term needs the y it is added to; a PendingShared without shared is no term.
  auto H = Poisoned<float>(256), N = Poisoned<float>(256), g = Upload(std::vector<float>(256, 1.0f));
  auto sv = Upload(std::vector<float>(256, 0.5f));
  cuda::PendingShared sh;
  sh.shared = sv.get();
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(H.get(), 1, 1, 256, nullptr, nullptr, g.get(), 1e-6f, N.get(), nullptr, nullptr, &sh),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchStreamInject(H.get(), 1, 1, 256, nullptr, nullptr, nullptr, &sh), cudaErrorInvalidValue);
  const cuda::PendingShared none;
  TANDEM_ASSERT_CUDA(
      cuda::LaunchInjectRmsNorm(H.get(), 1, 1, 256, nullptr, nullptr, g.get(), 1e-6f, N.get(), nullptr, nullptr, &none));
}

}  // namespace
}  // namespace tandem
