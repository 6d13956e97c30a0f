// Writes the fuzzer's seed corpus: a few small valid GGUF files covering both versions, several
// alignments, every metadata type (nested arrays included) and one single-block tensor of every
// ggml type in the table. Usage: gguf_fuzz_seeds OUT_DIR
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_writer.h"
#include "common/weights/weight_types.h"

namespace {

using tandem::GgufType;
using tandem::GgufValue;
using tandem::GgufWriter;
using tandem::GgufWriterOptions;

bool Ok(const absl::Status& s) {
  if (!s.ok()) std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", std::string(s.message()).c_str());
  return s.ok();
}

// Declares `tensors` (name, type, ne0) and fills each with a byte pattern.
bool WriteSeed(const std::string& path, GgufWriterOptions options, const std::vector<std::pair<std::string, GgufValue>>& kv,
               const std::vector<std::tuple<std::string, uint32_t, int64_t>>& tensors) {
  auto w = GgufWriter::Create(path, options);
  if (!Ok(w.status())) return false;
  for (const auto& [key, value] : kv) {
    if (!Ok((*w)->AddMetadata(key, value))) return false;
  }
  for (const auto& [name, type, ne0] : tensors) {
    if (!Ok((*w)->AddTensor(name, type, {ne0}))) return false;
  }
  for (const auto& [name, type, ne0] : tensors) {
    std::vector<uint8_t> bytes(*(*w)->TensorBytes(name));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + type);
    if (!Ok((*w)->WriteTensorData(name, bytes))) return false;
  }
  return Ok((*w)->Finish());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_fuzz_seeds OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = WriteSeed(dir + "/empty.gguf", {}, {}, {});
  ok = ok && WriteSeed(dir + "/v2_small.gguf", {.alignment = 32, .version = 2},
                       {{"general.architecture", GgufValue::String("qwen3next")},
                        {"qwen3next.block_count", GgufValue::Scalar<uint32_t>(4)},
                        {"qwen3next.rope.freq_base", GgufValue::Scalar<float>(1e7f)}},
                       {{"token_embd.weight", 0, 8}, {"output_norm.weight", 8, 32}});
  ok = ok && WriteSeed(dir + "/all_metadata.gguf", {.alignment = 64, .version = 3},
                       {{"u8", GgufValue::Scalar<uint8_t>(1)},
                        {"i8", GgufValue::Scalar<int8_t>(-1)},
                        {"u16", GgufValue::Scalar<uint16_t>(2)},
                        {"i16", GgufValue::Scalar<int16_t>(-2)},
                        {"u32", GgufValue::Scalar<uint32_t>(3)},
                        {"i32", GgufValue::Scalar<int32_t>(-3)},
                        {"f32", GgufValue::Scalar<float>(0.5f)},
                        {"bool", GgufValue::Scalar<bool>(true)},
                        {"string", GgufValue::String("s")},
                        {"u64", GgufValue::Scalar<uint64_t>(4)},
                        {"i64", GgufValue::Scalar<int64_t>(-4)},
                        {"f64", GgufValue::Scalar<double>(0.25)},
                        {"a.u32", GgufValue::Array(std::vector<uint32_t>{1, 2})},
                        {"a.f32", GgufValue::Array(std::vector<float>{1.5f})},
                        {"a.bool", GgufValue::BoolArray({true, false})},
                        {"a.string", GgufValue::StringArray({"a", "bc"})},
                        {"a.nested", GgufValue::ArrayOfArrays({GgufValue::Array(std::vector<int8_t>{1}),
                                                               GgufValue::EmptyArray(GgufType::kString)})}},
                       {{"t", 1, 4}});
  std::vector<std::tuple<std::string, uint32_t, int64_t>> every_type;
  for (uint32_t id = 0; id < 64; ++id) {
    if (const tandem::WeightTypeInfo* info = tandem::FindWeightTypeInfo(id)) {
      every_type.emplace_back(std::string(info->name), id, info->block_elems);
    }
  }
  ok = ok && WriteSeed(dir + "/every_type.gguf", {}, {}, every_type);
  if (!ok) return 1;
  std::printf("gguf_fuzz_seeds: wrote 4 seeds to %s\n", dir.c_str());
  return 0;
}
