// tandem-gpu-service end to end: a real service process on a loopback port with the `tiny` model,
// called by a C++ gRPC client. Greedy outputs are compared with the offline path (ReferenceModel
// run directly in this process).
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>

#include "common/model/reference_model.h"
#include "common/model/sampler.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tests/service/service_process.h"

namespace tandem {
namespace {

using v1::Generation;

// Greedy tokens of the offline path, n of them, EOS not special (the requests set ignore_eos).
std::vector<uint32_t> OfflineGreedy(ReferenceModel& m, const std::string& prompt, int n) {
  std::vector<int32_t> ids = m.tokenizer().Encode(prompt, false);
  auto seq = m.NewSequence();
  EXPECT_TRUE(seq.ok());
  std::vector<float> logits(m.config().vocab);
  std::vector<uint32_t> out;
  ReferenceModel::Step step{seq->get(), ids, logits.data(), false};
  EXPECT_TRUE(m.Forward(std::span(&step, 1)).ok());
  for (int i = 0; i < n; ++i) {
    const int32_t next = Argmax(logits);
    out.push_back(static_cast<uint32_t>(next));
    if (i + 1 == n) break;
    const int32_t one[1] = {next};
    step = ReferenceModel::Step{seq->get(), one, logits.data(), false};
    EXPECT_TRUE(m.Forward(std::span(&step, 1)).ok());
  }
  return out;
}

ReferenceModel& Offline() {
  static std::unique_ptr<ReferenceModel> model = [] {
    ReferenceModelOptions o;
    o.threads = 2;
    auto m = ReferenceModel::Open(TinyModelPath(), o);
    EXPECT_TRUE(m.ok()) << m.status();
    return *std::move(m);
  }();
  return *model;
}

v1::GenerationParameters Greedy(int max_new_tokens) {
  v1::GenerationParameters p;
  p.mutable_stopping()->set_max_new_tokens(max_new_tokens);
  p.mutable_stopping()->set_ignore_eos(true);
  p.mutable_response()->set_generated_tokens(true);
  return p;
}

struct StreamResult {
  grpc::Status status;
  std::vector<v1::GenerationChunk> chunks;
  std::vector<uint32_t> ids;
  std::string text;
};

StreamResult Stream(Generation::Stub& stub, const std::string& prompt,
                    const v1::GenerationParameters& params) {
  grpc::ClientContext ctx;
  v1::GenerateStreamRequest req;
  req.mutable_input()->set_text(prompt);
  *req.mutable_params() = params;
  auto reader = stub.GenerateStream(&ctx, req);
  StreamResult r;
  v1::GenerationChunk c;
  while (reader->Read(&c)) {
    for (const auto& t : c.tokens()) r.ids.push_back(t.id());
    r.text += c.text();
    r.chunks.push_back(c);
  }
  r.status = reader->Finish();
  return r;
}

// Polls a metric until it equals `want` (the service updates it asynchronously); 30 s at most.
bool WaitForMetric(const ServiceProcess& service, const std::string& series, double want) {
  for (int i = 0; i < 3000; ++i) {
    if (service.Metric(series) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(ServiceIntegrationTest, HealthReflectionAndModelInfo) {
  ServiceProcess service;
  EXPECT_EQ(service.Health(), 1);  // SERVING
  auto stub = Generation::NewStub(service.channel());
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-request-id", "req-42");
  v1::ModelInfoRequest req;
  v1::ModelInfoResponse resp;
  ASSERT_TRUE(stub->ModelInfo(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.model_id(), "tiny");
  EXPECT_EQ(resp.backend(), TestBackend());  // the backend the harness asked for
  EXPECT_EQ(resp.vocab_size(), static_cast<uint32_t>(Offline().config().vocab));
  EXPECT_GT(resp.parameter_count(), 0u);
  auto md = ctx.GetServerInitialMetadata();
  auto it = md.find("x-request-id");
  ASSERT_NE(it, md.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), "req-42");
  EXPECT_NE(service.Log().find("\"request_id\":\"req-42\""), std::string::npos);
  // Server reflection (v1alpha here; tests/service_reflection covers v1) lists the service.
  EXPECT_NE(service.ReflectionListServices().find("tandem.v1.Generation"), std::string::npos);
}

TEST(ServiceIntegrationTest, GenerateAndStreamMatchTheOfflinePath) {
  ServiceProcess service;
  auto stub = Generation::NewStub(service.channel());
  const std::vector<std::string> prompts = {"Hello world", "The quick brown fox", "1 2 3"};
  const int n = 10;
  v1::GenerateRequest req;
  for (const std::string& p : prompts) req.add_inputs()->set_text(p);
  *req.mutable_params() = Greedy(n);
  grpc::ClientContext ctx;
  v1::GenerateResponse resp;
  grpc::Status s = stub->Generate(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.results_size(), 3);
  EXPECT_FALSE(resp.request_id().empty());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const v1::GenerationResult& r = resp.results(static_cast<int>(i));
    std::vector<uint32_t> ids;
    for (const auto& t : r.tokens()) ids.push_back(t.id());
    EXPECT_EQ(ids, OfflineGreedy(Offline(), prompts[i], n)) << prompts[i];
    EXPECT_EQ(r.stop_reason(), v1::MAX_TOKENS);
    EXPECT_EQ(r.generated_token_count(), static_cast<uint32_t>(n));

    StreamResult st = Stream(*stub, prompts[i], Greedy(n));
    ASSERT_TRUE(st.status.ok()) << st.status.error_message();
    EXPECT_EQ(st.ids, ids);
    EXPECT_EQ(st.text, r.text());
    ASSERT_GE(st.chunks.size(), 2u);
    EXPECT_EQ(st.chunks.front().input_token_count(), r.input_token_count());
    EXPECT_EQ(st.chunks.back().stop_reason(), v1::MAX_TOKENS);
    EXPECT_EQ(st.chunks.back().generated_token_count(), static_cast<uint32_t>(n));
    for (size_t c = 0; c + 1 < st.chunks.size(); ++c) {
      EXPECT_EQ(st.chunks[c].stop_reason(), v1::NOT_FINISHED);
    }
  }
}

TEST(ServiceIntegrationTest, ConcurrentStreamsEqualTheirSoloRuns) {
  ServiceProcess service({"--max-running=32", "--step-token-budget=64"});
  auto stub = Generation::NewStub(service.channel());
  constexpr int kStreams = 32;
  std::vector<std::string> prompts;
  std::vector<int> lengths;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back("stream " + std::to_string(i) + std::string(static_cast<size_t>(i % 5), '!'));
    lengths.push_back(2 + i % 7);
  }
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] { results[i] = Stream(*stub, prompts[i], Greedy(lengths[i])); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, OfflineGreedy(Offline(), prompts[i], lengths[i])) << "stream " << i;
  }
}

TEST(ServiceIntegrationTest, BadInputIsInvalidArgumentNamingTheField) {
  ServiceProcess service({"--max-context=64", "--max-new-tokens-cap=32"});
  auto stub = Generation::NewStub(service.channel());
  struct Case {
    std::string field;
    std::function<void(v1::GenerateRequest*)> edit;
  };
  const int64_t vocab = Offline().config().vocab;
  const std::vector<Case> cases = {
      {"inputs[0]", [](auto* r) { r->mutable_inputs(0)->clear_input(); }},
      {"inputs[0].text", [](auto* r) { r->mutable_inputs(0)->set_text(""); }},
      {"inputs[0].token_ids.ids[1]",
       [vocab](auto* r) {
         auto* ids = r->mutable_inputs(0)->mutable_token_ids();
         ids->add_ids(1);
         ids->add_ids(static_cast<uint32_t>(vocab));
       }},
      {"inputs[0].text: invalid UTF-8 at byte 2",
       [](auto* r) { r->mutable_inputs(0)->set_text(std::string("ab\xff", 3)); }},
      {"params.sampling.temperature",
       [](auto* r) { r->mutable_params()->mutable_sampling()->set_temperature(-1); }},
      {"params.sampling.top_p",
       [](auto* r) { r->mutable_params()->mutable_sampling()->set_top_p(1.5f); }},
      {"params.sampling.top_k",
       [](auto* r) {
         r->mutable_params()->mutable_sampling()->set_top_k(static_cast<uint32_t>(-3));
       }},
      {"params.sampling.min_p",
       [](auto* r) { r->mutable_params()->mutable_sampling()->set_min_p(1.5f); }},
      {"params.stopping.max_new_tokens",
       [](auto* r) { r->mutable_params()->mutable_stopping()->set_max_new_tokens(33); }},
      {"inputs[0]",  // a prompt over the context limit, without truncation
       [](auto* r) {
         auto* ids = r->mutable_inputs(0)->mutable_token_ids();
         for (int i = 0; i < 80; ++i) ids->add_ids(300);
       }},
      {"params.stopping.stop_sequences",
       [](auto* r) {
         for (int i = 0; i < 17; ++i) r->mutable_params()->mutable_stopping()->add_stop_sequences("x");
       }},
      {"params.stopping.stop_sequences[0]",
       [](auto* r) {
         r->mutable_params()->mutable_stopping()->add_stop_sequences(std::string(300, 'x'));
       }},
      {"model_id", [](auto* r) { r->set_model_id("no-such-model"); }},
      {"inputs[0].chat.messages[1].role",
       [](auto* r) {
         auto* chat = r->mutable_inputs(0)->mutable_chat();
         auto* m = chat->add_messages();
         m->set_role("user");
         m->set_content("hi");
         m = chat->add_messages();
         m->set_role("robot");
         m->set_content("beep");
       }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req;
    req.add_inputs()->set_text("Hello");
    req.mutable_params()->mutable_stopping()->set_max_new_tokens(4);
    c.edit(&req);
    grpc::ClientContext ctx;
    v1::GenerateResponse resp;
    grpc::Status s = stub->Generate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_EQ(s.error_message().rfind(c.field, 0), 0u)
        << "want the message to start with '" << c.field << "', got: " << s.error_message();
  }
  // The same prompt over the limit passes with truncation.
  v1::GenerateRequest ok;
  auto* ids = ok.add_inputs()->mutable_token_ids();
  for (int i = 0; i < 80; ++i) ids->add_ids(300);
  ok.mutable_params()->set_truncate_input_tokens(32);
  ok.mutable_params()->mutable_stopping()->set_max_new_tokens(2);
  grpc::ClientContext ctx;
  v1::GenerateResponse resp;
  ASSERT_TRUE(stub->Generate(&ctx, ok, &resp).ok());
  EXPECT_EQ(resp.results(0).input_token_count(), 32u);
}

TEST(ServiceIntegrationTest, BadFlagsFailTheStartBeforeTheModelLoads) {
  // The model does not exist: each run must fail on its flag, checked before the model is opened.
  const std::string missing = "--model=" + BinaryDir() + "/no-such-model.gguf";
  struct Case {
    std::string flag;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--max-running=0", "--max-running: 0 < 1"},
      {"--kv-pages=-1", "--kv-pages: -1 < 0"},
      {"--threads=-2", "--threads: -2 < 0"},
      {"--default-max-new-tokens=50", "--default-max-new-tokens: 50 is above --max-new-tokens-cap 32"},
      {"--listen=no-such-host.invalid:5000", "--listen: cannot resolve 'no-such-host.invalid'"},
  };
  for (const Case& c : cases) {
    const StartUpExit run = RunServiceUntilExit({missing, "--max-new-tokens-cap=32", c.flag});
    EXPECT_EQ(run.code, 1) << c.flag << "\n" << run.log;
    EXPECT_NE(run.log.find(c.message), std::string::npos) << c.flag << "\n" << run.log;
    EXPECT_EQ(run.log.find("no-such-model"), std::string::npos) << c.flag << "\n" << run.log;
  }
  // With the flags right, the missing model is what fails.
  const StartUpExit run = RunServiceUntilExit({missing, "--listen=127.0.0.1:0"});
  EXPECT_EQ(run.code, 1) << run.log;
  EXPECT_NE(run.log.find("no-such-model.gguf"), std::string::npos) << run.log;
}

TEST(ServiceIntegrationTest, ASecondServiceOnATakenPortFailsToStart) {
  ServiceProcess first;
  ASSERT_EQ(first.Health(), 1) << first.Log();
  // gRPC binds with SO_REUSEPORT unless told not to; a second service there would share the
  // first one's connections. Both the early check (before the model loads) and the bind refuse.
  const std::string taken = "127.0.0.1:" + std::to_string(first.grpc_port());
  const StartUpExit run = RunServiceUntilExit({"--model=" + TinyModelPath(), "--listen=" + taken});
  EXPECT_EQ(run.code, 1) << run.log;
  EXPECT_NE(run.log.find("--listen: " + taken + " is in use"), std::string::npos) << run.log;
  const StartUpExit metrics = RunServiceUntilExit(
      {"--model=" + TinyModelPath(), "--listen=127.0.0.1:0",
       "--metrics-listen=127.0.0.1:" + std::to_string(first.metrics_port())});
  EXPECT_EQ(metrics.code, 1) << metrics.log;
  EXPECT_NE(metrics.log.find("--metrics-listen: "), std::string::npos) << metrics.log;
  EXPECT_EQ(first.Health(), 1) << first.Log();
}

TEST(ServiceIntegrationTest, CancellingMidStreamReturnsTheStatePool) {
  ServiceProcess service({"--max-new-tokens-cap=4000"});
  auto stub = Generation::NewStub(service.channel());
  const double idle_pages = service.Metric("tandem:state_pool_pages_in_use");
  ASSERT_GE(idle_pages, 0);
  grpc::ClientContext ctx;
  v1::GenerateStreamRequest req;
  req.mutable_input()->set_text("Cancel me");
  *req.mutable_params() = Greedy(4000);
  auto reader = stub->GenerateStream(&ctx, req);
  v1::GenerationChunk c;
  int read = 0;
  while (read < 3 && reader->Read(&c)) ++read;  // the input count, then two token chunks
  ASSERT_EQ(read, 3);
  EXPECT_GT(service.Metric("tandem:state_pool_pages_in_use"), idle_pages);
  ctx.TryCancel();
  while (reader->Read(&c)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForMetric(service, "tandem:request_success_total{finished_reason=\"cancelled\"}", 1));
  EXPECT_EQ(service.Metric("tandem:state_pool_pages_in_use"), idle_pages);
  EXPECT_EQ(service.Metric("tandem:num_requests_running"), 0);
}

TEST(ServiceIntegrationTest, FullQueueIsResourceExhausted) {
  ServiceProcess service({"--max-running=1", "--max-queue=1", "--max-new-tokens-cap=4000"});
  auto stub = Generation::NewStub(service.channel());
  // A runs (long), B waits in the queue, C finds the queue full.
  grpc::ClientContext a_ctx, b_ctx;
  v1::GenerateStreamRequest req;
  req.mutable_input()->set_text("long one");
  *req.mutable_params() = Greedy(4000);
  auto a = stub->GenerateStream(&a_ctx, req);
  v1::GenerationChunk c;
  ASSERT_TRUE(a->Read(&c));
  ASSERT_TRUE(a->Read(&c));  // a token: A is running
  auto b = stub->GenerateStream(&b_ctx, req);
  ASSERT_TRUE(WaitForMetric(service, "tandem:num_requests_waiting", 1));
  grpc::ClientContext c_ctx;
  v1::GenerateRequest creq;
  creq.add_inputs()->set_text("no room");
  v1::GenerateResponse cresp;
  grpc::Status s = stub->Generate(&c_ctx, creq, &cresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(service.Metric("tandem:request_rejected_total{reason=\"queue_full\"}"), 1);
  a_ctx.TryCancel();
  b_ctx.TryCancel();
  while (a->Read(&c)) {
  }
  while (b->Read(&c)) {
  }
  a->Finish();
  b->Finish();
}

TEST(ServiceIntegrationTest, SigtermDrainsInFlightRequests) {
  ServiceProcess service({"--drain-timeout=60s"});
  auto stub = Generation::NewStub(service.channel());
  const int n = 24;
  grpc::ClientContext ctx;
  v1::GenerateStreamRequest req;
  req.mutable_input()->set_text("Finish me");
  *req.mutable_params() = Greedy(n);
  auto reader = stub->GenerateStream(&ctx, req);
  v1::GenerationChunk c;
  ASSERT_TRUE(reader->Read(&c));
  ASSERT_TRUE(reader->Read(&c));  // generating
  std::vector<uint32_t> ids;
  for (const auto& t : c.tokens()) ids.push_back(t.id());
  service.Signal(SIGTERM);
  // Health turns NOT_SERVING; new requests are refused while the stream goes on.
  int health = 1;
  for (int i = 0; i < 3000 && health == 1; ++i) {
    health = service.Health();
    if (health == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(health, 1);
  grpc::ClientContext late_ctx;
  v1::GenerateRequest late;
  late.add_inputs()->set_text("too late");
  v1::GenerateResponse late_resp;
  EXPECT_EQ(stub->Generate(&late_ctx, late, &late_resp).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  v1::GenerationChunk last;
  while (reader->Read(&c)) {
    for (const auto& t : c.tokens()) ids.push_back(t.id());
    last = c;
  }
  grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(last.stop_reason(), v1::MAX_TOKENS);
  EXPECT_EQ(ids, OfflineGreedy(Offline(), "Finish me", n));
  EXPECT_EQ(service.Wait(), 0) << service.Log();
}

}  // namespace
}  // namespace tandem
