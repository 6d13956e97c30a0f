// CudaBackend end to end against the CPU reference (ReferenceModel) on generated presets, exact
// mode: within 1e-4 relative L2 at every position, identical greedy decoding, prefill split into
// decode, batching, KeepFirst, the routing and block-selection sinks, decode graphs and launch
// overlap changing no logits, a full KV cache refused whole. Fast mode: cuda_backend_fast_test.cc.
// Every case skips when no GPU is present (CI builds this binary but has no GPU).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_reference_check.h"
#include "tests/gpu_backend/backend_test_open.h"
#include "tests/gpu_backend/backend_test_util.h"

namespace tandem::gpu_backend_testing {
namespace {

class ExactTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TANDEM_BACKEND_SKIP_WITHOUT_GPU();
    absl::StatusOr<std::string> path = PresetModel(GetParam());
    ASSERT_TRUE(path.ok()) << path.status();
    path_ = *path;
    ref_ = OpenReference(path_);
    gpu_ = OpenGpu(path_, CudaMode::kExact);
    ASSERT_TRUE(ref_ && gpu_);
    V_ = gpu_->config().vocab;
    prompt_ = RandomTokens(kPrompt, V_, 7);
  }
  std::string path_;
  std::unique_ptr<ReferenceModel> ref_;
  std::unique_ptr<CudaBackend> gpu_;
  int64_t V_ = 0;
  std::vector<int32_t> prompt_;
};

TEST_P(ExactTest, PrefillLogitsMatchReferenceAtEveryPosition) {
  auto seq = ref_->NewSequence();
  ASSERT_TRUE(seq.ok());
  const std::vector<float> want = ReferencePrefill(*ref_, seq->get(), prompt_);
  absl::StatusOr<SequenceSlot> slot = gpu_->CreateSequence();
  ASSERT_TRUE(slot.ok());
  const std::vector<float> got = GpuStep(*gpu_, *slot, prompt_, true);
  int64_t worst = -1;
  const double err = MaxRowError(got, want, V_, &worst);
  printf("[%s] exact prefill of %lld tokens: max per-position relative L2 %.3e (position %lld)\n", GetParam().c_str(),
         static_cast<long long>(kPrompt), err, static_cast<long long>(worst));
  EXPECT_LE(err, 1e-4);
}

// The routing sink must report the picks whichever planner ran: the device planner (steps of up to
// 64 tokens) or the host planner (longer steps). Exact mode agrees with the reference (a flip
// needs two logits within ~1e-6 of each other).
TEST_P(ExactTest, RoutingSinkReportsThePicksOfBothPlanners) {
  const int64_t K = gpu_->config().moe.K, L = gpu_->config().n_layers;
  for (int64_t n : {int64_t{64}, int64_t{100}}) {
    const std::vector<int32_t> prompt = RandomTokens(n, V_, 31);
    auto seq = ref_->NewSequence();
    ASSERT_TRUE(seq.ok());
    std::vector<MoeRouting> want;
    ReferencePrefill(*ref_, seq->get(), prompt, &want);
    std::vector<MoeRouting> got;
    gpu_->set_routing_sink(&got);
    absl::StatusOr<SequenceSlot> slot = gpu_->CreateSequence();
    ASSERT_TRUE(slot.ok());
    GpuStep(*gpu_, *slot, prompt, false);
    gpu_->set_routing_sink(nullptr);
    gpu_->ReleaseSequence(*slot);
    ASSERT_EQ(got.size(), static_cast<size_t>(L));
    int64_t agree = 0, pairs = 0;
    for (int64_t l = 0; l < L; ++l) {
      ASSERT_EQ(got[l].experts.size(), static_cast<size_t>(n * K));
      for (int64_t t = 0; t < n; ++t) {
        agree += SameIds({got[l].experts.begin() + t * K, got[l].experts.begin() + (t + 1) * K},
                         {want[l].experts.begin() + t * K, want[l].experts.begin() + (t + 1) * K});
        ++pairs;
      }
    }
    const double agreement = static_cast<double>(agree) / static_cast<double>(pairs);
    printf("[%s] exact routing of %lld tokens (%s planner): agreement %.4f\n", GetParam().c_str(),
           static_cast<long long>(n), n <= 64 ? "device" : "host", agreement);
    EXPECT_GE(agreement, 0.99);
  }
}

// The selection sink reports each sparse-attention layer's block selections in the reference's
// layout (the blocks besides the own one, step order), for a batched step of two sequences (rows at
// their step offsets) and a later step of one (positions from its start): in exact mode the sets
// equal the reference's (a flip needs two block scores within ~1e-6 relative). Presets without an
// indexer report every layer empty, as the reference does.
TEST_P(ExactTest, SelectionSinkReportsTheReferencesBlockSelections) {
  const int64_t L = gpu_->config().n_layers;
  const std::vector<int32_t> a = RandomTokens(100, V_, 51), b = RandomTokens(60, V_, 52), more = RandomTokens(3, V_, 53);
  auto ra = ref_->NewSequence();
  auto rb = ref_->NewSequence();
  ASSERT_TRUE(ra.ok() && rb.ok());
  std::vector<BlockSelection> want[2], got[2];
  {
    std::vector<float> la(V_), lb(V_);
    ReferenceModel::Step steps[2] = {{ra->get(), a, la.data(), false}, {rb->get(), b, lb.data(), false}};
    ReferenceModel::ForwardOptions fo;
    fo.selections = &want[0];
    ASSERT_TRUE(ref_->Forward(std::span<ReferenceModel::Step>(steps, 2), fo).ok());
  }
  ReferencePrefill(*ref_, ra->get(), more, nullptr, nullptr, &want[1]);
  const SequenceSlot ga = *gpu_->CreateSequence(), gb = *gpu_->CreateSequence();
  std::vector<float> ignored(2 * V_);
  const std::vector<Backend::StepInput> both = {{ga, a, ignored.data(), false}, {gb, b, ignored.data() + V_, false}};
  gpu_->set_selection_sink(&got[0]);
  ASSERT_TRUE(gpu_->Step(both).ok());
  gpu_->set_selection_sink(&got[1]);
  GpuStep(*gpu_, ga, more, false);
  gpu_->set_selection_sink(nullptr);
  gpu_->ReleaseSequence(ga);
  gpu_->ReleaseSequence(gb);
  const bool indexer = gpu_->config().attn.has_indexer();
  for (int step = 0; step < 2; ++step) {
    const int64_t T = step == 0 ? 160 : 3;
    ASSERT_EQ(got[step].size(), static_cast<size_t>(L));
    ASSERT_EQ(want[step].size(), static_cast<size_t>(L));
    int64_t agree = 0, pairs = 0, sparse = 0;
    for (int64_t l = 0; l < L; ++l) {
      const BlockSelection &g = got[step][l], &w = want[step][l];
      ASSERT_EQ(g.keep, w.keep) << "layer " << l;
      ASSERT_EQ(g.counts.size(), w.counts.size()) << "layer " << l;
      if (w.counts.empty()) continue;
      ASSERT_EQ(g.counts.size(), static_cast<size_t>(T)) << "layer " << l;
      for (int64_t t = 0; t < T; ++t) {
        agree += SameIds({g.of(t).begin(), g.of(t).end()}, {w.of(t).begin(), w.of(t).end()});
        const int64_t pos = step == 1 ? 100 + t : t < 100 ? t : t - 100;
        sparse += pos / gpu_->config().attn.cr > w.keep;
        ++pairs;
      }
    }
    printf("[%s] exact block selections of %s: %lld (token, sparse layer) pairs, agreement %.4f\n", GetParam().c_str(),
           step == 0 ? "a batch of 100 + 60 tokens" : "3 more tokens at position 100", static_cast<long long>(pairs),
           pairs > 0 ? static_cast<double>(agree) / static_cast<double>(pairs) : 1.0);
    if (!indexer) {
      EXPECT_EQ(pairs, 0);
      continue;
    }
    ASSERT_GT(pairs, 0);
    EXPECT_GT(sparse, 0) << "no position chose among more than keep blocks: the sparse path is not covered";
    EXPECT_GE(static_cast<double>(agree) / static_cast<double>(pairs), 0.99);
  }
}

TEST_P(ExactTest, GreedyDecodeMatchesReferenceFor64Steps) {
  auto seq = ref_->NewSequence();
  ASSERT_TRUE(seq.ok());
  std::vector<float> want = ReferencePrefill(*ref_, seq->get(), prompt_);
  absl::StatusOr<SequenceSlot> slot = gpu_->CreateSequence();
  ASSERT_TRUE(slot.ok());
  std::vector<float> got = GpuStep(*gpu_, *slot, prompt_, false);
  int32_t ref_tok = Argmax(want.data() + (kPrompt - 1) * V_, V_);
  int32_t gpu_tok = Argmax(got.data(), V_);
  double max_err = RelativeL2(got.data(), want.data() + (kPrompt - 1) * V_, V_);
  std::vector<int32_t> ref_out{ref_tok}, gpu_out{gpu_tok};
  std::vector<float> ref_logits(V_);
  for (int step = 1; step < 64; ++step) {
    const int32_t rt = ref_out.back();
    ReferenceModel::Step st{seq->get(), std::span<const int32_t>(&rt, 1), ref_logits.data(), false};
    ASSERT_TRUE(ref_->Forward(std::span<ReferenceModel::Step>(&st, 1)).ok());
    got = GpuStep(*gpu_, *slot, {gpu_out.back()}, false);
    if (ref_out.back() == gpu_out.back()) max_err = std::max(max_err, RelativeL2(got.data(), ref_logits.data(), V_));
    ref_out.push_back(Argmax(ref_logits.data(), V_));
    gpu_out.push_back(Argmax(got.data(), V_));
  }
  printf("[%s] exact greedy decode, 64 steps: max relative L2 %.3e\n", GetParam().c_str(), max_err);
  EXPECT_EQ(gpu_out, ref_out);
  EXPECT_LE(max_err, 1e-4);
}

TEST_P(ExactTest, PrefillThenDecodeEqualsWholePrefill) {
  absl::StatusOr<SequenceSlot> whole = gpu_->CreateSequence();
  absl::StatusOr<SequenceSlot> split = gpu_->CreateSequence();
  ASSERT_TRUE(whole.ok() && split.ok());
  const std::vector<float> want = GpuStep(*gpu_, *whole, prompt_, true);
  // A prefill chunk of 37 (not a block or page boundary), one of 11, then single tokens.
  double max_err = 0;
  int64_t pos = 0;
  for (int64_t n : {37, 11}) {
    std::vector<int32_t> chunk(prompt_.begin() + pos, prompt_.begin() + pos + n);
    const std::vector<float> got = GpuStep(*gpu_, *split, chunk, true);
    for (int64_t t = 0; t < n; ++t) {
      max_err = std::max(max_err, RelativeL2(got.data() + t * V_, want.data() + (pos + t) * V_, V_));
    }
    pos += n;
  }
  for (; pos < kPrompt; ++pos) {
    const std::vector<float> got = GpuStep(*gpu_, *split, {prompt_[pos]}, false);
    max_err = std::max(max_err, RelativeL2(got.data(), want.data() + pos * V_, V_));
  }
  printf("[%s] prefill 37+11 then decode vs whole prefill: max relative L2 %.3e\n", GetParam().c_str(), max_err);
  EXPECT_LE(max_err, 1e-4);
}

TEST_P(ExactTest, BatchOfThreeEqualsEachAlone) {
  const std::vector<std::vector<int32_t>> prompts = {RandomTokens(20, V_, 11), RandomTokens(45, V_, 12),
                                                     RandomTokens(9, V_, 13)};
  std::vector<SequenceSlot> alone, batched;
  std::vector<std::vector<float>> want;
  for (const auto& p : prompts) {
    absl::StatusOr<SequenceSlot> s = gpu_->CreateSequence();
    ASSERT_TRUE(s.ok());
    alone.push_back(*s);
    want.push_back(GpuStep(*gpu_, *s, p, true));
  }
  std::vector<Backend::StepInput> inputs;
  std::vector<std::vector<float>> got(3);
  for (size_t i = 0; i < 3; ++i) {
    absl::StatusOr<SequenceSlot> s = gpu_->CreateSequence();
    ASSERT_TRUE(s.ok());
    batched.push_back(*s);
    got[i].resize(prompts[i].size() * V_);
    inputs.push_back({*s, prompts[i], got[i].data(), true});
  }
  ASSERT_TRUE(gpu_->Step(inputs).ok());
  double max_err = 0;
  for (size_t i = 0; i < 3; ++i) max_err = std::max(max_err, MaxRowError(got[i], want[i], V_));
  // One decode step of all three together against each alone.
  const std::vector<int32_t> next = {3, 5, 7};
  std::vector<std::vector<float>> dec(3, std::vector<float>(V_));
  inputs.clear();
  for (size_t i = 0; i < 3; ++i) inputs.push_back({batched[i], std::span<const int32_t>(&next[i], 1), dec[i].data(), false});
  ASSERT_TRUE(gpu_->Step(inputs).ok());
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<float> one = GpuStep(*gpu_, alone[i], {next[i]}, false);
    max_err = std::max(max_err, RelativeL2(dec[i].data(), one.data(), V_));
  }
  printf("[%s] batch of 3 vs alone (prefill + one decode): max relative L2 %.3e\n", GetParam().c_str(), max_err);
  EXPECT_LE(max_err, 1e-4);
  for (SequenceSlot s : alone) gpu_->ReleaseSequence(s);
  for (SequenceSlot s : batched) gpu_->ReleaseSequence(s);
}

TEST_P(ExactTest, DecodeGraphsGiveTheLogitsOfStepsRunWithoutThem) {
  std::unique_ptr<CudaBackend> eager = OpenGpu(path_, CudaMode::kExact, true, true, /*graphs=*/false);
  ASSERT_TRUE(eager);
  CudaBackend* backends[2] = {gpu_.get(), eager.get()};
  SequenceSlot a[2], b[2];
  for (int i = 0; i < 2; ++i) {
    a[i] = *backends[i]->CreateSequence();
    b[i] = *backends[i]->CreateSequence();
    GpuStep(*backends[i], a[i], RandomTokens(20, V_, 21), false);
    GpuStep(*backends[i], b[i], RandomTokens(13, V_, 22), false);
  }
  // The batch changes between steps: a new batch size is captured, a seen one replayed, also for
  // other sequences than those it was captured with ({1} replays the graph of {0}).
  const std::vector<std::vector<int>> schedule = {{0}, {0, 1}, {0, 1}, {1}, {0, 1}, {0}, {0, 1}};
  double max_err = 0;
  for (size_t step = 0; step < schedule.size(); ++step) {
    std::vector<std::vector<float>> logits[2];
    for (int i = 0; i < 2; ++i) {
      std::vector<Backend::StepInput> in;
      std::vector<int32_t> toks;
      for (int which : schedule[step]) toks.push_back(static_cast<int32_t>(3 + 11 * step + which));
      logits[i].assign(schedule[step].size(), std::vector<float>(V_));
      for (size_t j = 0; j < schedule[step].size(); ++j) {
        const SequenceSlot s = schedule[step][j] == 0 ? a[i] : b[i];
        in.push_back({s, std::span<const int32_t>(&toks[j], 1), logits[i][j].data(), false});
      }
      ASSERT_TRUE(backends[i]->Step(in).ok());
    }
    for (size_t j = 0; j < schedule[step].size(); ++j) {
      max_err = std::max(max_err, RelativeL2(logits[0][j].data(), logits[1][j].data(), V_));
    }
  }
  printf("[%s] decode with graphs vs without: max relative L2 %.3e (%lld captures, %lld replays)\n",
         GetParam().c_str(), max_err, static_cast<long long>(gpu_->graph_captures()),
         static_cast<long long>(gpu_->graph_replays()));
  EXPECT_LE(max_err, 1e-6);
  EXPECT_EQ(eager->graph_captures(), 0);
  const bool graphable = GetParam() != "tiny";  // tiny has Engram and the indexer: no graphs
  if (graphable) {
    EXPECT_EQ(gpu_->graph_captures(), 2);  // batch 1 and batch 2
    EXPECT_EQ(gpu_->graph_replays(), 5);
  }
}

// Programmatic dependent launch only lets kernels start early (pdl.cuh) and the L2 prefetches
// only warm the cache (l2_prefetch.cuh): a prefill and decode steps (graphs replayed) give the same
// logits with both as with neither. A kernel that read its inputs before PdlWaitForPrevious would
// read the previous step's or layer's values here; a prefetch stream left unjoined would fail the
// graph capture.
TEST_P(ExactTest, LaunchOverlapAndL2PrefetchChangeNoLogits) {
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {  // plain launches first, so that PDL is on again afterwards
    std::unique_ptr<CudaBackend> b =
        OpenGpu(path_, CudaMode::kExact, true, true, true, {}, /*pdl=*/i == 1, /*l2_prefetch=*/i == 1 ? 2 : 0);
    ASSERT_TRUE(b);
    const SequenceSlot s = *b->CreateSequence();
    logits[i] = GpuStep(*b, s, prompt_, true);
    for (int step = 0; step < 12; ++step) {
      const std::vector<float> l = GpuStep(*b, s, {static_cast<int32_t>((5 + 17 * step) % V_)}, false);
      logits[i].insert(logits[i].end(), l.begin(), l.end());
    }
    if (GetParam() != "tiny") {  // tiny has Engram: no graphs
      EXPECT_GT(b->graph_replays(), 0);
    }
  }
  const double err = MaxRowError(logits[1], logits[0], V_);
  printf("[%s] PDL and L2 prefetch on vs off: max relative L2 %.3e over %zu positions\n", GetParam().c_str(), err,
         logits[0].size() / static_cast<size_t>(V_));
  EXPECT_LE(err, 1e-6);
}

// A step that needs more KV pages than are free is refused as a whole with ResourceExhausted and
// changes nothing (backend.h): the sequences it named go on as if it had not been asked.
TEST_P(ExactTest, FullKvCacheRefusesTheWholeStepAndChangesNothing) {
  CudaBackendOptions o;
  o.mode = CudaMode::kExact;
  o.max_batch_tokens = 192;
  o.max_sequences = 4;
  o.max_context = 256;
  o.kv_pages = 3;  // 192 positions in all
  absl::StatusOr<std::unique_ptr<CudaBackend>> small = CudaBackend::Open(path_, o);
  ASSERT_TRUE(small.ok()) << small.status();
  const std::vector<int32_t> head = RandomTokens(100, V_, 41), other = RandomTokens(70, V_, 42);
  const SequenceSlot a = *(*small)->CreateSequence(), b = *(*small)->CreateSequence();
  GpuStep(**small, a, head, false);  // 2 pages
  const std::vector<int32_t> next = {5};
  std::vector<float> ignored(2 * V_);
  const std::vector<Backend::StepInput> both = {{a, next, ignored.data(), false},
                                                {b, other, ignored.data() + V_, false}};  // b needs 2 pages, 1 is free
  EXPECT_EQ((*small)->Step(both).code(), absl::StatusCode::kResourceExhausted);
  const std::vector<float> got = GpuStep(**small, a, next, false);
  std::vector<int32_t> direct = head;
  direct.push_back(next[0]);
  const SequenceSlot fresh = *gpu_->CreateSequence();
  const std::vector<float> want = GpuStep(*gpu_, fresh, direct, false);
  EXPECT_LE(RelativeL2(got.data(), want.data(), V_), 1e-5);
}

TEST_P(ExactTest, KeepFirstEqualsAdvancingByTheKeptTokens) {
  absl::StatusOr<SequenceSlot> a = gpu_->CreateSequence();
  absl::StatusOr<SequenceSlot> b = gpu_->CreateSequence();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<int32_t> head(prompt_.begin(), prompt_.begin() + 40);
  const std::vector<int32_t> draft(prompt_.begin() + 40, prompt_.begin() + 47);  // crosses block 40..47
  GpuStep(*gpu_, *a, head, false);
  GpuStep(*gpu_, *a, draft, true);
  ASSERT_TRUE(gpu_->KeepFirst(*a, 3).ok());
  const std::vector<float> got = GpuStep(*gpu_, *a, {prompt_[50]}, false);
  std::vector<int32_t> direct = head;
  direct.insert(direct.end(), draft.begin(), draft.begin() + 3);
  direct.push_back(prompt_[50]);
  const std::vector<float> want = GpuStep(*gpu_, *b, direct, false);
  const double err = RelativeL2(got.data(), want.data(), V_);
  printf("[%s] KeepFirst(3 of 7) then a token vs direct: relative L2 %.3e\n", GetParam().c_str(), err);
  EXPECT_LE(err, 1e-4);
  EXPECT_FALSE(gpu_->KeepFirst(*a, 5).ok()) << "m beyond the last chunk must be refused";
  // A step marked not rewindable saved no checkpoint: rewinding it is refused, keeping all of it is not.
  const std::vector<int32_t> more = {4, 6};
  std::vector<float> ignored(V_);
  const Backend::StepInput once{*a, more, ignored.data(), false, /*rewindable=*/false};
  ASSERT_TRUE(gpu_->Step(std::span<const Backend::StepInput>(&once, 1)).ok());
  EXPECT_EQ(gpu_->KeepFirst(*a, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(gpu_->KeepFirst(*a, 2).ok());
}

INSTANTIATE_TEST_SUITE_P(Presets, ExactTest, ::testing::Values("tiny", "tiny-q3n", "small"), PresetTestName);

}  // namespace
}  // namespace tandem::gpu_backend_testing
