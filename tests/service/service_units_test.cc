// Small pieces of the service: wire parsing that names bad UTF-8 fields, request validation,
// the expert budget flag and placement, the Prometheus text, the gRPC server's port.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/impl/service_type.h>

#include "gpu_service/backend/expert_placement.h"
#include "gpu_service/metrics/metrics_registry.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/server/grpc_server.h"
#include "gpu_service/server/listen_check.h"
#include "gpu_service/server/raw_request.h"
#include "gpu_service/server/request_validation.h"
#include "gtest/gtest.h"
#include "tests/service/fake_backend.h"

namespace tandem {
namespace {

TEST(RawRequestTest, NamesTheStringFieldWithInvalidUtf8) {
  v1::GenerateRequest req;
  req.add_inputs()->set_text("fine");
  auto* chat = req.add_inputs()->mutable_chat();
  chat->add_messages()->set_content("ok");
  chat->add_messages()->set_content(std::string("a\xC3(", 3));
  const std::string wire = req.SerializePartialAsString();
  EXPECT_EQ(FindInvalidUtf8Field(v1::GenerateRequest::descriptor(), wire),
            "inputs[1].chat.messages[1].content: invalid UTF-8 at byte 1");

  grpc::Slice slice(wire);
  grpc::ByteBuffer buffer(&slice, 1);
  v1::GenerateRequest parsed;
  absl::Status s = ParseMessage(buffer, &parsed);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "inputs[1].chat.messages[1].content: invalid UTF-8 at byte 1");

  grpc::Slice junk(std::string("\xff\xff\xff", 3));
  grpc::ByteBuffer bad(&junk, 1);
  EXPECT_EQ(ParseMessage(bad, &parsed).message(), "request: not a valid tandem.v1.GenerateRequest");
}

TEST(RequestValidationTest, MapsParametersAndDefaults) {
  FakeBackend backend;
  ServingLimits limits;
  limits.model_id = "m";
  limits.vocab = 1024;
  limits.max_context = 100;
  v1::GenerationInput input;
  input.set_text("Hello");
  absl::StatusOr<std::vector<int32_t>> ids =
      InputTokens(input, backend.tokenizer(), limits, "input");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, backend.tokenizer().Encode("Hello", false));
  v1::GenerationParameters params;
  params.mutable_sampling()->set_seed(0);
  params.mutable_response()->set_top_n_tokens(2);
  absl::StatusOr<GenerationSpec> spec = BuildGenerationSpec(*ids, params, limits, "input");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stopping.max_new_tokens, 20);  // the default
  EXPECT_EQ(spec->sampling.top_p, 1.0f);         // unset = off
  EXPECT_EQ(spec->sampling.repetition_penalty, 1.0f);
  ASSERT_TRUE(spec->sampling.seed.has_value());  // seed 0 is a seed
  EXPECT_EQ(*spec->sampling.seed, 0u);
  EXPECT_TRUE(spec->logprobs);
  EXPECT_TRUE(CheckModelId("", limits).ok());
  EXPECT_TRUE(CheckModelId("m", limits).ok());
  EXPECT_EQ(CheckModelId("x", limits).message().rfind("model_id:", 0), 0u);

  params.mutable_stopping()->set_min_new_tokens(30);
  EXPECT_EQ(BuildGenerationSpec(*ids, params, limits, "input").status().message().rfind(
                "params.stopping.min_new_tokens", 0),
            0u);
}

TEST(RequestValidationTest, DeadlineTakesTheEarlierAndNeverOverflows) {
  using std::chrono::milliseconds;
  using std::chrono::system_clock;
  const SteadyTime now = std::chrono::steady_clock::now();
  const system_clock::time_point wall = system_clock::now();
  const system_clock::time_point no_call = system_clock::time_point::max();
  EXPECT_EQ(RequestDeadline(0, no_call, now, wall), SteadyTime::max());
  EXPECT_EQ(RequestDeadline(1500, no_call, now, wall), now + milliseconds(1500));
  // The call's deadline less the 10 ms margin, when it comes first.
  EXPECT_EQ(RequestDeadline(0, wall + milliseconds(5000), now, wall), now + milliseconds(4990));
  EXPECT_EQ(RequestDeadline(100, wall + milliseconds(5000), now, wall), now + milliseconds(100));
  EXPECT_EQ(RequestDeadline(9000, wall + milliseconds(5000), now, wall), now + milliseconds(4990));
  // A call already past its deadline ends at once.
  EXPECT_LT(RequestDeadline(0, wall - milliseconds(1), now, wall), now);
  // Limits past the clock's range are no limit: a uint64 of milliseconds does not fit the clock's
  // signed nanoseconds, and once wrapped into the past ended requests at once with no token.
  for (uint64_t huge : {UINT64_MAX, uint64_t{1} << 63, uint64_t{1} << 62, uint64_t{1} << 44}) {
    EXPECT_EQ(RequestDeadline(huge, no_call, now, wall), SteadyTime::max()) << huge;
    EXPECT_EQ(RequestDeadline(huge, wall + milliseconds(5000), now, wall),
              now + milliseconds(4990))
        << huge;
  }
  // A year is well inside the range.
  const uint64_t year = 365ull * 24 * 3600 * 1000;
  EXPECT_EQ(RequestDeadline(year, no_call, now, wall), now + milliseconds(year));
}

TEST(GrpcServerTest, ASecondServerOnTheSamePortFails) {
  // A service with no methods is enough to bind.
  grpc::Service first_service, second_service;
  GrpcServerOptions options;
  options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<GrpcServer>> first = GrpcServer::Start(options, &first_service);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<GrpcServer>> second = GrpcServer::Start(options, &second_service);
  EXPECT_FALSE(second.ok());  // gRPC's default SO_REUSEPORT would have let it share the port
  EXPECT_EQ(second.status().message().rfind("--listen:", 0), 0u) << second.status();
  EXPECT_EQ(CheckListenAddressFree("--listen", options.listen).code(),
            absl::StatusCode::kFailedPrecondition);
  (*first)->Shutdown(std::chrono::system_clock::now());
  first->reset();
  EXPECT_TRUE(CheckListenAddressFree("--listen", options.listen).ok());
  EXPECT_TRUE(CheckListenAddressFree("--listen", "127.0.0.1:0").ok());
  EXPECT_TRUE(CheckListenAddressFree("--listen", "unix:/tmp/x").ok());  // left to the server
  EXPECT_EQ(CheckListenAddressFree("--listen", "no-such-host.invalid:1").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExpertBudgetTest, ParsesFractionsAndBytes) {
  EXPECT_DOUBLE_EQ(ParseExpertBudget("0.5")->fraction, 0.5);
  EXPECT_DOUBLE_EQ(ParseExpertBudget("25%")->fraction, 0.25);
  EXPECT_EQ(ParseExpertBudget("1.0")->Resolve(1000), 1000u);
  EXPECT_EQ(ParseExpertBudget("4096")->bytes, 4096u);
  EXPECT_EQ(ParseExpertBudget("2KiB")->bytes, 2048u);
  EXPECT_EQ(ParseExpertBudget("3G")->bytes, 3ull << 30);
  EXPECT_EQ(ParseExpertBudget("3GB")->bytes, 3000000000ull);
  for (const char* bad : {"", "1.5", "-1", "12XB", "abc", "150%"}) {
    absl::StatusOr<ExpertBudget> b = ParseExpertBudget(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().message().rfind("--gpu-expert-budget", 0), 0u);
  }
}

TEST(ExpertPlacementTest, SpreadsTheBudgetAcrossLayers) {
  ModelWeights w;
  w.layers.resize(3);
  static const uint8_t data[1] = {};
  for (LayerWeights& l : w.layers) {
    for (ExpertMatrixView* m : {&l.moe.gate, &l.moe.up, &l.moe.down}) {
      m->data = data;
      m->rows = 2;
      m->row_bytes = 5;  // 10 bytes per matrix per expert, 30 per expert
      m->experts = 4;
    }
  }
  StaticExpertPlacement half = StaticExpertPlacement::FromBudget(w, 4, ExpertBudget{0.5, 0});
  EXPECT_EQ(half.all_bytes(), 3u * 4u * 30u);
  EXPECT_EQ(half.local_count(), 6);
  EXPECT_EQ(half.remote_count(), 6);
  for (int l = 0; l < 3; ++l) {
    EXPECT_TRUE(half.IsLocal(l, 0));
    EXPECT_TRUE(half.IsLocal(l, 1));
    EXPECT_FALSE(half.IsLocal(l, 2));
  }
  EXPECT_TRUE(StaticExpertPlacement::FromBudget(w, 4, ExpertBudget::All()).all_local());
  EXPECT_EQ(StaticExpertPlacement::FromBudget(w, 4, ExpertBudget{-1, 0}).local_count(), 0);
}

TEST(MetricsRegistryTest, RendersTheTextFormat) {
  MetricsRegistry r;
  r.Counter("tandem:x_total", "An x.", {{"kind", "a"}})->Add(2);
  r.Counter("tandem:x_total", "An x.", {{"kind", "b\"q"}})->Add(1.5);
  MetricValue* g = r.Gauge("tandem:g", "A gauge.");
  r.AddCollector([g] { g->Set(7); });
  Histogram* h = r.AddHistogram("tandem:h_seconds", "A histogram.", {0.1, 1});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(5);
  EXPECT_EQ(r.Render(),
            "# HELP tandem:g A gauge.\n# TYPE tandem:g gauge\ntandem:g 7\n"
            "# HELP tandem:h_seconds A histogram.\n# TYPE tandem:h_seconds histogram\n"
            "tandem:h_seconds_bucket{le=\"0.1\"} 1\ntandem:h_seconds_bucket{le=\"1\"} 2\n"
            "tandem:h_seconds_bucket{le=\"+Inf\"} 3\ntandem:h_seconds_sum 5.55\n"
            "tandem:h_seconds_count 3\n"
            "# HELP tandem:x_total An x.\n# TYPE tandem:x_total counter\n"
            "tandem:x_total{kind=\"a\"} 2\ntandem:x_total{kind=\"b\\\"q\"} 1.5\n");
}

}  // namespace
}  // namespace tandem
