// The table of ggml type ids, names and block sizes (ggml.c's type_traits), and the lookups on it.
#include <array>
#include <cctype>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/weights/weight_types.h"

namespace tandem {
namespace {

// Every type id ggml defines (ids 4, 5 and 31-33 are retired and stay unused). Sizes are ggml's
// blck_size and type_size; "supported" marks the types Tandem computes with.
constexpr std::array<WeightTypeInfo, 32> kTypes = {{
    {0, "f32", 1, 4, true},
    {1, "f16", 1, 2, true},
    {2, "q4_0", 32, 18, true},
    {3, "q4_1", 32, 20, false},
    {6, "q5_0", 32, 22, false},
    {7, "q5_1", 32, 24, false},
    {8, "q8_0", 32, 34, true},
    {9, "q8_1", 32, 36, false},
    {10, "q2_K", 256, 84, true},
    {11, "q3_K", 256, 110, true},
    {12, "q4_K", 256, 144, true},
    {13, "q5_K", 256, 176, true},
    {14, "q6_K", 256, 210, true},
    {15, "q8_K", 256, 292, false},
    {16, "iq2_xxs", 256, 66, false},
    {17, "iq2_xs", 256, 74, false},
    {18, "iq3_xxs", 256, 98, false},
    {19, "iq1_s", 256, 50, false},
    {20, "iq4_nl", 32, 18, false},
    {21, "iq3_s", 256, 110, false},
    {22, "iq2_s", 256, 82, false},
    {23, "iq4_xs", 256, 136, false},
    {24, "i8", 1, 1, false},
    {25, "i16", 1, 2, false},
    {26, "i32", 1, 4, false},
    {27, "i64", 1, 8, false},
    {28, "f64", 1, 8, false},
    {29, "iq1_m", 256, 56, false},
    {30, "bf16", 1, 2, true},
    {34, "tq1_0", 256, 54, false},
    {35, "tq2_0", 256, 66, false},
    {39, "mxfp4", 32, 17, false},
}};

}  // namespace

const WeightTypeInfo* FindWeightTypeInfo(uint32_t ggml_type_id) {
  for (const WeightTypeInfo& info : kTypes) {
    if (info.id == ggml_type_id) return &info;
  }
  return nullptr;
}

const WeightTypeInfo& GetWeightTypeInfo(WeightType type) {
  // Every WeightType enumerator is in the table (a test checks it).
  return *FindWeightTypeInfo(static_cast<uint32_t>(type));
}

absl::StatusOr<WeightType> ParseWeightType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  std::string supported;
  for (const WeightTypeInfo& info : kTypes) {
    if (!info.supported) continue;
    if (absl::AsciiStrToLower(std::string(info.name)) == lower) return static_cast<WeightType>(info.id);
    absl::StrAppend(&supported, supported.empty() ? "" : ", ", std::string(info.name));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown or unsupported weight type '", std::string(name), "' (supported: ", supported, ")"));
}

absl::StatusOr<int64_t> RowBytes(WeightType type, int64_t n) {
  const WeightTypeInfo& info = GetWeightTypeInfo(type);
  if (n < 0 || n % info.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a row of ", n, " elements is not a whole number of ",
                                                   std::string(info.name), " blocks of ", info.block_elems));
  }
  return n / info.block_elems * info.block_bytes;
}

}  // namespace tandem
