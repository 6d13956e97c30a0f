// GgufWriter -> GgufFile round trips: every metadata type, a tensor of every ggml type in the
// table written in pieces, exact bytes and alignment back; the writer's refusals; and offsets past
// 4 GiB, checked on a sparse file.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/weights/weight_types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/gguf_writer_test_", ::getpid(), "_", name);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<uint8_t> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every metadata type, scalar and array, plus nested arrays; in this order.
std::vector<std::pair<std::string, GgufValue>> EveryMetadataType() {
  std::vector<std::pair<std::string, GgufValue>> kv;
  kv.emplace_back("t.u8", GgufValue::Scalar<uint8_t>(250));
  kv.emplace_back("t.i8", GgufValue::Scalar<int8_t>(-120));
  kv.emplace_back("t.u16", GgufValue::Scalar<uint16_t>(65000));
  kv.emplace_back("t.i16", GgufValue::Scalar<int16_t>(-32000));
  kv.emplace_back("t.u32", GgufValue::Scalar<uint32_t>(4000000000u));
  kv.emplace_back("t.i32", GgufValue::Scalar<int32_t>(-2000000000));
  kv.emplace_back("t.f32", GgufValue::Scalar<float>(1e-6f));
  kv.emplace_back("t.bool", GgufValue::Scalar<bool>(true));
  kv.emplace_back("t.string", GgufValue::String("héllo\n\"world\""));
  kv.emplace_back("t.u64", GgufValue::Scalar<uint64_t>(std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("t.i64", GgufValue::Scalar<int64_t>(std::numeric_limits<int64_t>::min()));
  kv.emplace_back("t.f64", GgufValue::Scalar<double>(-2.5e300));
  kv.emplace_back("a.u8", GgufValue::Array(std::vector<uint8_t>{0, 1, 255}));
  kv.emplace_back("a.i8", GgufValue::Array(std::vector<int8_t>{-128, 0, 127}));
  kv.emplace_back("a.u16", GgufValue::Array(std::vector<uint16_t>{1, 65535}));
  kv.emplace_back("a.i16", GgufValue::Array(std::vector<int16_t>{-32768, 32767}));
  kv.emplace_back("a.u32", GgufValue::Array(std::vector<uint32_t>{7, 8, 9}));
  kv.emplace_back("a.i32", GgufValue::Array(std::vector<int32_t>{-1, 2, -3}));
  kv.emplace_back("a.f32", GgufValue::Array(std::vector<float>{0.5f, -0.0f, std::nanf("")}));
  kv.emplace_back("a.bool", GgufValue::BoolArray({true, false, true}));
  kv.emplace_back("a.string", GgufValue::StringArray({"", "a", std::string("z\0z", 3)}));
  kv.emplace_back("a.u64", GgufValue::Array(std::vector<uint64_t>{0, ~uint64_t{0}}));
  kv.emplace_back("a.i64", GgufValue::Array(std::vector<int64_t>{-1, std::numeric_limits<int64_t>::max()}));
  kv.emplace_back("a.f64", GgufValue::Array(std::vector<double>{1.0 / 3.0, -INFINITY}));
  kv.emplace_back("a.empty", GgufValue::EmptyArray(GgufType::kF32));
  kv.emplace_back("a.nested", GgufValue::ArrayOfArrays({GgufValue::Array(std::vector<int32_t>{1, 2}),
                                                        GgufValue::StringArray({"x", "y"}),
                                                        GgufValue::EmptyArray(GgufType::kArray),
                                                        GgufValue::ArrayOfArrays({GgufValue::BoolArray({false})})}));
  return kv;
}

uint8_t Pattern(uint32_t type_id, uint64_t i) { return static_cast<uint8_t>(i * 131 + type_id * 7 + (i >> 8)); }

// Writes a file with EveryMetadataType() and one tensor of every ggml type in the table (shape
// {2 blocks, 3}), each tensor's bytes in three uneven pieces; reads it back and compares.
void RoundTrip(GgufWriterOptions options) {
  const std::string path = TempPath(absl::StrCat("round_trip_", options.version, "_", options.alignment));
  std::vector<const WeightTypeInfo*> types;
  for (uint32_t id = 0; id < 64; ++id) {
    if (const WeightTypeInfo* info = FindWeightTypeInfo(id)) types.push_back(info);
  }
  ASSERT_GE(types.size(), 30u);
  const auto kv = EveryMetadataType();
  {
    absl::StatusOr<std::unique_ptr<GgufWriter>> w = GgufWriter::Create(path, options);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const auto& [key, value] : kv) ASSERT_TRUE((*w)->AddMetadata(key, value).ok()) << key;
    for (const WeightTypeInfo* info : types) {
      ASSERT_TRUE((*w)->AddTensor(absl::StrCat("tensor.", std::string(info->name)), info->id, {2 * info->block_elems, 3}).ok());
    }
    for (const WeightTypeInfo* info : types) {
      const std::string name = absl::StrCat("tensor.", std::string(info->name));
      const uint64_t n = 6 * static_cast<uint64_t>(info->block_bytes);
      EXPECT_EQ(*(*w)->TensorBytes(name), n);
      std::vector<uint8_t> data(n);
      for (uint64_t i = 0; i < n; ++i) data[i] = Pattern(info->id, i);
      const uint64_t cut1 = n / 3, cut2 = n - n / 4;
      const absl::Span<const uint8_t> all(data);
      ASSERT_TRUE((*w)->WriteTensorData(name, all.subspan(0, cut1)).ok()) << name;
      ASSERT_TRUE((*w)->WriteTensorData(name, all.subspan(cut1, cut2 - cut1)).ok()) << name;
      ASSERT_TRUE((*w)->WriteTensorData(name, all.subspan(cut2)).ok()) << name;
    }
    EXPECT_THAT((*w)->WriteTensorData("tensor.f32", std::vector<uint8_t>(1)).ToString(),
                HasSubstr("not declared or was already written"));
    ASSERT_FALSE(FileExists(path)) << "the final name appears only at Finish()";
    absl::Status finished = (*w)->Finish();
    ASSERT_TRUE(finished.ok()) << finished;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), options.version);
  EXPECT_EQ(f.alignment(), options.alignment);
  EXPECT_EQ(f.data_offset() % options.alignment, 0u);
  // The writer adds general.alignment first when it is not the default.
  const size_t skip = options.alignment != 32 ? 1 : 0;
  ASSERT_EQ(f.metadata().size(), kv.size() + skip);
  if (skip) {
    EXPECT_EQ(*f.GetU32("general.alignment"), options.alignment);
  }
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f.metadata()[i + skip].key, kv[i].first);
    EXPECT_TRUE(f.metadata()[i + skip].value == kv[i].second) << kv[i].first;
  }
  EXPECT_EQ(*f.GetU8("t.u8"), 250);
  EXPECT_EQ(*f.GetI8("t.i8"), -120);
  EXPECT_EQ(*f.GetU16("t.u16"), 65000);
  EXPECT_EQ(*f.GetI16("t.i16"), -32000);
  EXPECT_EQ(*f.GetU32("t.u32"), 4000000000u);
  EXPECT_EQ(*f.GetI32("t.i32"), -2000000000);
  EXPECT_EQ(*f.GetF32("t.f32"), 1e-6f);
  EXPECT_EQ(*f.GetBool("t.bool"), true);
  EXPECT_EQ(*f.GetString("t.string"), "héllo\n\"world\"");
  EXPECT_EQ(*f.GetU64("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f.GetI64("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.GetF64("t.f64"), -2.5e300);
  EXPECT_EQ(*f.GetStringArray("a.string").value().rbegin(), std::string("z\0z", 3));
  EXPECT_EQ(f.GetArray("a.nested").value()->ArrayAt(3).ArrayAt(0), GgufValue::BoolArray({false}));

  ASSERT_EQ(f.tensors().size(), types.size());
  const std::vector<uint8_t> raw = ReadWholeFile(path);
  uint64_t expected_offset = 0;
  for (size_t k = 0; k < types.size(); ++k) {
    const WeightTypeInfo& info = *types[k];
    const GgufTensorInfo& t = f.tensors()[k];
    EXPECT_EQ(t.name, absl::StrCat("tensor.", std::string(info.name)));
    EXPECT_EQ(t.ggml_type, info.id);
    EXPECT_EQ(t.n_dims, 2);
    EXPECT_EQ(t.ne[0], 2 * info.block_elems);
    EXPECT_EQ(t.ne[1], 3);
    EXPECT_EQ(t.offset, expected_offset);
    EXPECT_EQ(t.file_offset % options.alignment, 0u);
    ASSERT_EQ(t.n_bytes, 6 * static_cast<uint64_t>(info.block_bytes));
    bool same = true;
    for (uint64_t i = 0; i < t.n_bytes; ++i) same = same && t.data[i] == Pattern(info.id, i);
    EXPECT_TRUE(same) << t.name;
    // Padding between tensors is zero.
    const uint64_t end = t.file_offset + t.n_bytes;
    const uint64_t padded_end = (end + options.alignment - 1) / options.alignment * options.alignment;
    for (uint64_t i = end; i < padded_end; ++i) ASSERT_EQ(raw[i], 0) << "padding after " << t.name;
    expected_offset = padded_end - f.data_offset();
  }
  EXPECT_EQ(f.data_offset() + expected_offset, raw.size());
  file->reset();
  ::unlink(path.c_str());
}

TEST(GgufWriterTest, RoundTripsEveryTypeV3Align32) { RoundTrip({.alignment = 32, .version = 3}); }
TEST(GgufWriterTest, RoundTripsEveryTypeV2Align64) { RoundTrip({.alignment = 64, .version = 2}); }
TEST(GgufWriterTest, RoundTripsEveryTypeAlign4096) { RoundTrip({.alignment = 4096, .version = 3}); }

TEST(GgufWriterTest, TolerantIntegerAccess) {
  const std::string path = TempPath("tolerant");
  {
    auto w = *GgufWriter::Create(path);
    ASSERT_TRUE(w->AddMetadata("as_u32", GgufValue::Scalar<uint32_t>(48)).ok());
    ASSERT_TRUE(w->AddMetadata("as_i32", GgufValue::Scalar<int32_t>(48)).ok());
    ASSERT_TRUE(w->AddMetadata("as_u64", GgufValue::Scalar<uint64_t>(48)).ok());
    ASSERT_TRUE(w->AddMetadata("negative", GgufValue::Scalar<int8_t>(-3)).ok());
    ASSERT_TRUE(w->AddMetadata("huge", GgufValue::Scalar<uint64_t>(~uint64_t{0})).ok());
    ASSERT_TRUE(w->AddMetadata("f64", GgufValue::Scalar<double>(0.25)).ok());
    ASSERT_TRUE(w->AddMetadata("ints", GgufValue::Array(std::vector<uint16_t>{1, 2, 3})).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  std::unique_ptr<GgufFile> f = *GgufFile::Open(path);
  for (const char* key : {"as_u32", "as_i32", "as_u64"}) {
    EXPECT_EQ(*f->GetInt(key, 0, UINT32_MAX), 48) << key;
  }
  EXPECT_EQ(*f->GetInt("negative"), -3);
  absl::StatusOr<int64_t> negative = f->GetInt("negative", 0, UINT32_MAX);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(negative.status().ToString(), HasSubstr("metadata key 'negative': i8 value -3 is outside [0, 4294967295]"));
  EXPECT_EQ(f->GetInt("huge").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(f->GetInt("f64").status().ToString(), HasSubstr("expected an integer, found f64"));
  EXPECT_EQ(*f->GetFloat("f64"), 0.25);
  EXPECT_EQ(*f->GetIntArray("ints"), (std::vector<int64_t>{1, 2, 3}));
  f.reset();
  ::unlink(path.c_str());
}

TEST(GgufWriterTest, RefusesMisuseAndLeavesNoFile) {
  const std::string path = TempPath("misuse");
  {
    auto w = *GgufWriter::Create(path);
    ASSERT_TRUE(w->AddMetadata("k", GgufValue::Scalar<uint8_t>(1)).ok());
    EXPECT_THAT(w->AddMetadata("k", GgufValue::Scalar<uint8_t>(2)).ToString(), HasSubstr("duplicate metadata key 'k'"));
    EXPECT_THAT(w->AddMetadata("general.alignment", GgufValue::Scalar<uint32_t>(64)).ToString(),
                HasSubstr("general.alignment must be a u32"));
    EXPECT_THAT(w->AddTensor("bad", 77, {32}).ToString(), HasSubstr("tensor 'bad': unknown ggml type id 77"));
    EXPECT_THAT(w->AddTensor("bad", 8, {31}).ToString(), HasSubstr("ne[0] = 31 is not a multiple of the q8_0 block"));
    EXPECT_THAT(w->AddTensor("bad", 0, {1, 1, 1, 1, 1}).ToString(), HasSubstr("5 dimensions"));
    EXPECT_THAT(w->AddTensor("bad", 0, {-1}).ToString(), HasSubstr("negative"));
    EXPECT_THAT(w->AddTensor("bad", 0, {int64_t{1} << 40, int64_t{1} << 40}).ToString(), HasSubstr("overflows"));
    ASSERT_TRUE(w->AddTensor("x", 0, {4}).ok());
    ASSERT_TRUE(w->AddTensor("y", 0, {4}).ok());
    EXPECT_THAT(w->AddTensor("x", 0, {4}).ToString(), HasSubstr("duplicate name"));
    const std::vector<uint8_t> eight(8, 1);
    EXPECT_THAT(w->WriteTensorData("y", eight).ToString(), HasSubstr("while tensor 'x' still lacks 16 of its 16"));
    ASSERT_TRUE(w->WriteTensorData("x", eight).ok());
    EXPECT_THAT(w->WriteTensorData("x", std::vector<uint8_t>(9)).ToString(),
                HasSubstr("tensor 'x' is given 9 more bytes but has 8 of its 16 left"));
    EXPECT_THAT(w->AddMetadata("late", GgufValue::Scalar<uint8_t>(1)).ToString(), HasSubstr("after tensor data"));
    ASSERT_TRUE(w->WriteTensorData("x", eight).ok());
    ASSERT_TRUE(w->WriteTensorData("y", eight).ok());
    EXPECT_THAT(w->WriteTensorData("x", eight).ToString(), HasSubstr("while tensor 'y' still lacks 8 of its 16"));
    EXPECT_THAT(w->Finish().ToString(), HasSubstr("tensor 'y' received 8 of its 16 bytes"));
  }
  EXPECT_FALSE(FileExists(path));
  EXPECT_FALSE(FileExists(absl::StrCat(path, ".partial-", ::getpid())));
  EXPECT_THAT(GgufWriter::Create(path, {.alignment = 48}).status().ToString(), HasSubstr("not a power of two"));
}

// A tensor of 4.5 GiB written as zeros (a hole in a sparse file) followed by a small tensor: its
// offset is past 4 GiB and both the header and the reader must carry it exactly. The file takes
// a few KB of disk and no time; the writer's 64-bit arithmetic is what is under test.
TEST(GgufWriterTest, OffsetsBeyondFourGiB) {
  const std::string path = TempPath("big");
  const int64_t big_elems = (int64_t{9} << 29) + 1;  // i8: 4.5 GiB + 1 byte, so "tail" needs padding
  std::vector<uint8_t> tail(256);
  for (size_t i = 0; i < tail.size(); ++i) tail[i] = static_cast<uint8_t>(i ^ 0x5a);
  {
    auto w = *GgufWriter::Create(path, {.alignment = 64});
    ASSERT_TRUE(w->AddTensor("big", 24, {big_elems}).ok());
    ASSERT_TRUE(w->AddTensor("tail", 0, {64}).ok());
    EXPECT_EQ(*w->TensorOffset("tail"), (uint64_t{9} << 29) + 64);
    ASSERT_TRUE(w->WriteTensorZeros("big", uint64_t{1} << 32).ok());
    ASSERT_TRUE(w->WriteTensorData("big", std::vector<uint8_t>(7, 0)).ok());
    ASSERT_TRUE(w->WriteTensorZeros("big", static_cast<uint64_t>(big_elems) - (uint64_t{1} << 32) - 7).ok());
    ASSERT_TRUE(w->WriteTensorData("tail", absl::Span<const uint8_t>(tail).subspan(0, 100)).ok());
    ASSERT_TRUE(w->WriteTensorData("tail", absl::Span<const uint8_t>(tail).subspan(100)).ok());
    ASSERT_TRUE(w->Finish().ok());
  }
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufTensorInfo* big = (*file)->FindTensor("big");
  const GgufTensorInfo* t = (*file)->FindTensor("tail");
  ASSERT_NE(big, nullptr);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(big->n_bytes, static_cast<uint64_t>(big_elems));
  EXPECT_EQ(t->offset, (uint64_t{9} << 29) + 64);
  EXPECT_GT(t->file_offset, uint64_t{1} << 32);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), (*file)->file_size());
  EXPECT_EQ((*file)->file_size(), t->file_offset + 256);
  EXPECT_EQ(std::vector<uint8_t>(t->data.begin(), t->data.end()), tail);
  EXPECT_EQ(big->data[0], 0);
  EXPECT_EQ(big->data[big->n_bytes - 1], 0);
  file->reset();
  ::unlink(path.c_str());
  // Sparse: far less disk than the file's length (the data holes were never written).
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{64} << 20)
      << "the filesystem under TempDir() does not keep holes; the test still checked the offsets";
}

}  // namespace
}  // namespace tandem
