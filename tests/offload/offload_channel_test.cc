// The offload channel end to end: OffloadClient / MultiWorkerClient against real worker
// processes (tandem_offload_test_worker, serving FakeExpertRowComputer).
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/offload/channel_layout.h"
#include "common/offload/doorbell.h"
#include "common/offload/shared_segment.h"
#include "gpu_service/offload/multi_worker_client.h"
#include "gpu_service/offload/offload_client.h"
#include "gpu_service/offload/worker_process.h"
#include "gtest/gtest.h"
#include "tests/offload/fake_expert_row_computer.h"

namespace tandem {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kExperts = 8;
constexpr uint32_t kHidden = 16;
const char kWorkerPath[] = TANDEM_BINARY_DIR "/tests/offload/tandem_offload_test_worker";

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

OffloadClientOptions Options(std::vector<std::string> worker_args, bool spawn = true) {
  OffloadClientOptions o;
  o.capacities = {16, 8, kHidden, 16, kLayers, kExperts};
  o.model_fingerprint = FakeModelFingerprint(kLayers, kExperts, kHidden);
  if (spawn) o.worker_path = kWorkerPath;
  o.worker_args = std::move(worker_args);
  return o;
}

// A request over `rows` activation rows with distinct values, and its expected outputs.
struct TestRequest {
  std::vector<ExpertRowPair> pairs;
  std::vector<float> activations;
  uint32_t layer = 1;
  bool exact = false;

  OffloadRequest View() const { return {layer, pairs, activations, exact}; }
  std::vector<float> Expected() const {
    std::vector<float> out;
    for (const ExpertRowPair& p : pairs) {
      for (uint32_t j = 0; j < kHidden; ++j) {
        out.push_back(FakeExpertOutput(p.expert, layer, exact, activations[p.row * kHidden + j]));
      }
    }
    return out;
  }
};

TestRequest MakeRequest(std::vector<ExpertRowPair> pairs, uint32_t rows, uint32_t layer = 1) {
  TestRequest r;
  r.pairs = std::move(pairs);
  r.layer = layer;
  for (uint32_t i = 0; i < rows * kHidden; ++i) r.activations.push_back(0.25f * i - 3.0f);
  return r;
}

std::vector<float> CallOk(OffloadClient& client, const TestRequest& request) {
  std::vector<float> out(request.pairs.size() * kHidden, -1.0f);
  absl::StatusOr<OffloadReply> reply = client.Call(request.View(), out, Soon());
  EXPECT_TRUE(reply.ok()) << reply.status();
  return out;
}

TEST(OffloadChannelTest, RoundTripComputesEveryPairInOrder) {
  auto client = OffloadClient::Create(Options({}));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitUntilReady(Soon()).ok());
  TestRequest request = MakeRequest({{3, 0}, {0, 2}, {7, 1}, {3, 2}}, 3, /*layer=*/2);
  EXPECT_EQ(CallOk(**client, request), request.Expected());
  request.exact = true;
  request.layer = 0;
  EXPECT_EQ(CallOk(**client, request), request.Expected());
  // An empty request is answered too.
  TestRequest empty = MakeRequest({}, 1);
  std::vector<float> none;
  absl::StatusOr<OffloadReply> reply = (*client)->Call(empty.View(), none, Soon());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->pair_count, 0u);
}

TEST(OffloadChannelTest, SegmentIsPrivateAndRemovedWithTheClient) {
  std::string path;
  {
    auto client = OffloadClient::Create(Options({}, /*spawn=*/false));
    ASSERT_TRUE(client.ok()) << client.status();
    path = "/dev/shm" + (*client)->channel_name();
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

TEST(OffloadChannelTest, WorkerOfAnotherModelIsRefusedWithTheReason) {
  auto client = OffloadClient::Create(Options({"--fingerprint_salt=5"}));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status s = (*client)->WaitUntilReady(Soon());
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("fingerprint"), std::string::npos) << s;
}

TEST(OffloadChannelTest, RejectedRequestThroughTheClientNamesTheFieldAndServingGoesOn) {
  auto client = OffloadClient::Create(Options({}));
  ASSERT_TRUE(client.ok() && (*client)->WaitUntilReady(Soon()).ok());
  TestRequest bad = MakeRequest({{1, 0}, {kExperts, 0}}, 1);
  std::vector<float> out(2 * kHidden);
  absl::StatusOr<OffloadReply> reply = (*client)->Call(bad.View(), out, Soon());
  EXPECT_TRUE(absl::IsInvalidArgument(reply.status())) << reply.status();
  EXPECT_NE(reply.status().message().find("pair 1: expert 8"), std::string::npos)
      << reply.status();
  TestRequest good = MakeRequest({{1, 0}}, 1);
  EXPECT_EQ(CallOk(**client, good), good.Expected());
}

// Malformed requests written straight into the segment (a buggy client): each gets an error
// reply, and the next good request is served.
class RawChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = *OffloadClient::Create(Options({"--expert_end=6"}));  // the worker holds [0, 6)
    ASSERT_TRUE(client_->WaitUntilReady(Soon()).ok());
    segment_ = *SharedSegment::Open(client_->channel_name());
    view_ = *ChannelView::Open(segment_->data(), segment_->size());
  }

  // Writes a good request for layer 1 with pairs {2,0},{5,1} over 2 rows.
  void WriteGood() {
    RequestHeader& r = view_.request();
    r = RequestHeader{kChannelProtocolVersion, 0, view_.fingerprint(), 0, 1, 2, 2, 0, 0};
    view_.pairs()[0] = {2, 0};
    view_.pairs()[1] = {5, 1};
    for (uint32_t i = 0; i < 2 * kHidden; ++i) view_.activations()[i] = 0.5f * i;
  }

  // Publishes the request and returns the reply's status and message.
  std::pair<ReplyStatus, std::string> Ring() {
    ChannelHeader& h = view_.header();
    const uint64_t seq = AtomicWord(h.request_seq).load() + 1;
    view_.request().sequence = seq;
    PublishSequence(&h.request_seq, &h.request_waiters, seq);
    DoorbellWait w = WaitForSequence(&h.reply_seq, &h.reply_waiters, seq, Soon(),
                                     DoorbellWaitOptions{}, [] { return false; });
    EXPECT_EQ(w, DoorbellWait::kArrived);
    return {static_cast<ReplyStatus>(view_.reply().status), view_.reply().message};
  }

  void ExpectGoodServed() {
    WriteGood();
    auto [status, message] = Ring();
    ASSERT_EQ(status, ReplyStatus::kOk) << message;
    for (uint32_t j = 0; j < kHidden; ++j) {
      EXPECT_EQ(view_.outputs()[j], FakeExpertOutput(2, 1, false, 0.5f * j));
      EXPECT_EQ(view_.outputs()[kHidden + j], FakeExpertOutput(5, 1, false, 0.5f * (kHidden + j)));
    }
  }

  void ExpectRejected(ReplyStatus expected, const std::string& field) {
    auto [status, message] = Ring();
    EXPECT_EQ(status, expected) << message;
    EXPECT_NE(message.find(field), std::string::npos) << message;
    ExpectGoodServed();
  }

  std::unique_ptr<OffloadClient> client_;
  std::unique_ptr<SharedSegment> segment_;
  ChannelView view_;
};

TEST_F(RawChannelTest, EachMalformedRequestGetsAnErrorAndTheNextGoodOneIsServed) {
  ExpectGoodServed();
  WriteGood();
  view_.pairs()[1].expert = kExperts;  // expert >= E
  ExpectRejected(ReplyStatus::kBadExpert, "expert_count");
  WriteGood();
  view_.pairs()[1].expert = 6;  // a real expert, but not this worker's
  ExpectRejected(ReplyStatus::kBadExpert, "not held");
  WriteGood();
  view_.pairs()[0].row = 2;  // row >= activation_row_count
  ExpectRejected(ReplyStatus::kBadRow, "pair 0: row 2");
  WriteGood();
  view_.request().layer = kLayers;
  ExpectRejected(ReplyStatus::kBadLayer, "layer");
  WriteGood();
  view_.request().output_offset = view_.layout().outputs_bytes;  // past the segment's outputs
  ExpectRejected(ReplyStatus::kBadOutputOffset, "output_offset");
  WriteGood();
  view_.request().output_offset = uint64_t{1} << 60;
  ExpectRejected(ReplyStatus::kBadOutputOffset, "output_offset");
  WriteGood();
  view_.request().protocol_version = kChannelProtocolVersion + 1;
  ExpectRejected(ReplyStatus::kBadVersion, "protocol_version");
  WriteGood();
  view_.request().fingerprint ^= 1;
  ExpectRejected(ReplyStatus::kBadFingerprint, "fingerprint");
  WriteGood();
  view_.request().pair_count = view_.capacities().max_pairs + 1;
  ExpectRejected(ReplyStatus::kTooManyPairs, "pair_count");
  WriteGood();
  view_.request().activation_row_count = view_.capacities().max_activation_rows + 1;
  ExpectRejected(ReplyStatus::kTooManyRows, "activation_row_count");
  WriteGood();
  view_.request().flags = 0x80;
  ExpectRejected(ReplyStatus::kBadFlags, "flags");
  // A non-zero, aligned output offset inside the region is honoured.
  WriteGood();
  view_.request().output_offset = 4 * kHidden * sizeof(float);
  auto [status, message] = Ring();
  ASSERT_EQ(status, ReplyStatus::kOk) << message;
  EXPECT_EQ(view_.outputs()[4 * kHidden + 1], FakeExpertOutput(2, 1, false, 0.5f));
}

// Elapsed-time bounds below check the failure-detection bound the design requires (under 1 s);
// they do not measure speed.
TEST(OffloadChannelTest, SpawnedWorkerKilledMidRequestFailsFastAndIsRespawned) {
  auto client = OffloadClient::Create(Options({"--die_on_layer=3"}));
  ASSERT_TRUE(client.ok() && (*client)->WaitUntilReady(Soon()).ok());
  const pid_t first_pid = (*client)->worker_pid();
  TestRequest dying = MakeRequest({{1, 0}}, 1, /*layer=*/3);
  std::vector<float> out(kHidden);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<OffloadReply> reply = (*client)->Call(dying.View(), out, Soon());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  EXPECT_NE(reply.status().message().find("signal 9"), std::string::npos) << reply.status();
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  EXPECT_FALSE((*client)->connected());

  ASSERT_TRUE((*client)->WaitUntilReady(Soon()).ok());
  EXPECT_NE((*client)->worker_pid(), first_pid);
  TestRequest good = MakeRequest({{4, 0}, {0, 1}}, 2, /*layer=*/2);
  EXPECT_EQ(CallOk(**client, good), good.Expected());
}

TEST(OffloadChannelTest, ConnectedWorkerKilledMidRequestFailsFastAndANewOneAttaches) {
  auto client = OffloadClient::Create(Options({}, /*spawn=*/false));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string channel = "--channel=" + (*client)->channel_name();
  // Started "by hand": the client does not own the process. Until this test reaps it, the dead
  // worker is a zombie that kill(pid, 0) still finds, so the heartbeat is what detects it.
  auto first = WorkerProcess::Spawn(kWorkerPath, {channel, "--die_on_layer=0"});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*client)->WaitUntilReady(Soon()).ok());
  TestRequest dying = MakeRequest({{1, 0}}, 1, /*layer=*/0);
  std::vector<float> out(kHidden);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<OffloadReply> reply = (*client)->Call(dying.View(), out, Soon());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  EXPECT_LT(elapsed, std::chrono::seconds(1));

  auto second = WorkerProcess::Spawn(kWorkerPath, {channel});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*client)->WaitUntilReady(Soon()).ok());
  EXPECT_EQ((*client)->worker_pid(), (*second)->pid());
  TestRequest good = MakeRequest({{6, 0}}, 1, /*layer=*/1);
  EXPECT_EQ(CallOk(**client, good), good.Expected());
}

TEST(OffloadChannelTest, SleepingWorkerWakesUpOnARequest) {
  auto client = OffloadClient::Create(Options({"--spin_us=0"}));
  ASSERT_TRUE(client.ok() && (*client)->WaitUntilReady(Soon()).ok());
  const absl::Time give_up = Soon();
  while (!(*client)->WorkerSleeping() && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE((*client)->WorkerSleeping());
  TestRequest request = MakeRequest({{5, 0}}, 1);
  EXPECT_EQ(CallOk(**client, request), request.Expected());
}

TEST(OffloadChannelTest, TwoWorkersWithSplitSharesGiveTheOutputsOfOne) {
  std::vector<ExpertRange> ranges = SplitExpertRanges(kExperts, 2);
  ASSERT_EQ(ranges.size(), 2u);
  std::vector<WorkerShare> shares;
  for (const ExpertRange& r : ranges) {
    shares.push_back({r, Options({absl::StrCat("--expert_begin=", r.begin),
                                  absl::StrCat("--expert_end=", r.end)})});
  }
  auto multi = MultiWorkerClient::Create(std::move(shares));
  ASSERT_TRUE(multi.ok()) << multi.status();
  ASSERT_TRUE((*multi)->WaitUntilReady(Soon()).ok());
  auto single = OffloadClient::Create(Options({}));
  ASSERT_TRUE(single.ok() && (*single)->WaitUntilReady(Soon()).ok());

  // Pairs interleave the two owners, and rows are shared between them.
  TestRequest request =
      MakeRequest({{7, 2}, {0, 0}, {4, 1}, {3, 2}, {5, 0}, {1, 1}, {6, 3}, {2, 3}}, 4, 3);
  std::vector<float> split(request.pairs.size() * kHidden, -1.0f);
  absl::StatusOr<OffloadReply> reply = (*multi)->Call(request.View(), split, Soon());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(split, CallOk(**single, request));
  EXPECT_EQ(split, request.Expected());
  // A request for one worker's experts only.
  TestRequest one_side = MakeRequest({{5, 0}, {6, 0}}, 1, 0);
  std::vector<float> out(2 * kHidden);
  ASSERT_TRUE((*multi)->Call(one_side.View(), out, Soon()).ok());
  EXPECT_EQ(out, one_side.Expected());
}

TEST(OffloadChannelTest, SplitExpertRangesCoverEveryExpertOnce) {
  std::vector<ExpertRange> r = SplitExpertRanges(512, 3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].begin, 0u);
  EXPECT_EQ(r[0].end, r[1].begin);
  EXPECT_EQ(r[1].end, r[2].begin);
  EXPECT_EQ(r[2].end, 512u);
  for (const ExpertRange& x : r) EXPECT_LE(x.end - x.begin - 170, 1u);
}

}  // namespace
}  // namespace tandem
