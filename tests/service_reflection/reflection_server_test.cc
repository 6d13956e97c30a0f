// The service's real gRPC server (GrpcServer::Start, the setup of tandem-gpu-service) with the
// Generation service registered, asked over loopback through reflection v1 (this project's
// service) and v1alpha (Debian's gRPC plugin). The two versions' messages have the same fields and
// numbers, so the v1 message classes also speak v1alpha; that is how the v1alpha stream is read.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/strings/str_cat.h"
#include "gpu_service/server/grpc_server.h"
#include "gpu_service/server/reflection_v1.h"
#include "gtest/gtest.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

constexpr char kV1Method[] = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
constexpr char kV1AlphaMethod[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

// One reflection stream: Ask() writes a request and reads its response.
class ReflectionStreamClient {
 public:
  ReflectionStreamClient(const std::shared_ptr<grpc::Channel>& channel, const char* method)
      : method_(method, grpc::internal::RpcMethod::BIDI_STREAMING, channel) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    stream_.reset(grpc::internal::ClientReaderWriterFactory<
                  ServerReflectionRequest, ServerReflectionResponse>::Create(channel.get(), method_,
                                                                             &context_));
  }

  // False when the stream broke (the response is then left empty).
  bool Ask(const ServerReflectionRequest& request, ServerReflectionResponse* response) {
    return stream_->Write(request) && stream_->Read(response);
  }

  grpc::Status Close() {
    stream_->WritesDone();
    return stream_->Finish();
  }

 private:
  grpc::internal::RpcMethod method_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
      stream_;
};

class ReflectionServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options;
    options.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, &generation_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  std::vector<std::string> ListServices(const char* method) {
    ReflectionStreamClient client(channel_, method);
    ServerReflectionRequest request;
    request.set_list_services("");
    ServerReflectionResponse response;
    EXPECT_TRUE(client.Ask(request, &response));
    EXPECT_TRUE(client.Close().ok());
    EXPECT_TRUE(response.has_list_services_response()) << response.DebugString();
    std::vector<std::string> names;
    for (const auto& service : response.list_services_response().service()) {
      names.push_back(service.name());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // The Generation API with every method answering UNIMPLEMENTED: enough for reflection, which
  // only looks at what is registered and at the generated descriptors.
  v1::Generation::CallbackService generation_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

const std::vector<std::string> kRegisteredServices = {
    "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection", "tandem.v1.Generation"};

TEST_F(ReflectionServerTest, ListsTheRegisteredServicesThroughV1AndV1Alpha) {
  EXPECT_EQ(ListServices(kV1Method), kRegisteredServices);
  EXPECT_EQ(ListServices(kV1AlphaMethod), kRegisteredServices);
}

TEST_F(ReflectionServerTest, DescribesTheGenerationServiceAsV1AlphaDoes) {
  ReflectionStreamClient client(channel_, kV1Method);
  ServerReflectionRequest request;
  request.set_host("localhost");
  request.set_file_containing_symbol("tandem.v1.Generation");
  ServerReflectionResponse response;
  ASSERT_TRUE(client.Ask(request, &response));
  EXPECT_EQ(response.valid_host(), "localhost");
  EXPECT_EQ(response.original_request().file_containing_symbol(), "tandem.v1.Generation");
  ASSERT_TRUE(response.has_file_descriptor_response()) << response.DebugString();
  const auto& files = response.file_descriptor_response().file_descriptor_proto();
  ASSERT_GE(files.size(), 1);
  pb::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(files[0]));
  EXPECT_EQ(file.name(), "tandem/v1/generation.proto");
  EXPECT_EQ(file.package(), "tandem.v1");
  ASSERT_EQ(file.service_size(), 1);
  EXPECT_EQ(file.service(0).name(), "Generation");
  std::vector<std::string> methods;
  for (const auto& method : file.service(0).method()) methods.push_back(method.name());
  EXPECT_EQ(methods, (std::vector<std::string>{"Generate", "GenerateStream", "Tokenize",
                                               "Detokenize", "ModelInfo"}));
  EXPECT_TRUE(file.service(0).method(1).server_streaming());
  EXPECT_EQ(file.service(0).method(1).output_type(), ".tandem.v1.GenerationChunk");

  // Debian's v1alpha service sends the same file, byte for byte.
  ReflectionStreamClient alpha(channel_, kV1AlphaMethod);
  ServerReflectionResponse alpha_response;
  ASSERT_TRUE(alpha.Ask(request, &alpha_response));
  ASSERT_TRUE(alpha_response.has_file_descriptor_response()) << alpha_response.DebugString();
  ASSERT_GE(alpha_response.file_descriptor_response().file_descriptor_proto_size(), 1);
  EXPECT_EQ(alpha_response.file_descriptor_response().file_descriptor_proto(0), files[0]);
  EXPECT_TRUE(alpha.Close().ok());

  // A method, a message and an enum of the same file, on the same stream: the file asked for is
  // sent again each time.
  for (const char* symbol :
       {"tandem.v1.Generation.GenerateStream", "tandem.v1.GenerateRequest", "tandem.v1.StopReason"}) {
    request.set_file_containing_symbol(symbol);
    ASSERT_TRUE(client.Ask(request, &response)) << symbol;
    ASSERT_TRUE(response.has_file_descriptor_response()) << symbol;
    ASSERT_GE(response.file_descriptor_response().file_descriptor_proto_size(), 1) << symbol;
    EXPECT_EQ(response.file_descriptor_response().file_descriptor_proto(0), files[0]) << symbol;
  }
  EXPECT_TRUE(client.Close().ok());
}

TEST_F(ReflectionServerTest, AnswersErrorsAndKeepsTheStreamOpen) {
  ReflectionStreamClient client(channel_, kV1Method);
  ServerReflectionRequest request;
  ServerReflectionResponse response;

  request.set_file_by_filename("tandem/v1/no_such.proto");
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_error_response()) << response.DebugString();
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(response.error_response().error_message(),
            "file_by_filename: no file named \"tandem/v1/no_such.proto\"");

  request.set_file_containing_symbol("tandem.v1.Generation.Nope");
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  request.mutable_file_containing_extension()->set_containing_type("google.protobuf.FieldOptions");
  request.mutable_file_containing_extension()->set_extension_number(987654);
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  request.set_all_extension_numbers_of_type("tandem.v1.NoSuchMessage");
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);

  request.set_all_extension_numbers_of_type("tandem.v1.GenerateRequest");  // proto3: none
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_all_extension_numbers_response()) << response.DebugString();
  EXPECT_EQ(response.all_extension_numbers_response().base_type_name(),
            "tandem.v1.GenerateRequest");
  EXPECT_EQ(response.all_extension_numbers_response().extension_number_size(), 0);

  request.Clear();
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  request.set_list_services("");
  ASSERT_TRUE(client.Ask(request, &response));
  EXPECT_EQ(response.list_services_response().service_size(),
            static_cast<int>(kRegisteredServices.size()));
  EXPECT_TRUE(client.Close().ok());
}

TEST_F(ReflectionServerTest, SendsTransitiveDependenciesOncePerStream) {
  // google/protobuf/api.proto imports source_context.proto and type.proto; type.proto imports
  // any.proto and source_context.proto (all in libprotobuf's generated pool).
  ReflectionStreamClient client(channel_, kV1Method);
  ServerReflectionRequest request;
  request.set_file_by_filename("google/protobuf/api.proto");
  ServerReflectionResponse response;
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_TRUE(response.has_file_descriptor_response()) << response.DebugString();
  std::vector<std::string> names;
  pb::SimpleDescriptorDatabase received;  // what a client does: files by name, deps on demand
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    pb::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    names.push_back(file.name());
    ASSERT_TRUE(received.Add(file)) << file.name();
  }
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "google/protobuf/api.proto");
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::string>{
                        "google/protobuf/any.proto", "google/protobuf/api.proto",
                        "google/protobuf/source_context.proto", "google/protobuf/type.proto"}));
  // Complete: the file builds from what was received alone.
  pb::DescriptorPool rebuilt(&received);
  ASSERT_NE(rebuilt.FindFileByName("google/protobuf/api.proto"), nullptr);
  EXPECT_NE(rebuilt.FindMessageTypeByName("google.protobuf.Api"), nullptr);

  // type.proto again on the same stream: only itself (its dependencies were sent).
  request.set_file_by_filename("google/protobuf/type.proto");
  ASSERT_TRUE(client.Ask(request, &response));
  ASSERT_EQ(response.file_descriptor_response().file_descriptor_proto_size(), 1);
  EXPECT_TRUE(client.Close().ok());

  // On a new stream, with its dependencies.
  ReflectionStreamClient other(channel_, kV1Method);
  ASSERT_TRUE(other.Ask(request, &response));
  EXPECT_EQ(response.file_descriptor_response().file_descriptor_proto_size(), 3);
  EXPECT_TRUE(other.Close().ok());
}

}  // namespace
}  // namespace tandem
