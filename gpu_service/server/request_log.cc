#include "gpu_service/server/request_log.h"

#include <cstdio>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

std::string RequestIdOf(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("x-request-id");
  if (it != md.end()) {
    const std::string id(it->second.data(), it->second.size());
    bool ok = !id.empty() && id.size() <= 128;
    for (char c : id) ok = ok && c >= 0x21 && c <= 0x7e;
    if (ok) return id;
  }
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrFormat("%016x%016x", rng(), rng());
}

const char* StatusCodeName(int code) {
  static const char* const kNames[] = {
      "OK",           "CANCELLED",         "UNKNOWN",          "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",    "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",         "UNAVAILABLE",      "DATA_LOSS",
      "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

void WriteRequestLog(const RequestLogEntry& e) {
  std::string line = absl::StrCat(
      "{\"time\":", JsonString(absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone())),
      ",\"event\":\"request\",\"request_id\":", JsonString(e.request_id),
      ",\"method\":", JsonString(e.method), ",\"code\":", JsonString(e.code));
  if (!e.message.empty()) absl::StrAppend(&line, ",\"message\":", JsonString(e.message));
  absl::StrAppend(&line, ",\"inputs\":", e.inputs, ",\"input_tokens\":", e.input_tokens,
                  ",\"generated_tokens\":", e.generated_tokens);
  if (!e.stop_reasons.empty()) {
    absl::StrAppend(&line, ",\"stop_reasons\":", JsonString(e.stop_reasons));
  }
  absl::StrAppend(&line, ",\"seconds\":", absl::StrFormat("%.6f", e.seconds), "}\n");
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace tandem
