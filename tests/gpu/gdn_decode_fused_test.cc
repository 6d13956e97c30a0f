// The fused GDN decode kernel (gdn_decode_fused.cu: LaunchGdnDecodeFused) against the four kernels
// it replaces, run in sequence on copies of the same inputs and per-sequence states, as the backend
// runs them (LaunchGdnConvDecode, LaunchGdnPrepare, LaunchGdnRecurrentDecode, LaunchGdnGatedNorm):
// the output (the recurrence's, or the gated norm's), the conv histories and the recurrent states
// must be the same bits. One and three tokens of sequences at scattered rows of a shared state
// buffer (the rows not in the step must stay untouched), two steps in a row (the second reads the
// history the first rewrote), also replayed from a captured CUDA graph; batches just below and
// above kGdnPrepareShortRunBelow tokens (where LaunchGdnPrepare changes kernels); and the inputs
// read at row strides from one stacked product's rows (bit-identical to packed rows). Also: shapes
// the kernel does not take are refused, launching nothing; and the form with the gated norm and the
// layer's output product inside (LaunchGdnDecodeFusedOut) against the gated launch and a host sum.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gdn_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;

std::string Tag(const cuda::GdnShape& d) {
  return "nk" + std::to_string(d.nk) + "_nv" + std::to_string(d.nv) + "_dk" + std::to_string(d.dk) + "_dv" +
         std::to_string(d.dv) + "_kk" + std::to_string(d.kk);
}

// EXPECTs the same bits; on a difference prints the first differing index and both values.
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const bool same = std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
  if (!same) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
        std::printf("[ differs  ] %s: first at index %zu of %zu: fused %.9g, four kernels %.9g\n", what.c_str(), i,
                    got.size(), got[i], want[i]);
        break;
      }
    }
  }
  EXPECT_TRUE(same) << what << ": not bit-identical";
}

// The fused launch's arguments for a step's packed rows (qkv, ba, z), the layer's parameters and
// the sequences' rows of a state buffer `row_stride` floats a row (history and state set apart).
cuda::GdnDecodeFusedArgs StepArgs(const float* qkv, const float* ba, const float* z, const float* taps,
                                  const float* ssm_a, const float* dt_bias, const float* norm, int64_t row_stride,
                                  const int32_t* rows, float eps) {
  cuda::GdnDecodeFusedArgs args;
  args.qkv = qkv;
  args.ba = ba;
  args.z = z;
  args.taps = taps;
  args.ssm_a = ssm_a;
  args.dt_bias = dt_bias;
  args.norm = norm;
  args.row_stride = row_stride;
  args.rows = rows;
  args.eps = eps;
  return args;
}

class GpuGdnDecodeFusedTest : public ::testing::TestWithParam<cuda::GdnShape> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// The fused kernel, without and with the gated norm (and, with_graph, replayed from a captured
// graph), against the four kernels for `steps` steps of each row list (tokens of the sequences at
// those rows of a buffer of `seqs` sequence rows): the outputs and the whole buffer, bit for bit.
void ExpectTheFourKernelsBits(const cuda::GdnShape& d, int64_t seqs, const std::vector<std::vector<int32_t>>& row_lists,
                              int steps, bool with_graph) {
  ASSERT_TRUE(cuda::GdnDecodeFusedFits(d)) << Tag(d);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv;
  // Per sequence row: the conv history ((kk − 1) × c_dim) then the state (nv × dk × dv) and a gap,
  // as the backend's recurrent buffer (conv and state offsets within a row of row_stride floats).
  const int64_t kSeqs = seqs;
  const int64_t conv_off = 0, ssm_off = ((d.kk - 1) * c_dim + 3) / 4 * 4 + 4;
  const int64_t row_stride = ssm_off + static_cast<int64_t>(d.nv) * d.dk * d.dv + 12;
  const auto [taps, ssm_a, dt_bias, norm] = gdn_testing::RandomGdnParams(rng, d);
  const float eps = 1e-6f;
  for (const std::vector<int32_t>& row_list : row_lists) {
    const int64_t n = static_cast<int64_t>(row_list.size());
    const auto rows = Upload(row_list);
    const std::vector<float> state0 = Random(rng, static_cast<size_t>(kSeqs * row_stride), 0.3f);
    auto rec_four = Upload(state0), rec_fused = Upload(state0), rec_gated = Upload(state0), rec_graph = Upload(state0);
    for (int step = 0; step < steps; ++step) {
      const std::string tag = Tag(d) + " n=" + std::to_string(n) + " step " + std::to_string(step);
      const auto qkv = Upload(Random(rng, static_cast<size_t>(n * c_dim)));
      const auto ba = Upload(Random(rng, static_cast<size_t>(n * 2 * d.nv), 2.0f));
      const auto z = Upload(Random(rng, static_cast<size_t>(n * vw)));
      // The four kernels, as RunGdn's decode block and the gated norm after it.
      auto conv = Poisoned<float>(static_cast<size_t>(n * c_dim));
      auto g = Poisoned<float>(static_cast<size_t>(n * d.nv)), beta = Poisoned<float>(static_cast<size_t>(n * d.nv));
      auto o = Poisoned<float>(static_cast<size_t>(n * vw)), gated = Poisoned<float>(static_cast<size_t>(n * vw));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvDecode(qkv.get(), rec_four.get() + conv_off, row_stride, rows.get(),
                                                   taps.get(), n, d, conv.get(), nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepare(conv.get(), ba.get(), ssm_a.get(), dt_bias.get(), n, d, g.get(),
                                                beta.get(), nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnRecurrentDecode(conv.get(), g.get(), beta.get(), n, d,
                                                        rec_four.get() + ssm_off, row_stride, rows.get(), o.get(),
                                                        nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNorm(o.get(), z.get(), norm.get(), eps, n, d, gated.get(), nullptr));
      // The fused kernel, without and with the gated norm, on copies of the states.
      cuda::GdnDecodeFusedArgs args = StepArgs(qkv.get(), ba.get(), z.get(), taps.get(), ssm_a.get(), dt_bias.get(),
                                               norm.get(), row_stride, rows.get(), eps);
      auto o_fused = Poisoned<float>(static_cast<size_t>(n * vw));
      auto o_gated = Poisoned<float>(static_cast<size_t>(n * vw));
      args.history = rec_fused.get() + conv_off;
      args.state = rec_fused.get() + ssm_off;
      args.o = o_fused.get();
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFused(args, n, d, false, nullptr));
      args.history = rec_gated.get() + conv_off;
      args.state = rec_gated.get() + ssm_off;
      args.o = o_gated.get();
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFused(args, n, d, true, nullptr));
      // Once more captured into a CUDA graph (decode steps replay graphs): a cluster launch with the
      // PDL attribute on a capturing stream.
      auto o_graph = Poisoned<float>(static_cast<size_t>(n * vw));
      args.history = rec_graph.get() + conv_off;
      args.state = rec_graph.get() + ssm_off;
      args.o = o_graph.get();
      if (with_graph) {
        cudaStream_t stream;
        TANDEM_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        cudaGraph_t graph;
        TANDEM_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const cudaError_t launched = cuda::LaunchGdnDecodeFused(args, n, d, false, stream);
        TANDEM_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
        TANDEM_ASSERT_CUDA(launched);
        cudaGraphExec_t exec;
        TANDEM_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        TANDEM_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
        TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
        TANDEM_ASSERT_CUDA(cudaGraphExecDestroy(exec));
        TANDEM_ASSERT_CUDA(cudaGraphDestroy(graph));
        TANDEM_ASSERT_CUDA(cudaStreamDestroy(stream));
      }
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> want_rec = Download(rec_four);
      ExpectSameBits(Download(o_fused), Download(o), tag + ": o");
      ExpectSameBits(Download(rec_fused), want_rec, tag + ": histories and states (fused)");
      ExpectSameBits(Download(o_gated), Download(gated), tag + ": gated output");
      ExpectSameBits(Download(rec_gated), want_rec, tag + ": histories and states (fused with gated norm)");
      if (with_graph) {
        ExpectSameBits(Download(o_graph), Download(o), tag + ": o (graph)");
        ExpectSameBits(Download(rec_graph), want_rec, tag + ": histories and states (graph)");
      }
    }
  }
}

TEST_P(GpuGdnDecodeFusedTest, MatchesTheFourKernelsBitForBit) {
  ExpectTheFourKernelsBits(GetParam(), 7, {{5}, {4, 0, 6}}, 2, true);
}

// A batch of kGdnPrepareShortRunBelow tokens and more, where LaunchGdnPrepare switches to its
// kernel of token runs (whose sums of squares round the other product first; gdn_decode_fused.cu
// SumSquaresXFirst/YFirst), and the batch just below it. The sequences in reverse order, one row
// left out (it must stay untouched).
TEST_P(GpuGdnDecodeFusedTest, LargeBatchesMatchTheFourKernelsBitForBit) {
  constexpr int64_t kAt = cuda::kGdnPrepareShortRunBelow;
  std::vector<int32_t> at, below;
  for (int64_t i = kAt + 1; i >= 1; --i) at.push_back(static_cast<int32_t>(i));  // kAt + 1 tokens, row 0 not
  for (int64_t i = kAt - 1; i >= 1; --i) below.push_back(static_cast<int32_t>(i));
  ExpectTheFourKernelsBits(GetParam(), kAt + 2, {at, below}, 1, false);
}

// The inputs as parts of one stacked decode product's rows (the backend's GpuLayer::mixer_in:
// [z | qkv | ba] per token, row stride vw + c_dim + 2nv, plus a gap here so that no part happens to
// sit at its packed offset): qkv_stride, ba_stride and z_stride. The same bits as the packed rows,
// without and with the gated norm, and the same histories and states.
TEST_P(GpuGdnDecodeFusedTest, StridedStackedRowsGiveTheSameBits) {
  const cuda::GdnShape d = GetParam();
  ASSERT_TRUE(cuda::GdnDecodeFusedFits(d)) << Tag(d);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv, nb = 2 * static_cast<int64_t>(d.nv);
  const int64_t stride = vw + c_dim + nb + 5;
  constexpr int kSeqs = 5;
  const int64_t ssm_off = (d.kk - 1) * c_dim + 8;
  const int64_t row_stride = ssm_off + static_cast<int64_t>(d.nv) * d.dk * d.dv;
  const auto [taps, ssm_a, dt_bias, norm] = gdn_testing::RandomGdnParams(rng, d);
  for (const std::vector<int32_t>& row_list : {std::vector<int32_t>{3}, std::vector<int32_t>{4, 0, 2}}) {
    const int64_t n = static_cast<int64_t>(row_list.size());
    const std::string tag = Tag(d) + " n=" + std::to_string(n);
    const auto rows = Upload(row_list);
    const std::vector<float> qkv_h = Random(rng, static_cast<size_t>(n * c_dim));
    const std::vector<float> ba_h = Random(rng, static_cast<size_t>(n * nb), 2.0f);
    const std::vector<float> z_h = Random(rng, static_cast<size_t>(n * vw));
    std::vector<float> stacked_h = Random(rng, static_cast<size_t>(n * stride));  // the gaps: garbage
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(&stacked_h[t * stride], &z_h[t * vw], vw * sizeof(float));
      std::memcpy(&stacked_h[t * stride + vw], &qkv_h[t * c_dim], c_dim * sizeof(float));
      std::memcpy(&stacked_h[t * stride + vw + c_dim], &ba_h[t * nb], nb * sizeof(float));
    }
    const auto qkv = Upload(qkv_h), ba = Upload(ba_h), z = Upload(z_h), stacked = Upload(stacked_h);
    const std::vector<float> state0 = Random(rng, static_cast<size_t>(kSeqs * row_stride), 0.3f);
    for (bool gated : {false, true}) {
      auto rec_packed = Upload(state0), rec_strided = Upload(state0);
      auto o_packed = Poisoned<float>(static_cast<size_t>(n * vw));
      auto o_strided = Poisoned<float>(static_cast<size_t>(n * vw));
      cuda::GdnDecodeFusedArgs args;
      args.taps = taps.get();
      args.ssm_a = ssm_a.get();
      args.dt_bias = dt_bias.get();
      args.row_stride = row_stride;
      args.rows = rows.get();
      args.norm = norm.get();
      args.eps = 1e-6f;
      args.qkv = qkv.get();
      args.ba = ba.get();
      args.z = z.get();
      args.history = rec_packed.get();
      args.state = rec_packed.get() + ssm_off;
      args.o = o_packed.get();
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFused(args, n, d, gated, nullptr));
      args.z = stacked.get();
      args.qkv = stacked.get() + vw;
      args.ba = stacked.get() + vw + c_dim;
      args.qkv_stride = args.ba_stride = args.z_stride = stride;
      args.history = rec_strided.get();
      args.state = rec_strided.get() + ssm_off;
      args.o = o_strided.get();
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFused(args, n, d, gated, nullptr));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::string what = tag + (gated ? " gated" : "");
      ExpectSameBits(Download(o_strided), Download(o_packed), what + ": o (strided vs packed)");
      ExpectSameBits(Download(rec_strided), Download(rec_packed), what + ": histories and states (strided vs packed)");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnDecodeFusedTest,
                         ::testing::Values(cuda::GdnShape{16, 32, 128, 128, 4},  // Qwen3-Next-80B: clusters of 8
                                           cuda::GdnShape{2, 4, 64, 64, 4},      // tiny-q3n: clusters of 4
                                           cuda::GdnShape{2, 4, 128, 128, 8},    // the longest conv
                                           cuda::GdnShape{1, 4, 64, 32, 3},      // one column block a head
                                           cuda::GdnShape{4, 8, 128, 64, 1}),    // no history; dk != dv
                         [](const ::testing::TestParamInfo<cuda::GdnShape>& info) { return Tag(info.param); });

// LaunchGdnDecodeFusedOut (the gated norm and the output product inside, one token): the history
// and state the same bits as the gated launch, a.o the same gated outputs, and out_y (which starts
// from random values, to show the kernel adds) within 1e-4 relative L2 of y0 + W·gated in double
// over the dequantized Q8_0 weights (the int16 outputs' rounding is ~1e-5 a row). Shapes: the 80B
// layer's, the small preset's, and the two other clusters of 256 columns; rows 8 (one a block) to
// 5120 (the most a block holds); rows stored with padding once (row_bytes past the natural size).
// Each with the weights read three ways: out's rows, and its copy by columns through 16-byte
// cp.async pieces and through bulk copies, each with the gated norm's two cluster barriers and with
// one (GdnOutOneBarrier); a misaligned copy is refused. Then a copy by columns with 16 rows of its
// own after out's (by_columns_rows), pieces, bulk, bulk with one barrier: those rows summed too.
struct OutCase {
  cuda::GdnShape d;
  int64_t rows;
  int64_t pad;
};

class GpuGdnDecodeOutTest : public ::testing::TestWithParam<OutCase> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuGdnDecodeOutTest, AddsTheOutputProductOfTheGatedRows) {
  const auto [d, out_rows, pad] = GetParam();
  const std::string tag = Tag(d) + " rows " + std::to_string(out_rows);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t ssm_off = ((d.kk - 1) * c_dim + 3) / 4 * 4 + 4;
  const int64_t row_stride = ssm_off + static_cast<int64_t>(d.nv) * d.dk * d.dv + 12;
  const auto [taps, ssm_a, dt_bias, norm] = gdn_testing::RandomGdnParams(rng, d);
  // Two sequence rows; the token's is row 1.
  const std::vector<float> state0 = Random(rng, static_cast<size_t>(2 * row_stride), 0.3f);
  auto rec_gated = Upload(state0);
  const auto rows = Upload(std::vector<int32_t>{1});
  const auto qkv = Upload(Random(rng, static_cast<size_t>(c_dim)));
  const auto ba = Upload(Random(rng, static_cast<size_t>(2 * d.nv), 2.0f));
  const auto z = Upload(Random(rng, static_cast<size_t>(vw)));
  // The output matrix: Q8_0 on the host (the reference dequantizes it), Q8_0x8 rows on the device.
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, out_rows, 0.05f);
  const gpu_testing::Regrouped out_dev = gpu_testing::Regroup(w, pad);
  const cuda::DeviceMatrix& out = out_dev.m;
  ASSERT_TRUE(cuda::GdnDecodeOutFits(d, out)) << tag;
  const std::vector<float> y0 = Random(rng, static_cast<size_t>(out_rows));
  // The same super-blocks by columns (CopyQ8_0x8ByColumns), which the kernel may read instead.
  auto by_columns = Poisoned<uint8_t>(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(out_rows, vw)));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(out, by_columns.get(), nullptr));

  cuda::GdnDecodeFusedArgs args = StepArgs(qkv.get(), ba.get(), z.get(), taps.get(), ssm_a.get(), dt_bias.get(),
                                           norm.get(), row_stride, rows.get(), 1e-6f);
  auto gated = Poisoned<float>(static_cast<size_t>(vw));
  args.history = rec_gated.get();
  args.state = rec_gated.get() + ssm_off;
  args.o = gated.get();
  TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFused(args, 1, d, true, nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> g = Download(gated), rec_want = Download(rec_gated);
  const std::vector<float> want = gpu_testing::HostProduct(w, g, y0);
  // The three forms of the output product's weights: out's rows, by columns through 16-byte
  // cp.async pieces, by columns through bulk copies (GdnOutBulk, set for each form).
  // Each also with the gated norm's one cluster barrier (GdnOutOneBarrier).
  struct Form {
    const char* name;
    bool by_columns, bulk, one_barrier;
  };
  const bool was_bulk = cuda::GdnOutBulk(), was_one_barrier = cuda::GdnOutOneBarrier();
  for (const Form& f : {Form{"", false, false, false}, Form{" by columns", true, false, false},
                        Form{" bulk", true, true, false}, Form{" one barrier", false, false, true},
                        Form{" by columns, one barrier", true, false, true}, Form{" bulk, one barrier", true, true, true}}) {
    auto rec = Upload(state0), y = Upload(y0);
    auto gated_out = Poisoned<float>(static_cast<size_t>(vw));
    args.history = rec.get();
    args.state = rec.get() + ssm_off;
    args.o = gated_out.get();
    cuda::SetGdnOutBulk(f.bulk);
    cuda::SetGdnOutOneBarrier(f.one_barrier);
    TANDEM_ASSERT_CUDA(
        cuda::LaunchGdnDecodeFusedOut(args, out, y.get(), d, nullptr, f.by_columns ? by_columns.get() : nullptr));
    cuda::SetGdnOutBulk(was_bulk);
    cuda::SetGdnOutOneBarrier(was_one_barrier);
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectSameBits(Download(gated_out), g, tag + ": gated outputs" + f.name);
    ExpectSameBits(Download(rec), rec_want, tag + ": histories and states" + f.name);
    EXPECT_LE(gpu_testing::LogError(std::string("gdn out product") + f.name + " " + tag,
                                    gpu_testing::RelL2(Download(y), want)),
              1e-4)
        << tag << f.name;
    // A misaligned copy is refused, launching nothing.
    if (f.by_columns) {
      EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out, y.get(), d, nullptr, by_columns.get() + 8),
                cudaErrorInvalidValue)
          << tag << f.name;
    }
  }
  // A copy by columns with rows of its own after out's (by_columns_rows: the router's rows of
  // route_compose.cuh): every row summed, out's as before and the others into out_y past them.
  constexpr int64_t kExtra = 16;
  if ((out_rows + kExtra) / 8 > 640) return;
  const int64_t total = out_rows + kExtra;
  const gpu_testing::TestMatrix extra = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, vw, kExtra, 0.05f);
  const gpu_testing::Regrouped extra_dev = gpu_testing::Regroup(extra);
  auto combined = Poisoned<uint8_t>(static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(total, vw)));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(out, combined.get(), nullptr, total));
  TANDEM_ASSERT_CUDA(cuda::CopyQ8_0x8ByColumns(extra_dev.m, combined.get() + out_rows * cuda::kQ8_0x8SuperBytes,
                                               nullptr, total));
  const std::vector<float> y0_extra = Random(rng, static_cast<size_t>(kExtra));
  std::vector<float> y_start = y0, want_all = want;
  y_start.insert(y_start.end(), y0_extra.begin(), y0_extra.end());
  const std::vector<float> want_extra = gpu_testing::HostProduct(extra, g, y0_extra);
  want_all.insert(want_all.end(), want_extra.begin(), want_extra.end());
  for (const int form : {0, 1, 2}) {  // pieces, bulk, bulk with one barrier
    const bool bulk = form >= 1;
    auto rec = Upload(state0), y = Upload(y_start);
    args.history = rec.get();
    args.state = rec.get() + ssm_off;
    args.o = nullptr;
    cuda::SetGdnOutBulk(bulk);
    cuda::SetGdnOutOneBarrier(form == 2);
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnDecodeFusedOut(args, out, y.get(), d, nullptr, combined.get(), total));
    cuda::SetGdnOutBulk(was_bulk);
    cuda::SetGdnOutOneBarrier(was_one_barrier);
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    ExpectSameBits(Download(rec), rec_want, tag + ": histories and states with rows of its own");
    const std::vector<float> got = Download(y);
    EXPECT_LE(gpu_testing::LogError(std::string("gdn out product with rows of its own") + (bulk ? " bulk" : "") +
                                        (form == 2 ? ", one barrier" : "") + " " + tag,
                                    gpu_testing::RelL2(got, want_all)),
              1e-4)
        << tag;
    const std::vector<float> got_extra(got.begin() + out_rows, got.end());
    EXPECT_LE(gpu_testing::RelL2(got_extra, want_extra), 1e-4) << tag << ": the rows of its own";
  }
  // Rows of its own need the copy by columns, a multiple of 8 rows, and no fewer than out's;
  // refused before anything is launched.
  auto y = Upload(y_start);
  EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out, y.get(), d, nullptr, nullptr, total), cudaErrorInvalidValue)
      << tag << ": rows of its own without the copy";
  EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out, y.get(), d, nullptr, combined.get(), total + 1),
            cudaErrorInvalidValue)
      << tag << ": rows not a multiple of 8";
  if (out_rows > 8) {  // (0 means out's own rows)
    EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, out, y.get(), d, nullptr, combined.get(), out_rows - 8),
              cudaErrorInvalidValue)
        << tag << ": fewer rows than out's";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnDecodeOutTest,
                         ::testing::Values(OutCase{{16, 32, 128, 128, 4}, 2048, 0},  // Qwen3-Next-80B's ssm_out
                                           OutCase{{8, 16, 128, 128, 4}, 1024, 0},   // the small preset's
                                           OutCase{{4, 16, 64, 64, 4}, 4096, 32},    // clusters (4, 2), padded rows
                                           OutCase{{8, 64, 128, 32, 2}, 8, 0},       // clusters (8, 1), one row a block
                                           OutCase{{16, 32, 128, 128, 4}, 5120, 0}), // the most rows a block holds
                         [](const ::testing::TestParamInfo<OutCase>& info) {
                           return Tag(info.param.d) + "_rows" + std::to_string(info.param.rows);
                         });

// Shapes outside the kernel's reach are refused with cudaErrorNotSupported before anything is
// launched (the backend runs the four kernels for them): clusters over the portable 8 blocks, key
// dimensions the recurrence does not hold, value heads the gated norm's lanes do not cover.
TEST(GdnDecodeFusedRefusalTest, UnsupportedShapesAreRefusedWithoutLaunching) {
  const std::vector<cuda::GdnShape> refused = {
      {1, 16, 128, 128, 4},  // 16 value heads a key head: a cluster of 64 blocks
      {2, 8, 128, 128, 4},   // 4 value heads a key head × 4 column blocks: 16
      {2, 4, 32, 32, 4},     // dk 32
      {2, 4, 256, 128, 4},   // dk 256
      {2, 2, 128, 256, 4},   // dv 256
      {2, 4, 64, 48, 4},     // dv not a power of two
      {3, 4, 64, 64, 4},     // nv not a multiple of nk
      {2, 4, 64, 64, 9},     // conv kernel over 8
  };
  const bool gpu = gpu_testing::NoGpuReason().empty();
  for (const cuda::GdnShape& d : refused) {
    EXPECT_FALSE(cuda::GdnDecodeFusedFits(d)) << Tag(d);
    cuda::GdnDecodeFusedArgs args;  // never dereferenced: the shape is refused first
    if (!gpu) {
      EXPECT_EQ(cuda::LaunchGdnDecodeFused(args, 1, d, false, nullptr), cudaErrorNotSupported) << Tag(d);
      continue;
    }
    const int64_t vw = static_cast<int64_t>(d.nv) * d.dv;
    auto o = Poisoned<float>(static_cast<size_t>(vw));
    args.o = o.get();
    for (bool gated : {false, true}) {
      EXPECT_EQ(cuda::LaunchGdnDecodeFused(args, 1, d, gated, nullptr), cudaErrorNotSupported) << Tag(d);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    // Nothing ran: o keeps its poison (all bytes 0xFF).
    const std::vector<float> got = Download(o);
    std::vector<float> poison(got.size());
    std::memset(poison.data(), 0xFF, poison.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(got.data(), poison.data(), got.size() * sizeof(float)), 0) << Tag(d);
  }
  // A shape it takes, with a missing pointer: an argument error, not a launch.
  EXPECT_TRUE(cuda::GdnDecodeFusedFits(cuda::GdnShape{16, 32, 128, 128, 4}));
  EXPECT_EQ(cuda::LaunchGdnDecodeFused(cuda::GdnDecodeFusedArgs{}, 1, cuda::GdnShape{16, 32, 128, 128, 4}, false,
                                       nullptr),
            cudaErrorInvalidValue);
}

// LaunchGdnDecodeFusedOut refuses, launching nothing, what GdnDecodeOutFits refuses: clusters that
// are not one super-block of columns, a matrix not Q8_0x8 or of the wrong width, rows not a
// multiple of 8 or past 5120, rows not 16-byte aligned.
alignas(16) constexpr uint8_t kBytes[16] = {};  // never read: every case is refused first

TEST(GdnDecodeOutRefusalTest, UnsupportedShapesAndMatricesAreRefused) {
  const cuda::GdnShape d{16, 32, 128, 128, 4};
  const int64_t vw = 32 * 128, rb = cuda::Q8_0x8RowBytes(vw);
  auto mat = [&](uint32_t type, int64_t cols, int64_t rows, int64_t row_bytes, const void* data = kBytes) {
    return cuda::DeviceMatrix{type, data, cols, rows, row_bytes};
  };
  struct Case {
    cuda::GdnShape d;
    cuda::DeviceMatrix m;
    const char* why;
  };
  const std::vector<Case> refused = {
      {{2, 4, 64, 64, 4}, mat(cuda::kTypeQ8_0x8, 256, 64, cuda::Q8_0x8RowBytes(256)), "128 columns a cluster"},
      {{1, 16, 128, 128, 4}, mat(cuda::kTypeQ8_0x8, 2048, 64, cuda::Q8_0x8RowBytes(2048)), "the fused kernel refuses"},
      {d, mat(static_cast<uint32_t>(WeightType::kQ8_0), vw, 2048, vw / 32 * 34), "ggml Q8_0 layout"},
      {d, mat(cuda::kTypeQ8_0x8, vw / 2, 2048, rb / 2), "half the width"},
      {d, mat(cuda::kTypeQ8_0x8, vw, 2044, rb), "rows not a multiple of 8"},
      {d, mat(cuda::kTypeQ8_0x8, vw, 5128, rb), "more rows than a block holds"},
      {d, mat(cuda::kTypeQ8_0x8, vw, 2048, rb + 8), "rows 8 bytes off 16-byte alignment"},
      {d, mat(cuda::kTypeQ8_0x8, vw, 2048, rb, kBytes + 2), "data off 16-byte alignment"},
      {d, mat(cuda::kTypeQ8_0x8, vw, 2048, rb, nullptr), "no data"},
  };
  for (const Case& c : refused) {
    EXPECT_FALSE(cuda::GdnDecodeOutFits(c.d, c.m)) << c.why;
    cuda::GdnDecodeFusedArgs args;  // never dereferenced
    EXPECT_EQ(cuda::LaunchGdnDecodeFusedOut(args, c.m, nullptr, c.d, nullptr), cudaErrorNotSupported) << c.why;
  }
  EXPECT_TRUE(cuda::GdnDecodeOutFits(d, mat(cuda::kTypeQ8_0x8, vw, 2048, rb)));
}

}  // namespace
}  // namespace tandem
