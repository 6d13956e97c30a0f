// Units of the offload protocol: layout, fingerprint, shared segment, request validation,
// doorbells, and the in-process parts of the channel server.
#include <sys/stat.h>

#include <cstring>
#include <thread>

#include "common/offload/channel_layout.h"
#include "common/offload/doorbell.h"
#include "common/offload/model_fingerprint.h"
#include "common/offload/shared_segment.h"
#include "gtest/gtest.h"
#include "host_expert_worker/channel/channel_server.h"
#include "host_expert_worker/channel/request_validator.h"
#include "tests/offload/fake_expert_row_computer.h"

namespace tandem {
namespace {

ChannelCapacities SmallCapacities() { return {16, 8, 16, 16, 4, 8}; }

TEST(ChannelLayoutTest, RegionsAreAlignedOrderedAndSized) {
  absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(SmallCapacities());
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (uint64_t offset : {layout->request_offset, layout->pairs_offset,
                          layout->activations_offset, layout->reply_offset,
                          layout->outputs_offset, layout->segment_bytes}) {
    EXPECT_EQ(offset % kChannelAlignment, 0u);
  }
  EXPECT_GE(layout->request_offset, sizeof(ChannelHeader));
  EXPECT_GE(layout->activations_offset, layout->pairs_offset + 16 * sizeof(ExpertRowPair));
  EXPECT_GE(layout->reply_offset, layout->activations_offset + 8 * 16 * sizeof(float));
  EXPECT_EQ(layout->outputs_bytes, 16u * 16 * sizeof(float));
  EXPECT_GE(layout->segment_bytes, layout->outputs_offset + layout->outputs_bytes);
  // The doorbells and the worker status sit on separate cache lines.
  EXPECT_NE(offsetof(ChannelHeader, request_seq) / 64, offsetof(ChannelHeader, reply_seq) / 64);
  EXPECT_NE(offsetof(ChannelHeader, reply_seq) / 64, offsetof(ChannelHeader, heartbeat) / 64);
}

TEST(ChannelLayoutTest, RejectsBadCapacitiesNamingTheField) {
  ChannelCapacities c = SmallCapacities();
  c.hidden_size = 0;
  absl::Status s = ValidateCapacities(c);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s;
  c = SmallCapacities();
  c.max_output_rows = c.max_pairs - 1;
  s = ValidateCapacities(c);
  EXPECT_NE(s.message().find("max_output_rows"), std::string::npos) << s;
}

TEST(ModelFingerprintTest, DependsOnNamesTypesShapesButNotOrder) {
  std::vector<FingerprintTensor> a = {{"blk.0.ffn_up_exps.weight", 12, {2048, 512, 512}},
                                      {"blk.0.ffn_down_exps.weight", 14, {512, 2048, 512}}};
  std::vector<FingerprintTensor> reversed = {a[1], a[0]};
  EXPECT_EQ(ModelFingerprint(a), ModelFingerprint(reversed));
  auto changed = a;
  changed[0].ggml_type = 13;
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(changed));
  changed = a;
  changed[1].shape[2] = 256;
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(changed));
  changed = a;
  changed[0].name = "blk.1.ffn_up_exps.weight";
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(changed));
  // Moving a dimension between tensors changes the encoding too.
  changed = a;
  changed[0].shape = {2048, 512};
  changed[1].shape = {512, 2048, 512, 512};
  EXPECT_NE(ModelFingerprint(a), ModelFingerprint(changed));
}

TEST(SharedSegmentTest, CreatedPrivateSharedWithOpenerAndRemovedByCreator) {
  std::string path;
  {
    absl::StatusOr<std::unique_ptr<SharedSegment>> created = SharedSegment::Create(8192);
    ASSERT_TRUE(created.ok()) << created.status();
    const std::string name = (*created)->name();
    EXPECT_TRUE(IsValidSegmentName(name)) << name;
    path = "/dev/shm" + name;
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(static_cast<unsigned char*>((*created)->data())[8191], 0);

    std::memcpy((*created)->data(), "tandem", 6);
    {
      absl::StatusOr<std::unique_ptr<SharedSegment>> opened = SharedSegment::Open(name);
      ASSERT_TRUE(opened.ok()) << opened.status();
      EXPECT_EQ((*opened)->size(), 8192u);
      EXPECT_EQ(std::memcmp((*opened)->data(), "tandem", 6), 0);
    }
    EXPECT_EQ(stat(path.c_str(), &st), 0) << "an opener must not remove the segment";
  }
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
}

TEST(SharedSegmentTest, NamesAreRandomAndOpenChecksThem) {
  absl::StatusOr<std::string> a = RandomSegmentName();
  absl::StatusOr<std::string> b = RandomSegmentName();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_FALSE(IsValidSegmentName("/tandem-../../etc/passwd"));
  EXPECT_TRUE(absl::IsInvalidArgument(SharedSegment::Open("/other").status()));
  EXPECT_TRUE(absl::IsNotFound(SharedSegment::Open(*a).status()));
}

TEST(ChannelViewTest, OpenRejectsForeignAndInconsistentSegments) {
  absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(SmallCapacities());
  std::vector<uint64_t> memory(layout->segment_bytes / 8 + 8);
  ASSERT_TRUE(ChannelView::Initialize(memory.data(), layout->segment_bytes, SmallCapacities(), 7,
                                      1)
                  .ok());
  EXPECT_TRUE(ChannelView::Open(memory.data(), layout->segment_bytes).ok());
  // Too small for its own capacities.
  absl::Status s = ChannelView::Open(memory.data(), layout->segment_bytes - 64).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  // Wrong version.
  reinterpret_cast<ChannelHeader*>(memory.data())->protocol_version = 99;
  s = ChannelView::Open(memory.data(), layout->segment_bytes).status();
  EXPECT_NE(s.message().find("protocol_version"), std::string::npos) << s;
  // Not a channel at all.
  reinterpret_cast<ChannelHeader*>(memory.data())->magic = 0;
  s = ChannelView::Open(memory.data(), layout->segment_bytes).status();
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s;
}

class RequestValidatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(SmallCapacities());
    memory_.resize(layout->segment_bytes / 8);
    view_ = *ChannelView::Initialize(memory_.data(), layout->segment_bytes, SmallCapacities(),
                                     42, 1);
    shape_ = {4, 8, 16, 42, 0, 8};
    request_ = {kChannelProtocolVersion, 0, 42, 1, 3, 2, 2, 0, 0};
  }
  ReplyStatus HeaderStatus() { return ValidateRequestHeader(request_, view_, shape_).status; }

  std::vector<uint64_t> memory_;
  ChannelView view_;
  ExpertModelShape shape_;
  RequestHeader request_;
};

TEST_F(RequestValidatorTest, AcceptsAGoodRequest) { EXPECT_EQ(HeaderStatus(), ReplyStatus::kOk); }

TEST_F(RequestValidatorTest, RejectsEachBadHeaderField) {
  request_.protocol_version = 2;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadVersion);
  SetUp();
  request_.fingerprint = 43;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadFingerprint);
  SetUp();
  request_.flags = 1u << 7;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadFlags);
  SetUp();
  request_.layer = 4;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadLayer);
  SetUp();
  request_.pair_count = 17;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kTooManyPairs);
  SetUp();
  request_.activation_row_count = 9;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kTooManyRows);
  SetUp();
  request_.output_offset = 32;  // not aligned
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadOutputOffset);
  SetUp();
  request_.pair_count = 16;  // fills the outputs exactly: any offset is past the end
  request_.output_offset = 64;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadOutputOffset);
  request_.output_offset = ~uint64_t{0} - 63;  // would wrap around when added
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kBadOutputOffset);
  request_.output_offset = 0;
  EXPECT_EQ(HeaderStatus(), ReplyStatus::kOk);
}

TEST_F(RequestValidatorTest, RejectsEachBadPairNamingIt) {
  std::vector<ExpertRowPair> pairs = {{0, 0}, {7, 1}};
  EXPECT_EQ(ValidateRequestPairs(pairs, 2, shape_).status, ReplyStatus::kOk);
  pairs[1] = {8, 1};
  RequestVerdict v = ValidateRequestPairs(pairs, 2, shape_);
  EXPECT_EQ(v.status, ReplyStatus::kBadExpert);
  EXPECT_NE(v.message.find("pair 1: expert 8"), std::string::npos) << v.message;
  pairs[1] = {7, 2};
  EXPECT_EQ(ValidateRequestPairs(pairs, 2, shape_).status, ReplyStatus::kBadRow);
  shape_.expert_begin = 4;  // a worker holding [4, 8)
  pairs[1] = {7, 1};
  v = ValidateRequestPairs(pairs, 2, shape_);
  EXPECT_EQ(v.status, ReplyStatus::kBadExpert);
  EXPECT_NE(v.message.find("not held"), std::string::npos) << v.message;
}

TEST(DoorbellTest, SleepingWaiterWakesOnPublish) {
  alignas(64) uint64_t sequence = 0;
  alignas(64) uint32_t waiters = 0;
  DoorbellWaitOptions options{absl::ZeroDuration(), absl::Seconds(60), absl::Milliseconds(1)};
  std::thread publisher([&] {
    while (std::atomic_ref<uint32_t>(waiters).load() == 0) std::this_thread::yield();
    PublishSequence(&sequence, &waiters, 1);
  });
  // The sleep slice outlasts the deadline: a lost wake-up would end in kDeadline.
  EXPECT_EQ(WaitForSequence(&sequence, &waiters, 1, absl::Now() + absl::Seconds(20), options,
                            [] { return false; }),
            DoorbellWait::kArrived);
  publisher.join();
}

TEST(DoorbellTest, DeadlineAndAbortEndTheWait) {
  alignas(64) uint64_t sequence = 5;
  alignas(64) uint32_t waiters = 0;
  DoorbellWaitOptions options{absl::Microseconds(100), absl::Milliseconds(1),
                              absl::Microseconds(10)};
  EXPECT_EQ(WaitForSequence(&sequence, &waiters, 5, absl::InfiniteFuture(), options,
                            [] { return false; }),
            DoorbellWait::kArrived);
  EXPECT_EQ(WaitForSequence(&sequence, &waiters, 6, absl::Now() + absl::Milliseconds(5), options,
                            [] { return false; }),
            DoorbellWait::kDeadline);
  int checks = 0;
  EXPECT_EQ(WaitForSequence(&sequence, &waiters, 6, absl::InfiniteFuture(), options,
                            [&] { return ++checks == 3; }),
            DoorbellWait::kAborted);
  EXPECT_EQ(waiters, 0u);
}

// In-process server: refusal on a fingerprint mismatch, one worker per channel, Stop().
class InProcessServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ChannelLayout> layout = ComputeChannelLayout(SmallCapacities());
    segment_ = *SharedSegment::Create(layout->segment_bytes);
    view_ = *ChannelView::Initialize(segment_->data(), segment_->size(), SmallCapacities(),
                                     FakeModelFingerprint(4, 8, 16), getpid());
  }
  ExpertModelShape Shape(uint32_t salt = 0) {
    return {4, 8, 16, FakeModelFingerprint(4, 8, 16, salt), 0, 8};
  }
  std::unique_ptr<SharedSegment> segment_;
  ChannelView view_;
};

TEST_F(InProcessServerTest, RefusesAnotherModelAndSaysWhyInTheHeader) {
  FakeExpertRowComputer computer(Shape(/*salt=*/1));
  absl::StatusOr<std::unique_ptr<ChannelServer>> server =
      ChannelServer::Attach(segment_->name(), &computer);
  EXPECT_TRUE(absl::IsFailedPrecondition(server.status()));
  EXPECT_NE(server.status().message().find("fingerprint"), std::string::npos);
  EXPECT_EQ(view_.header().worker_state, static_cast<uint32_t>(WorkerState::kRefused));
  EXPECT_NE(std::string(view_.header().worker_message).find("fingerprint"), std::string::npos);
}

TEST_F(InProcessServerTest, OneWorkerPerChannelAndStopEndsServe) {
  FakeExpertRowComputer computer(Shape());
  absl::StatusOr<std::unique_ptr<ChannelServer>> server =
      ChannelServer::Attach(segment_->name(), &computer);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::Status served = absl::UnknownError("not returned");
  std::thread serving([&] { served = (*server)->Serve(); });
  while (std::atomic_ref<uint32_t>(view_.header().worker_state).load() !=
         static_cast<uint32_t>(WorkerState::kReady)) {
    std::this_thread::yield();
  }
  FakeExpertRowComputer second_computer(Shape());
  absl::Status second = ChannelServer::Attach(segment_->name(), &second_computer).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(second)) << second;
  EXPECT_NE(second.message().find("already served"), std::string::npos) << second;
  (*server)->Stop();
  serving.join();
  EXPECT_TRUE(served.ok()) << served;
  EXPECT_EQ(view_.header().worker_state, static_cast<uint32_t>(WorkerState::kExited));
}

}  // namespace
}  // namespace tandem
