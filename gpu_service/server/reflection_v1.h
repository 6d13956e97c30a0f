// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), answered from a protobuf
// DescriptorPool. Debian 12's gRPC 1.51 ships only v1alpha (grpc::reflection's builder plugin);
// this adds v1, which newer grpcurl and ghz ask for first. Both can be served side by side.
//
// Answers (one response per request, in order, on one bidirectional stream):
// - list_services: the names of the services registered on the server.
// - file_by_filename, file_containing_symbol (service, method, message, field, enum, enum value),
//   file_containing_extension: serialized FileDescriptorProtos, the file asked for first, then its
//   transitive dependencies. The file asked for is always sent; a dependency is sent once per
//   stream (clients keep what they received, as the specification allows).
// - all_extension_numbers_of_type: the extension numbers the pool knows for that message type.
// - Anything not found: error_response NOT_FOUND naming the request field; a request that sets
//   none of the fields: error_response INVALID_ARGUMENT. The stream stays open after an error.
#ifndef TANDEM_GPU_SERVICE_SERVER_REFLECTION_V1_H_
#define TANDEM_GPU_SERVICE_SERVER_REFLECTION_V1_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/impl/server_builder_option.h>

#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1/reflection.pb.h"

namespace tandem {

// The answers of one reflection stream. Not thread-safe (a stream answers one request at a time).
class ReflectionV1Answerer {
 public:
  // `service_names` and `pool` are not owned and must outlive the answerer; `service_names` is
  // read at each list_services request and must not change meanwhile.
  ReflectionV1Answerer(const std::vector<std::string>* service_names,
                       const google::protobuf::DescriptorPool* pool)
      : service_names_(service_names), pool_(pool) {}

  // The response to `request` (valid_host and original_request echo the request). Remembers the
  // files sent, so that a later answer leaves out the dependencies already sent.
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request);

 private:
  // Appends `file` (always when `requested`, else only if not sent yet on this stream) and then
  // its dependencies, each at most once per answer.
  void AddFileWithDependencies(const google::protobuf::FileDescriptor* file, bool requested,
                               std::set<std::string>* in_this_answer,
                               grpc::reflection::v1::FileDescriptorResponse* out);

  const std::vector<std::string>* service_names_;
  const google::protobuf::DescriptorPool* pool_;
  std::set<std::string> files_sent_;  // names of the files sent on this stream
};

// The gRPC service (callback API: no thread per stream). Each stream gets its own answerer.
class ServerReflectionV1 final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // Same contract as ReflectionV1Answerer's constructor; the generated pool holds every .proto
  // compiled into the binary.
  explicit ServerReflectionV1(const std::vector<std::string>* service_names,
                              const google::protobuf::DescriptorPool* pool =
                                  google::protobuf::DescriptorPool::generated_pool())
      : service_names_(service_names), pool_(pool) {}

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  const std::vector<std::string>* service_names_;
  const google::protobuf::DescriptorPool* pool_;
};

// A ServerBuilder option that registers a ServerReflectionV1 on the server being built (the server
// owns it) answering list_services with every service registered on that server, the health and
// v1alpha reflection services included:
//   builder.SetOption(MakeServerReflectionV1Option());
std::unique_ptr<grpc::ServerBuilderOption> MakeServerReflectionV1Option();

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_REFLECTION_V1_H_
