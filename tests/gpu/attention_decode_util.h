// Shared by the attention decode tests (attention_decode_test.cc, attention_short_test.cc): bit
// comparisons and a decode-like step over a scrambled paged cache.
#ifndef TANDEM_TESTS_GPU_ATTENTION_DECODE_UTIL_H_
#define TANDEM_TESTS_GPU_ATTENTION_DECODE_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::attn_testing {

using gpu_testing::Alloc;
using gpu_testing::DeviceArray;
using gpu_testing::Random;
using gpu_testing::Upload;

using gpu_testing::FirstDifference;
using gpu_testing::SameBits;

inline bool AllFinite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

inline DeviceArray<uint8_t> ZeroedScratch(size_t bytes) {
  DeviceArray<uint8_t> s = Alloc<uint8_t>(bytes);
  EXPECT_EQ(cudaMemset(s.get(), 0, std::max<size_t>(bytes, 1)), cudaSuccess);
  return s;
}

// A decode-like step over a paged cache filled on the device: sequence i (page-table row rows[i])
// has ctx[i] positions cached including its new tokens, the last new[i] of which are in the step.
// Unused positions and pages hold NaN, so a read of them shows.
struct DecodeCase {
  cuda::AttnShape d;
  int max_pages = 0;
  int64_t n = 0;
  std::vector<int32_t> token_seq, token_pos;
  DeviceArray<float> d_k, d_v, d_q, d_qg;
  DeviceArray<int32_t> d_seq, d_pos, d_table;
  cuda::PagedKv cache() const { return cuda::PagedKv{d_k.get(), d_v.get(), d_table.get(), max_pages}; }
};

inline DecodeCase MakeDecodeCase(std::mt19937& rng, const cuda::AttnShape& d, const std::vector<int32_t>& rows,
                                 const std::vector<int>& ctx, const std::vector<int>& fresh) {
  DecodeCase c;
  c.d = d;
  const int kvw = d.kv_width();
  const int num_rows = *std::max_element(rows.begin(), rows.end()) + 1;
  c.max_pages = (*std::max_element(ctx.begin(), ctx.end()) + cuda::kKvPageSize - 1) / cuda::kKvPageSize;
  const int num_pages = num_rows * c.max_pages;
  std::vector<int32_t> physical(static_cast<size_t>(num_pages));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(num_pages), -1);
  std::vector<float> kp(static_cast<size_t>(num_pages) * cuda::kKvPageSize * kvw, NAN), vp = kp;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int next = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int p = 0; p < (ctx[i] + cuda::kKvPageSize - 1) / cuda::kKvPageSize; ++p) {
      table[rows[i] * c.max_pages + p] = physical[next++];
    }
    for (int pos = 0; pos < ctx[i]; ++pos) {
      const int64_t dst =
          (static_cast<int64_t>(table[rows[i] * c.max_pages + pos / cuda::kKvPageSize]) * cuda::kKvPageSize +
           pos % cuda::kKvPageSize) * kvw;
      for (int e = 0; e < kvw; ++e) kp[dst + e] = normal(rng), vp[dst + e] = normal(rng);
    }
    for (int t = ctx[i] - fresh[i]; t < ctx[i]; ++t) c.token_seq.push_back(rows[i]), c.token_pos.push_back(t);
  }
  c.n = static_cast<int64_t>(c.token_seq.size());
  c.d_k = Upload(kp);
  c.d_v = Upload(vp);
  c.d_q = Upload(Random(rng, static_cast<size_t>(c.n * d.nh * d.hd)));
  c.d_qg = Upload(Random(rng, static_cast<size_t>(c.n * d.nh * 2 * d.hd)));
  c.d_seq = Upload(c.token_seq);
  c.d_pos = Upload(c.token_pos);
  c.d_table = Upload(table);
  return c;
}

// o of LaunchAttention over c with `plan` (its items on the device), on the legacy stream; o starts
// poisoned, so an unwritten output shows.
inline std::vector<float> AttendPlanned(const DecodeCase& c, const cuda::AttentionPlan& plan,
                                        const DeviceArray<int32_t>& items, const DeviceArray<uint8_t>& scratch) {
  auto o = gpu_testing::Poisoned<float>(static_cast<size_t>(c.n * c.d.nh * c.d.hd));
  EXPECT_EQ(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, c.d, plan, items.get(), c.d_seq.get(), c.d_pos.get(),
                                  c.cache(), o.get(), scratch.get(), nullptr),
            cudaSuccess);
  return gpu_testing::Download(o);
}

// Restores the process-wide decode-attention switches a test flips (the split at every length,
// the short-walk bound, the old two-launch prep, the in-block merge, the keys copied after the
// wait) when the test ends.
struct AttnSwitchGuard {
  bool old_split = cuda::OldAttnSplit();
  int short_keys = cuda::AttnShortKeys();
  bool old_decode = cuda::OldAttnDecode();
  bool in_block = cuda::AttnMergeInBlock();
  bool old_early_kv = cuda::OldAttnEarlyKv();
  ~AttnSwitchGuard() {
    cuda::SetOldAttnEarlyKv(old_early_kv);
    cuda::SetOldAttnSplit(old_split);
    cuda::SetAttnShortKeys(short_keys);
    cuda::SetOldAttnDecode(old_decode);
    cuda::SetAttnMergeInBlock(in_block);
  }
};

// The head shapes the decode tests run: (query heads, kv heads, head dim, rotary dims).
struct ShapeParam {
  int nh, kvh, hd, rot;
};

inline std::string ShapeName(const ShapeParam& p) {
  return "nh" + std::to_string(p.nh) + "_kvh" + std::to_string(p.kvh) + "_hd" + std::to_string(p.hd);
}

inline const ShapeParam kDecodeShapes[] = {
    {16, 2, 256, 64},  // Qwen3-Next-80B attention
    {4, 2, 64, 16},
    {8, 2, 128, 32},
};

inline std::string ShapeTestName(const ::testing::TestParamInfo<ShapeParam>& info) { return ShapeName(info.param); }

// A test over kDecodeShapes: skipped without a GPU; shape() is the parameter's AttnShape.
class AttentionShapeTest : public ::testing::TestWithParam<ShapeParam> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
  cuda::AttnShape shape() const {
    const ShapeParam& p = GetParam();
    return cuda::AttnShape{p.nh, p.kvh, p.hd, p.rot, 1e-6f};
  }
};

}  // namespace tandem::attn_testing

#endif  // TANDEM_TESTS_GPU_ATTENTION_DECODE_UTIL_H_
