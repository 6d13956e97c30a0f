#include "gpu_service/server/raw_request.h"

#include <map>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace tandem {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

// Byte offset of the first invalid UTF-8 sequence, or -1.
int64_t FirstInvalidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Step step = DecodeUtf8Step(s, i);
    if (!step.valid) return static_cast<int64_t>(i);
    i += static_cast<size_t>(step.length);
  }
  return -1;
}

// Walks one message's fields; returns the first bad string's description or "".
std::string Walk(const Descriptor* type, const std::string& wire, const std::string& prefix,
                 int depth) {
  if (depth > 32) return "";
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                                            static_cast<int>(wire.size()));
  std::map<int, int> occurrences;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return "";
    const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    const FieldDescriptor* field = type->FindFieldByNumber(number);
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        field == nullptr) {
      if (!WireFormatLite::SkipField(&in, tag)) return "";
      continue;
    }
    std::string bytes;
    uint32_t length;
    if (!in.ReadVarint32(&length) || !in.ReadString(&bytes, static_cast<int>(length))) return "";
    std::string path = prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    if (field->is_repeated()) absl::StrAppend(&path, "[", occurrences[number]++, "]");
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      const int64_t at = FirstInvalidUtf8(bytes);
      if (at >= 0) return absl::StrCat(path, ": invalid UTF-8 at byte ", at);
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      std::string found = Walk(field->message_type(), bytes, path, depth + 1);
      if (!found.empty()) return found;
    }
  }
}

}  // namespace

std::string FindInvalidUtf8Field(const Descriptor* type, const std::string& wire) {
  return Walk(type, wire, "", 0);
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  std::vector<grpc::Slice> slices;
  std::string wire;
  if (buffer.Valid() && buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  if (message->ParseFromString(wire)) return absl::OkStatus();
  std::string field = FindInvalidUtf8Field(message->GetDescriptor(), wire);
  if (!field.empty()) return absl::InvalidArgumentError(field);
  return absl::InvalidArgumentError(
      absl::StrCat("request: not a valid ", message->GetDescriptor()->full_name()));
}

void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* buffer) {
  std::string wire = message.SerializeAsString();
  grpc::Slice slice(wire);
  *buffer = grpc::ByteBuffer(&slice, 1);
}

}  // namespace tandem
