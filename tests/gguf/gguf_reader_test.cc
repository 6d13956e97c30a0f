// The reader against files assembled by hand from the published layout, and against every kind
// of damage to them: each must load exactly as written, or fail with a message naming the field
// and its byte offset.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gguf/hand_fixture.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing_gguf::HandFixture;
using testing_gguf::MakeHandFixture;

absl::StatusOr<std::unique_ptr<GgufFile>> Load(const std::vector<uint8_t>& bytes) {
  return GgufFile::FromBytes(absl::Span<const uint8_t>(bytes), "fixture.gguf");
}

std::string LoadError(const std::vector<uint8_t>& bytes) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = Load(bytes);
  EXPECT_FALSE(file.ok()) << "expected the damaged file to be refused";
  if (file.ok()) return "";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  return std::string(file.status().message());
}

void ExpectFixtureContents(const GgufFile& file, const HandFixture& f) {
  EXPECT_EQ(file.alignment(), f.alignment);
  EXPECT_EQ(file.data_offset(), f.data_at);
  EXPECT_EQ(file.file_size(), f.bytes.size());
  ASSERT_GE(file.metadata().size(), 5u);
  EXPECT_EQ(file.metadata()[0].key, "general.architecture");
  EXPECT_EQ(file.metadata()[0].offset, 24u);
  EXPECT_EQ(*file.GetString("general.architecture"), "tandem-test");
  EXPECT_EQ(*file.GetU32("test.count"), 7u);
  EXPECT_EQ(*file.GetArrayOf<float>("test.scores"), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_TRUE(*file.GetBool("test.flag"));
  absl::StatusOr<const GgufValue*> nested = file.GetArray("test.nested");
  ASSERT_TRUE(nested.ok()) << nested.status();
  ASSERT_EQ((*nested)->element_type(), GgufType::kArray);
  ASSERT_EQ((*nested)->array_size(), 2u);
  EXPECT_EQ(*(*nested)->ArrayAt(0).GetArray<uint8_t>(), (std::vector<uint8_t>{1, 2}));
  absl::StatusOr<absl::Span<const std::string>> strings = (*nested)->ArrayAt(1).GetStringArray();
  ASSERT_TRUE(strings.ok());
  ASSERT_EQ(strings->size(), 1u);
  EXPECT_EQ((*strings)[0], "x");

  ASSERT_EQ(file.tensors().size(), 2u);
  const GgufTensorInfo* a = file.FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ggml_type, 0u);
  EXPECT_EQ(a->n_dims, 2);
  EXPECT_EQ(a->ne, (std::array<int64_t, 4>{4, 2, 1, 1}));
  EXPECT_EQ(a->n_elements, 8);
  EXPECT_EQ(a->n_bytes, 32u);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->file_offset, f.data_at);
  EXPECT_EQ(a->info_offset, f.tensor_a_at);
  ASSERT_EQ(a->data.size(), 32u);
  for (int i = 0; i < 8; ++i) {
    float v;
    std::memcpy(&v, a->data.data() + 4 * i, 4);
    EXPECT_EQ(v, static_cast<float>(i));
  }
  const GgufTensorInfo* b = file.FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::string(b->type_info->name), "q8_0");
  EXPECT_EQ(b->n_bytes, 34u);
  EXPECT_EQ(b->offset % f.alignment, 0u);
  ASSERT_EQ(b->data.size(), 34u);
  for (int i = 0; i < 34; ++i) EXPECT_EQ(b->data[i], i);
  // Views are as aligned as the alignment says (storage is page-aligned like a mapping).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data.data()) % f.alignment, 0u);
}

TEST(GgufReaderTest, LoadsHandWrittenVersion3File) {
  const HandFixture f = MakeHandFixture(3);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = Load(f.bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  ExpectFixtureContents(**file, f);
}

TEST(GgufReaderTest, LoadsHandWrittenVersion2File) {
  const HandFixture f = MakeHandFixture(2);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = Load(f.bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 2u);
  ExpectFixtureContents(**file, f);
}

TEST(GgufReaderTest, HonoursGeneralAlignment) {
  const HandFixture f = MakeHandFixture(3, 64);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = Load(f.bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->alignment(), 64u);
  EXPECT_EQ((*file)->FindTensor("b")->offset, 64u);
  ExpectFixtureContents(**file, f);
}

TEST(GgufReaderTest, TypedGettersNameKeyAndTypes) {
  const HandFixture f = MakeHandFixture();
  std::unique_ptr<GgufFile> file = *Load(f.bytes);
  absl::StatusOr<int32_t> wrong = file->GetI32("test.count");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().ToString(), HasSubstr("metadata key 'test.count': expected i32, found u32"));
  absl::StatusOr<uint32_t> missing = file->GetU32("test.absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().ToString(), HasSubstr("'test.absent' is missing"));
  EXPECT_EQ(*file->GetInt("test.count"), 7);
  EXPECT_EQ(file->GetInt("test.count", 8, 100).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(file->GetInt("general.architecture").status().ToString(), HasSubstr("found string"));
  EXPECT_THAT(file->GetArrayOf<int32_t>("test.scores").status().ToString(),
              HasSubstr("expected an array of i32, found an array of f32"));
  EXPECT_THAT(file->GetArray("test.count").status().ToString(), HasSubstr("expected an array, found u32"));
  EXPECT_EQ(file->GetTensor("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(file->FindTensor("nope"), nullptr);
}

// Every prefix of the file shorter than the end of the last tensor's data must be refused (with a
// message naming a byte offset); prefixes that only drop the trailing padding still load.
TEST(GgufReaderTest, EveryTruncationIsRefused) {
  for (uint32_t version : {2u, 3u}) {
    const HandFixture f = MakeHandFixture(version, 64);
    for (size_t n = 0; n < f.bytes.size(); ++n) {
      std::vector<uint8_t> prefix(f.bytes.begin(), f.bytes.begin() + n);
      absl::StatusOr<std::unique_ptr<GgufFile>> file = Load(prefix);
      if (n < f.data_end) {
        ASSERT_FALSE(file.ok()) << "a " << n << "-byte prefix loaded";
        EXPECT_THAT(file.status().ToString(), HasSubstr(" at byte ")) << file.status();
      } else {
        EXPECT_TRUE(file.ok()) << n << ": " << file.status();
      }
    }
  }
}

TEST(GgufReaderTest, RefusesBadHeader) {
  HandFixture f = MakeHandFixture();
  f.bytes[0] = 'X';
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("magic at byte 0: expected 'GGUF'"));

  f = MakeHandFixture(1);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("version at byte 4: GGUF version 1"));
  f = MakeHandFixture(4);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("version at byte 4: unsupported version 4"));
  f = MakeHandFixture(0x03000000);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("big-endian"));

  f = MakeHandFixture();
  f.Poke<uint64_t>(8, std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("tensor_count at byte 8"));
  f = MakeHandFixture();
  f.Poke<uint64_t>(16, uint64_t{1} << 40);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("metadata_kv_count at byte 16"));
}

TEST(GgufReaderTest, RefusesBadMetadata) {
  HandFixture f = MakeHandFixture();
  f.Poke<uint64_t>(f.first_key_length_at, uint64_t{1} << 50);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("key length at byte ", f.first_key_length_at)));

  f = MakeHandFixture();
  f.Poke<uint32_t>(f.count_type_at, 13);
  EXPECT_THAT(LoadError(f.bytes),
              HasSubstr(absl::StrCat("'test.count' (entry 1): value type at byte ", f.count_type_at,
                                     ": unknown value type id 13")));

  f = MakeHandFixture();
  f.Poke<uint64_t>(f.scores_length_at, std::numeric_limits<uint64_t>::max() / 2);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("array length at byte ", f.scores_length_at)));

  f = MakeHandFixture();
  f.Poke<uint8_t>(f.flag_value_at, 2);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("bool value at byte ", f.flag_value_at)));

  // "test.nested" renamed "test.scores" (same length): a duplicate key.
  f = MakeHandFixture();
  const std::string nested = "test.nested";
  const auto it = std::search(f.bytes.begin(), f.bytes.end(), nested.begin(), nested.end());
  ASSERT_NE(it, f.bytes.end());
  std::memcpy(&*it, "test.scores", nested.size());
  const uint64_t entry_at = static_cast<uint64_t>(it - f.bytes.begin()) - 8;
  EXPECT_THAT(LoadError(f.bytes),
              HasSubstr(absl::StrCat("'test.scores' (entry 4): key at byte ", entry_at,
                                     ": duplicate key (first at byte ", f.scores_length_at - 4 - 4 - 11 - 8)));

  // Arrays nested nine deep.
  testing_gguf::ByteBuilder b;
  b.Raw("GGUF", 4);
  b.U32(3);
  b.U64(0);
  b.U64(1);
  b.Str("deep");
  b.U32(9);
  for (int i = 0; i < 9; ++i) {
    b.U32(9);
    b.U64(1);
  }
  b.U32(0);
  b.U64(0);
  EXPECT_THAT(LoadError(b.bytes()), HasSubstr("nested deeper than 8"));
}

TEST(GgufReaderTest, RefusesBadAlignment) {
  for (uint32_t bad : {0u, 48u, 3u}) {
    HandFixture f = MakeHandFixture(3, 64);
    f.Poke<uint32_t>(f.alignment_value_at, bad);
    EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("'general.alignment' (entry 5): value at byte ",
                                                           f.alignment_value_at, ": ", bad,
                                                           " is not a power of two")));
  }
  HandFixture f = MakeHandFixture(3, 64);
  f.Poke<uint32_t>(f.alignment_type_at, 5);  // i32
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("'general.alignment' (entry 5): value type at byte ",
                                                         f.alignment_type_at, ": expected u32, found i32")));
}

TEST(GgufReaderTest, RefusesBadTensorInfos) {
  HandFixture f = MakeHandFixture();
  f.Poke<uint32_t>(f.a_type_at, 77);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("tensor 'a' (info 0): type at byte ", f.a_type_at,
                                                         ": unknown ggml type id 77")));
  f = MakeHandFixture();
  f.Poke<uint32_t>(f.a_type_at, 4);  // retired q4_2
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("unknown ggml type id 4"));

  f = MakeHandFixture();
  f.Poke<uint32_t>(f.a_n_dims_at, 5);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("n_dims at byte ", f.a_n_dims_at, ": 5 dimensions")));

  f = MakeHandFixture();
  f.Poke<uint64_t>(f.a_ne0_at, uint64_t{1} << 63);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("ne[0] at byte ", f.a_ne0_at)));

  f = MakeHandFixture();
  f.Poke<uint64_t>(f.a_ne0_at, uint64_t{1} << 40);
  f.Poke<uint64_t>(f.a_ne1_at, uint64_t{1} << 40);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("overflows"));

  f = MakeHandFixture();
  f.Poke<uint64_t>(f.b_ne0_at, 31);  // not a whole q8_0 block
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("ne[0] at byte"));

  f = MakeHandFixture();
  f.Poke<uint64_t>(f.b_offset_at, 33);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("tensor 'b' (info 1): offset at byte ", f.b_offset_at,
                                                         ": 33 is not a multiple of the alignment 32")));
  f = MakeHandFixture();
  f.Poke<uint64_t>(f.b_offset_at, 4096);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("tensor 'b' (info 1): offset at byte ", f.b_offset_at,
                                                         ": data [4096, +34) runs past the end of the file")));
  f = MakeHandFixture();
  f.Poke<uint64_t>(f.b_offset_at, std::numeric_limits<uint64_t>::max() - 31);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("runs past the end of the file"));

  // Found by the fuzzer: an empty tensor in a file that ends before its data section starts.
  f = MakeHandFixture();
  f.Poke<uint64_t>(f.a_ne0_at, 0);
  f.Poke<uint64_t>(f.b_ne0_at, 0);
  f.bytes.resize(f.data_at - 1);
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("tensor 'a' (info 0): offset at byte ", f.a_type_at + 4,
                                                         ": data [0, +0) runs past the end of the file")));

  f = MakeHandFixture();
  f.Poke<uint64_t>(f.b_offset_at, 0);  // on top of tensor a
  EXPECT_THAT(LoadError(f.bytes), HasSubstr("overlaps tensor 'a'"));

  f = MakeHandFixture();
  f.bytes[f.b_name_at + 8] = 'a';  // tensor "b" renamed "a"
  EXPECT_THAT(LoadError(f.bytes), HasSubstr(absl::StrCat("name at byte ", f.b_name_at,
                                                         ": duplicate tensor name (first at byte ", f.tensor_a_at)));
}

}  // namespace
}  // namespace tandem
