// ReflectionV1Answerer on a hand-built descriptor pool: files with dependencies, extensions,
// errors, and what a stream sends again and what it leaves out.
#include <string>
#include <vector>

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/text_format.h>

#include "gpu_service/server/reflection_v1.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// ext/base.proto: message Base with an extension range and an enum.
// ext/more.proto (imports base): extends Base with field 123 and declares message More.
// ext/top.proto (imports more): message Top { More more = 1; }.
class ExtensionPool {
 public:
  ExtensionPool() {
    Add(R"pb(name: "ext/base.proto" package: "ext" syntax: "proto2"
             message_type {
               name: "Base"
               field { name: "id" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 }
               extension_range { start: 100 end: 200 }
             }
             enum_type { name: "Color" value { name: "RED" number: 0 } })pb");
    Add(R"pb(name: "ext/more.proto" package: "ext" syntax: "proto2" dependency: "ext/base.proto"
             message_type { name: "More" }
             extension {
               name: "tag" number: 123 label: LABEL_OPTIONAL type: TYPE_INT32 extendee: ".ext.Base"
             })pb");
    Add(R"pb(name: "ext/top.proto" package: "ext" syntax: "proto2" dependency: "ext/more.proto"
             message_type {
               name: "Top"
               field {
                 name: "more" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".ext.More"
               }
             })pb");
  }
  const pb::DescriptorPool* pool() const { return &pool_; }

 private:
  void Add(const std::string& text) {
    pb::FileDescriptorProto file;
    ASSERT_TRUE(pb::TextFormat::ParseFromString(text, &file)) << text;
    ASSERT_NE(pool_.BuildFile(file), nullptr) << file.name();
  }
  pb::DescriptorPool pool_;
};

// The names of the files in a file_descriptor_response, in the order sent.
std::vector<std::string> FileNames(const ServerReflectionResponse& response) {
  std::vector<std::string> names;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    pb::FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    names.push_back(file.name());
  }
  return names;
}

ServerReflectionRequest FileByName(const std::string& name) {
  ServerReflectionRequest request;
  request.set_file_by_filename(name);
  return request;
}

ServerReflectionRequest Symbol(const std::string& name) {
  ServerReflectionRequest request;
  request.set_file_containing_symbol(name);
  return request;
}

using Names = std::vector<std::string>;

TEST(ReflectionAnswererTest, SendsTheFileThenItsDependenciesEachOnce) {
  ExtensionPool pool;
  ReflectionV1Answerer answerer(nullptr, pool.pool());
  ServerReflectionResponse response = answerer.Answer(FileByName("ext/top.proto"));
  EXPECT_EQ(FileNames(response), (Names{"ext/top.proto", "ext/more.proto", "ext/base.proto"}));

  // Complete: ext.Top builds from the answer's files alone (looked up by name, as clients do).
  pb::SimpleDescriptorDatabase received;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    pb::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    ASSERT_TRUE(received.Add(file)) << file.name();
  }
  pb::DescriptorPool rebuilt(&received);
  const pb::Descriptor* top = rebuilt.FindMessageTypeByName("ext.Top");
  ASSERT_NE(top, nullptr);
  EXPECT_EQ(top->field(0)->message_type()->full_name(), "ext.More");
}

TEST(ReflectionAnswererTest, LeavesOutDependenciesAlreadySentOnTheStreamButNotTheFileAsked) {
  ExtensionPool pool;
  ReflectionV1Answerer answerer(nullptr, pool.pool());
  EXPECT_EQ(FileNames(answerer.Answer(FileByName("ext/more.proto"))),
            (Names{"ext/more.proto", "ext/base.proto"}));
  // base was sent as a dependency; asked for itself it comes again.
  EXPECT_EQ(FileNames(answerer.Answer(FileByName("ext/base.proto"))), (Names{"ext/base.proto"}));
  // top is new; more and base were sent already.
  EXPECT_EQ(FileNames(answerer.Answer(Symbol("ext.Top"))), (Names{"ext/top.proto"}));
  // A new stream starts from nothing.
  ReflectionV1Answerer fresh(nullptr, pool.pool());
  EXPECT_EQ(FileNames(fresh.Answer(Symbol("ext.Top.more"))),
            (Names{"ext/top.proto", "ext/more.proto", "ext/base.proto"}));
}

TEST(ReflectionAnswererTest, FindsTheFileOfEachKindOfSymbol) {
  ExtensionPool pool;
  for (const char* symbol : {"ext.Base", "ext.Base.id", "ext.Color", "ext.RED"}) {
    ReflectionV1Answerer answerer(nullptr, pool.pool());
    EXPECT_EQ(FileNames(answerer.Answer(Symbol(symbol))), (Names{"ext/base.proto"})) << symbol;
  }
  ReflectionV1Answerer answerer(nullptr, pool.pool());
  EXPECT_EQ(FileNames(answerer.Answer(Symbol("ext.tag"))),
            (Names{"ext/more.proto", "ext/base.proto"}));
}

TEST(ReflectionAnswererTest, AnswersExtensionsFromThePool) {
  ExtensionPool pool;
  ReflectionV1Answerer answerer(nullptr, pool.pool());
  ServerReflectionRequest request;
  request.mutable_file_containing_extension()->set_containing_type("ext.Base");
  request.mutable_file_containing_extension()->set_extension_number(123);
  EXPECT_EQ(FileNames(answerer.Answer(request)), (Names{"ext/more.proto", "ext/base.proto"}));

  request.mutable_file_containing_extension()->set_extension_number(124);
  ServerReflectionResponse missing = answerer.Answer(request);
  ASSERT_TRUE(missing.has_error_response());
  EXPECT_EQ(missing.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_response().error_message(),
            "file_containing_extension.extension_number: ext.Base has no extension numbered 124");

  request.mutable_file_containing_extension()->set_containing_type("ext.Nope");
  missing = answerer.Answer(request);
  ASSERT_TRUE(missing.has_error_response());
  EXPECT_EQ(missing.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(missing.error_response().error_message(),
            "file_containing_extension.containing_type: no message type named \"ext.Nope\"");

  ServerReflectionRequest numbers;
  numbers.set_all_extension_numbers_of_type("ext.Base");
  ServerReflectionResponse found = answerer.Answer(numbers);
  ASSERT_TRUE(found.has_all_extension_numbers_response());
  EXPECT_EQ(found.all_extension_numbers_response().base_type_name(), "ext.Base");
  EXPECT_EQ(std::vector<int>(found.all_extension_numbers_response().extension_number().begin(),
                             found.all_extension_numbers_response().extension_number().end()),
            std::vector<int>{123});

  numbers.set_all_extension_numbers_of_type("ext.More");  // a type nothing extends
  found = answerer.Answer(numbers);
  ASSERT_TRUE(found.has_all_extension_numbers_response());
  EXPECT_EQ(found.all_extension_numbers_response().extension_number_size(), 0);

  numbers.set_all_extension_numbers_of_type("ext.Color");  // an enum, not a message
  ServerReflectionResponse wrong = answerer.Answer(numbers);
  ASSERT_TRUE(wrong.has_error_response());
  EXPECT_EQ(wrong.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(ReflectionAnswererTest, EchoesTheRequestAndNamesTheFieldOfAnError) {
  ExtensionPool pool;
  const std::vector<std::string> services = {"ext.Service"};
  ReflectionV1Answerer answerer(&services, pool.pool());

  ServerReflectionRequest request = FileByName("ext/none.proto");
  request.set_host("h:1");
  ServerReflectionResponse response = answerer.Answer(request);
  EXPECT_EQ(response.valid_host(), "h:1");
  EXPECT_EQ(response.original_request().SerializeAsString(), request.SerializeAsString());
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(response.error_response().error_message(),
            "file_by_filename: no file named \"ext/none.proto\"");

  response = answerer.Answer(Symbol("ext.Base.nope"));
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(response.error_response().error_message(),
            "file_containing_symbol: no symbol named \"ext.Base.nope\"");

  response = answerer.Answer(ServerReflectionRequest());  // sets nothing
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(response.error_response().error_message().find("message_request"), std::string::npos);

  // A request from a future version of the API (an unknown oneof member) is answered the same.
  ServerReflectionRequest future;
  ASSERT_TRUE(future.ParseFromString(std::string("\x42\x01x", 3)));  // field 8, "x"
  response = answerer.Answer(future);
  ASSERT_TRUE(response.has_error_response());
  EXPECT_EQ(response.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Errors leave the answerer usable.
  ServerReflectionRequest list;
  list.set_list_services("*");
  response = answerer.Answer(list);
  ASSERT_TRUE(response.has_list_services_response());
  ASSERT_EQ(response.list_services_response().service_size(), 1);
  EXPECT_EQ(response.list_services_response().service(0).name(), "ext.Service");
}

}  // namespace
}  // namespace tandem
