// libFuzzer target for the GGUF reader: any input must either load or be refused with a message,
// never crash, hang, read outside the input (ASan watches the input copy) or allocate without
// bound. A loaded file must keep its invariants, and every metadata value, tensor byte and the
// inspect formatting are exercised.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/gguf/gguf_file.h"
#include "common/gguf/inspect_format.h"

namespace {

using tandem::GgufFile;
using tandem::GgufType;
using tandem::GgufValue;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

volatile uint64_t g_sink;

template <typename T>
void TouchArrayAs(const GgufValue& v) {
  auto elements = v.GetArray<T>();
  Check(elements.ok() == (v.element_type() == tandem::GgufTypeOf<T>::value));
  if (elements.ok()) Check(elements->size() == v.array_size());
}

void TouchValue(const GgufValue& v) {
  uint64_t h = static_cast<uint64_t>(v.type());
  switch (v.type()) {
    case GgufType::kString:
      h += v.AsString()->size();
      break;
    case GgufType::kArray: {
      for (uint64_t i = 0; i < v.array_size(); ++i) {
        if (v.element_type() == GgufType::kArray) {
          TouchValue(v.ArrayAt(i));
        } else {
          TouchValue(v.ElementAt(i));
        }
      }
      TouchArrayAs<uint8_t>(v);
      TouchArrayAs<int32_t>(v);
      TouchArrayAs<uint32_t>(v);
      TouchArrayAs<float>(v);
      TouchArrayAs<bool>(v);
      TouchArrayAs<uint64_t>(v);
      TouchArrayAs<double>(v);
      if (auto strings = v.GetStringArray(); strings.ok()) Check(strings->size() == v.array_size());
      if (auto ints = v.ToIntArray(); ints.ok()) Check(ints->size() == v.array_size());
      break;
    }
    default:
      if (auto i = v.ToInt(); i.ok()) h += static_cast<uint64_t>(*i);
      if (auto f = v.ToFloat(); f.ok()) h += static_cast<uint64_t>(*f != *f);
      if (auto b = v.Get<bool>(); b.ok()) h += *b;
      break;
  }
  g_sink = g_sink + h + tandem::FormatGgufValueText(v).size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<std::unique_ptr<GgufFile>> loaded =
      GgufFile::FromBytes(absl::Span<const uint8_t>(data, size), "fuzz.gguf");
  if (!loaded.ok()) {
    Check(!loaded.status().message().empty());
    return 0;
  }
  const GgufFile& file = **loaded;
  Check(file.version() == 2 || file.version() == 3);
  Check(file.alignment() != 0 && (file.alignment() & (file.alignment() - 1)) == 0);
  Check(file.file_size() == size);
  for (const tandem::GgufMetadataEntry& e : file.metadata()) {
    Check(file.FindValue(e.key) == &e.value);
    TouchValue(e.value);
    (void)file.GetU32(e.key);
    (void)file.GetString(e.key);
    (void)file.GetInt(e.key, 0, 1000);
    (void)file.GetFloat(e.key);
    (void)file.GetIntArray(e.key);
    (void)file.GetStringArray(e.key);
    (void)file.GetArrayOf<float>(e.key);
  }
  uint64_t total = 0;
  for (const tandem::GgufTensorInfo& t : file.tensors()) {
    Check(file.FindTensor(t.name) == &t);
    Check(t.type_info != nullptr && t.n_dims >= 0 && t.n_dims <= 4);
    Check(t.data.size() == t.n_bytes);
    Check(t.file_offset == file.data_offset() + t.offset && t.file_offset % file.alignment() == 0);
    Check(t.file_offset <= size && t.n_bytes <= size - t.file_offset);
    uint8_t x = 0;
    for (uint8_t b : t.data) x ^= b;  // reads every byte: ASan checks they are inside the input
    g_sink = g_sink + x;
    total += t.n_bytes;
  }
  Check(total <= size);
  g_sink = g_sink + tandem::FormatGgufText(file).size() + tandem::FormatGgufJson(file).size();
  return 0;
}
