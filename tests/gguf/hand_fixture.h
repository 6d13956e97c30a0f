// A small GGUF file assembled byte by byte from the published layout (ggml's docs/gguf.md), not
// with GgufWriter, so that the reader is checked against the format rather than against our own
// writer. The builder records where each interesting field lies, so tests can corrupt it.
#ifndef TANDEM_TESTS_GGUF_HAND_FIXTURE_H_
#define TANDEM_TESTS_GGUF_HAND_FIXTURE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace tandem::testing_gguf {

class ByteBuilder {
 public:
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  void Raw(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  template <typename T>
  void Put(T v) {  // little-endian on the (little-endian) host
    Raw(&v, sizeof(T));
  }
  void U32(uint32_t v) { Put(v); }
  void U64(uint64_t v) { Put(v); }
  void Str(const std::string& s) {
    U64(s.size());
    Raw(s.data(), s.size());
  }
  void PadTo(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }

 private:
  std::vector<uint8_t> bytes_;
};

// Where the fields of the hand-made file are (byte offsets from the file start).
struct HandFixture {
  std::vector<uint8_t> bytes;
  uint64_t first_key_length_at = 0;   // "general.architecture"'s key length
  uint64_t count_type_at = 0;         // value type of "test.count" (u32)
  uint64_t scores_length_at = 0;      // array length of "test.scores"
  uint64_t flag_value_at = 0;         // the bool value of "test.flag"
  uint64_t alignment_value_at = 0;    // general.alignment's value (when written)
  uint64_t alignment_type_at = 0;
  uint64_t tensor_a_at = 0;           // start of tensor "a"'s info (its name length)
  uint64_t a_n_dims_at = 0;
  uint64_t a_ne0_at = 0;
  uint64_t a_ne1_at = 0;
  uint64_t a_type_at = 0;
  uint64_t b_name_at = 0;             // tensor "b"'s name length
  uint64_t b_ne0_at = 0;
  uint64_t b_type_at = 0;
  uint64_t b_offset_at = 0;
  uint64_t data_at = 0;               // start of the data section
  uint64_t data_end = 0;              // end of the last tensor's bytes (file may pad beyond)
  uint32_t alignment = 32;

  template <typename T>
  void Poke(uint64_t at, T v) { std::memcpy(bytes.data() + at, &v, sizeof(T)); }
};

// Metadata: general.architecture = "tandem-test" (string), test.count = 7 (u32),
// test.scores = [0.5, -1.25] (f32 array), test.flag = true (bool),
// test.nested = [[1, 2] (u8), ["x"] (string)] (array of arrays),
// [general.alignment = alignment (u32) when write_alignment].
// Tensors: "a" f32 ne {4, 2} holding 0..7; "b" q8_0 ne {32} (34 bytes: 0, 1, 2, ...).
inline HandFixture MakeHandFixture(uint32_t version = 3, std::optional<uint32_t> alignment = std::nullopt) {
  HandFixture f;
  f.alignment = alignment.value_or(32);
  ByteBuilder b;
  b.Raw("GGUF", 4);
  b.U32(version);
  b.U64(2);                          // tensor_count
  b.U64(alignment ? 6 : 5);          // metadata_kv_count
  f.first_key_length_at = b.size();
  b.Str("general.architecture");
  b.U32(8);                          // string
  b.Str("tandem-test");
  b.Str("test.count");
  f.count_type_at = b.size();
  b.U32(4);                          // u32
  b.U32(7);
  b.Str("test.scores");
  b.U32(9);                          // array
  b.U32(6);                          // of f32
  f.scores_length_at = b.size();
  b.U64(2);
  b.Put<float>(0.5f);
  b.Put<float>(-1.25f);
  b.Str("test.flag");
  b.U32(7);                          // bool
  f.flag_value_at = b.size();
  b.Put<uint8_t>(1);
  b.Str("test.nested");
  b.U32(9);                          // array
  b.U32(9);                          // of arrays
  b.U64(2);
  b.U32(0);                          //   [0]: array of u8
  b.U64(2);
  b.Put<uint8_t>(1);
  b.Put<uint8_t>(2);
  b.U32(8);                          //   [1]: array of string
  b.U64(1);
  b.Str("x");
  if (alignment) {
    b.Str("general.alignment");
    f.alignment_type_at = b.size();
    b.U32(4);                        // u32
    f.alignment_value_at = b.size();
    b.U32(*alignment);
  }
  // Tensor infos.
  f.tensor_a_at = b.size();
  b.Str("a");
  f.a_n_dims_at = b.size();
  b.U32(2);
  f.a_ne0_at = b.size();
  b.U64(4);
  f.a_ne1_at = b.size();
  b.U64(2);
  f.a_type_at = b.size();
  b.U32(0);                          // f32
  b.U64(0);                          // offset
  f.b_name_at = b.size();
  b.Str("b");
  b.U32(1);
  f.b_ne0_at = b.size();
  b.U64(32);
  f.b_type_at = b.size();
  b.U32(8);                          // q8_0: 34 bytes per 32 elements
  f.b_offset_at = b.size();
  const uint64_t b_offset = (32 + f.alignment - 1) / f.alignment * f.alignment;  // a takes 32 bytes
  b.U64(b_offset);
  b.PadTo(f.alignment);
  f.data_at = b.size();
  for (int i = 0; i < 8; ++i) b.Put<float>(static_cast<float>(i));
  b.PadTo(f.alignment);
  for (int i = 0; i < 34; ++i) b.Put<uint8_t>(static_cast<uint8_t>(i));
  f.data_end = b.size();
  b.PadTo(f.alignment);
  f.bytes = b.bytes();
  return f;
}

}  // namespace tandem::testing_gguf

#endif  // TANDEM_TESTS_GGUF_HAND_FIXTURE_H_
