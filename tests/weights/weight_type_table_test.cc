// The type table against ggml's published numbers, and the block structs against ggml's layout.
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "common/weights/block_layouts.h"
#include "common/weights/weight_types.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

struct GgmlType {
  WeightType type;
  uint32_t id;
  const char* name;
  int64_t block_elems;
  int64_t block_bytes;
};

// ggml's enum ggml_type ids, type names and (blck_size, type_size) from ggml.c's type_traits.
constexpr GgmlType kSupported[] = {
    {WeightType::kF32, 0, "f32", 1, 4},        {WeightType::kF16, 1, "f16", 1, 2},
    {WeightType::kQ4_0, 2, "q4_0", 32, 18},    {WeightType::kQ8_0, 8, "q8_0", 32, 34},
    {WeightType::kQ2_K, 10, "q2_K", 256, 84},  {WeightType::kQ3_K, 11, "q3_K", 256, 110},
    {WeightType::kQ4_K, 12, "q4_K", 256, 144}, {WeightType::kQ5_K, 13, "q5_K", 256, 176},
    {WeightType::kQ6_K, 14, "q6_K", 256, 210}, {WeightType::kBF16, 30, "bf16", 1, 2},
};

TEST(WeightTypeTable, SupportedTypesMatchGgml) {
  for (const GgmlType& t : kSupported) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(static_cast<uint32_t>(t.type), t.id);
    const WeightTypeInfo* info = FindWeightTypeInfo(t.id);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(&GetWeightTypeInfo(t.type), info);
    EXPECT_EQ(info->name, t.name);
    EXPECT_EQ(info->block_elems, t.block_elems);
    EXPECT_EQ(info->block_bytes, t.block_bytes);
    EXPECT_TRUE(info->supported);
  }
}

TEST(WeightTypeTable, EveryEnumeratorIsInTheTableAndSupported) {
  // Exactly the WeightType enumerators: a new one must be added here and to the table.
  const WeightType all[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kQ4_0, WeightType::kQ8_0,
                            WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K,
                            WeightType::kQ6_K, WeightType::kBF16};
  int supported_in_table = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const WeightTypeInfo* info = FindWeightTypeInfo(id);
    if (info != nullptr && info->supported) ++supported_in_table;
  }
  EXPECT_EQ(supported_in_table, static_cast<int>(std::size(all)));
  for (WeightType type : all) {
    const WeightTypeInfo* info = FindWeightTypeInfo(static_cast<uint32_t>(type));
    ASSERT_NE(info, nullptr) << static_cast<uint32_t>(type);
    EXPECT_TRUE(info->supported) << info->name;
  }
}

TEST(WeightTypeTable, UnsupportedAndUnknownIds) {
  const WeightTypeInfo* q4_1 = FindWeightTypeInfo(3);
  ASSERT_NE(q4_1, nullptr);
  EXPECT_EQ(q4_1->name, "q4_1");
  EXPECT_FALSE(q4_1->supported);
  EXPECT_EQ(FindWeightTypeInfo(4), nullptr);  // retired Q4_2
  EXPECT_EQ(FindWeightTypeInfo(5), nullptr);  // retired Q4_3
  EXPECT_EQ(FindWeightTypeInfo(1000), nullptr);
}

TEST(WeightTypeTable, ParseRoundTripsNames) {
  for (const GgmlType& t : kSupported) {
    absl::StatusOr<WeightType> parsed = ParseWeightType(t.name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, t.type);
    parsed = ParseWeightType(absl::AsciiStrToUpper(std::string(t.name)));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, t.type);
    EXPECT_EQ(GetWeightTypeInfo(*parsed).name, t.name);
  }
  EXPECT_EQ(ParseWeightType("q4_1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWeightType("q7_K").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWeightType("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WeightTypeTable, RowBytes) {
  EXPECT_EQ(*RowBytes(WeightType::kQ4_K, 4096), 16 * 144);
  EXPECT_EQ(*RowBytes(WeightType::kQ8_0, 64), 68);
  EXPECT_EQ(*RowBytes(WeightType::kBF16, 3), 6);
  EXPECT_EQ(RowBytes(WeightType::kQ6_K, 300).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowBytes(WeightType::kQ4_0, -32).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockLayouts, StructsMatchGgmlSizesAndOffsets) {
  // Sizes equal the table's block_bytes.
  EXPECT_EQ(sizeof(BlockQ4_0), GetWeightTypeInfo(WeightType::kQ4_0).block_bytes);
  EXPECT_EQ(sizeof(BlockQ8_0), GetWeightTypeInfo(WeightType::kQ8_0).block_bytes);
  EXPECT_EQ(sizeof(BlockQ2_K), GetWeightTypeInfo(WeightType::kQ2_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ3_K), GetWeightTypeInfo(WeightType::kQ3_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ4_K), GetWeightTypeInfo(WeightType::kQ4_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ5_K), GetWeightTypeInfo(WeightType::kQ5_K).block_bytes);
  EXPECT_EQ(sizeof(BlockQ6_K), GetWeightTypeInfo(WeightType::kQ6_K).block_bytes);
  // Field offsets of ggml-common.h's structs.
  EXPECT_EQ(offsetof(BlockQ4_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ8_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ2_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ2_K, d), 80u);
  EXPECT_EQ(offsetof(BlockQ2_K, dmin), 82u);
  EXPECT_EQ(offsetof(BlockQ3_K, qs), 32u);
  EXPECT_EQ(offsetof(BlockQ3_K, scales), 96u);
  EXPECT_EQ(offsetof(BlockQ3_K, d), 108u);
  EXPECT_EQ(offsetof(BlockQ4_K, dmin), 2u);
  EXPECT_EQ(offsetof(BlockQ4_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ4_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qh), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
  EXPECT_EQ(offsetof(BlockQ6_K, qh), 128u);
  EXPECT_EQ(offsetof(BlockQ6_K, scales), 192u);
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
}

}  // namespace
}  // namespace tandem
