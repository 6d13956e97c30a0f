#include "gpu_service/server/reflection_v1.h"

#include <utility>

#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/impl/server_initializer.h>
#include <grpcpp/support/server_callback.h>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::FileDescriptorResponse;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void SetError(grpc::StatusCode code, std::string message, ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response->mutable_error_response()->set_error_message(std::move(message));
}

// One stream: read a request, write its answer, repeat until the client closes its side. Only one
// operation is outstanding at a time, so the answerer needs no lock.
class ReflectionStream final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  ReflectionStream(const std::vector<std::string>* service_names, const pb::DescriptorPool* pool)
      : answerer_(service_names, pool) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done (or gone): nothing more to answer
      Finish(grpc::Status::OK);
      return;
    }
    response_ = answerer_.Answer(request_);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "reflection: the response was not sent"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  ReflectionV1Answerer answerer_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
};

// Registers the service when the server is created and hands it the server's own list of
// service names (a live pointer: services registered later, such as the default health service
// added when the server starts, appear too).
class ReflectionV1Plugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "tandem_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* si) override {
    si->RegisterService(std::make_shared<ServerReflectionV1>(si->GetServiceList()));
  }
  void Finish(grpc::ServerInitializer* /*si*/) override {}
  void ChangeArguments(const std::string& /*name*/, void* /*value*/) override {}
};

class ReflectionV1Option final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->push_back(std::make_unique<ReflectionV1Plugin>());
  }
};

}  // namespace

ServerReflectionResponse ReflectionV1Answerer::Answer(const ServerReflectionRequest& request) {
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  std::set<std::string> in_this_answer;

  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices: {
      auto* list = response.mutable_list_services_response();
      if (service_names_ != nullptr) {
        for (const std::string& name : *service_names_) list->add_service()->set_name(name);
      }
      break;
    }
    case ServerReflectionRequest::kFileByFilename: {
      const pb::FileDescriptor* file = pool_->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("file_by_filename: no file named \"", request.file_by_filename(),
                              "\""),
                 &response);
        break;
      }
      AddFileWithDependencies(file, /*requested=*/true, &in_this_answer,
                              response.mutable_file_descriptor_response());
      break;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const pb::FileDescriptor* file =
          pool_->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("file_containing_symbol: no symbol named \"",
                              request.file_containing_symbol(), "\""),
                 &response);
        break;
      }
      AddFileWithDependencies(file, /*requested=*/true, &in_this_answer,
                              response.mutable_file_descriptor_response());
      break;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ask = request.file_containing_extension();
      const pb::Descriptor* type = pool_->FindMessageTypeByName(ask.containing_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("file_containing_extension.containing_type: no message type named \"",
                              ask.containing_type(), "\""),
                 &response);
        break;
      }
      const pb::FieldDescriptor* extension =
          pool_->FindExtensionByNumber(type, ask.extension_number());
      if (extension == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("file_containing_extension.extension_number: ", type->full_name(),
                              " has no extension numbered ", ask.extension_number()),
                 &response);
        break;
      }
      AddFileWithDependencies(extension->file(), /*requested=*/true, &in_this_answer,
                              response.mutable_file_descriptor_response());
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool_->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("all_extension_numbers_of_type: no message type named \"",
                              request.all_extension_numbers_of_type(), "\""),
                 &response);
        break;
      }
      std::vector<const pb::FieldDescriptor*> extensions;
      pool_->FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* extension : extensions) {
        numbers->add_extension_number(extension->number());
      }
      break;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
    default:
      // Also a request from a newer version of the API whose field this one does not know.
      SetError(grpc::StatusCode::INVALID_ARGUMENT,
               "message_request: none of file_by_filename, file_containing_symbol, "
               "file_containing_extension, all_extension_numbers_of_type, list_services is set",
               &response);
      break;
  }
  return response;
}

void ReflectionV1Answerer::AddFileWithDependencies(const pb::FileDescriptor* file, bool requested,
                                                   std::set<std::string>* in_this_answer,
                                                   FileDescriptorResponse* out) {
  if (!in_this_answer->insert(file->name()).second) return;  // already in this answer
  // The file asked for is always sent (a client may have dropped what it received before); a
  // dependency only the first time on this stream. Dependencies are walked either way: it costs
  // little and does not rely on what earlier answers contained.
  const bool first_time = files_sent_.insert(file->name()).second;
  if (requested || first_time) {
    pb::FileDescriptorProto proto;
    file->CopyTo(&proto);
    out->add_file_descriptor_proto(proto.SerializeAsString());
  }
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileWithDependencies(file->dependency(i), /*requested=*/false, in_this_answer, out);
  }
}

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ServerReflectionV1::ServerReflectionInfo(grpc::CallbackServerContext* /*context*/) {
  return new ReflectionStream(service_names_, pool_);
}

std::unique_ptr<grpc::ServerBuilderOption> MakeServerReflectionV1Option() {
  return std::make_unique<ReflectionV1Option>();
}

}  // namespace tandem
