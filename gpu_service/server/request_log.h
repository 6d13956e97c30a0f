// Request ids and the structured log line written once per request.
#ifndef TANDEM_GPU_SERVICE_SERVER_REQUEST_LOG_H_
#define TANDEM_GPU_SERVICE_SERVER_REQUEST_LOG_H_

#include <cstdint>
#include <string>

#include <grpcpp/server_context.h>

namespace tandem {

// The client's x-request-id metadata when it is 1..128 printable ASCII characters, else a new
// random id (32 hex digits).
std::string RequestIdOf(const grpc::ServerContextBase& context);

struct RequestLogEntry {
  std::string request_id;
  std::string method;        // "Generate", "GenerateStream", ...
  std::string code;          // the gRPC status code's name, e.g. "OK", "INVALID_ARGUMENT"
  std::string message;       // the status message when not OK
  int64_t inputs = 0;
  int64_t input_tokens = 0;
  int64_t generated_tokens = 0;
  std::string stop_reasons;  // comma-separated, one per input
  double seconds = 0;        // from arrival to the answer
};

// Writes one JSON object on one line to stderr (lines from several threads never interleave).
void WriteRequestLog(const RequestLogEntry& entry);

// "OK", "CANCELLED", ... for a grpc::StatusCode.
const char* StatusCodeName(int code);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_REQUEST_LOG_H_
