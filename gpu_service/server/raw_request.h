// Parsing requests from the wire ourselves, so that a bad message is answered INVALID_ARGUMENT
// naming the field. protobuf's C++ parser rejects a proto3 string holding invalid UTF-8 without
// saying which field (gRPC would then answer INTERNAL "failed to parse"); the service methods are
// registered raw (grpc::ByteBuffer) and parse through ParseMessage, which on such a failure walks
// the wire bytes with the message's descriptor to find the field and byte offset.
#ifndef TANDEM_GPU_SERVICE_SERVER_RAW_REQUEST_H_
#define TANDEM_GPU_SERVICE_SERVER_RAW_REQUEST_H_

#include <string>

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"

namespace tandem {

// Parses `buffer` into `message`. InvalidArgument when it cannot: "inputs[0].text: invalid UTF-8
// at byte 3" for a bad string, else "request: not a valid <type>".
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The field path and byte offset of the first string field holding invalid UTF-8 in the wire
// bytes of a `type` message ("" when there is none, or the bytes are malformed otherwise).
std::string FindInvalidUtf8Field(const google::protobuf::Descriptor* type,
                                 const std::string& wire);

// Serializes `message` into `buffer`.
void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* buffer);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_RAW_REQUEST_H_
