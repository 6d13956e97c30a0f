#include "common/convert/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/weights/half.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

// A header larger than this is not a checkpoint header (the real 80B checkpoint's largest is
// a few hundred KB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

StDtype ParseDtype(const std::string& s, int* element_bytes) {
  if (s == "F32") return *element_bytes = 4, StDtype::kF32;
  if (s == "F16") return *element_bytes = 2, StDtype::kF16;
  if (s == "BF16") return *element_bytes = 2, StDtype::kBF16;
  static const std::map<std::string, int> kOthers = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = kOthers.find(s);
  *element_bytes = it == kOthers.end() ? 0 : it->second;
  return StDtype::kOther;
}

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid safetensors file: ", what));
}

}  // namespace

int64_t StTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(*mapped)));
  const uint8_t* base = file->mapping_->data();
  const uint64_t size = file->mapping_->size();
  if (size < 8) {
    return Bad(path, absl::StrCat("the file has ", size, " bytes, fewer than the 8-byte header "
                                  "length (truncated?)"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " (bytes 0..7) exceeds the file's ",
                                  size - 8, " remaining bytes (truncated?)"));
  }
  Json header = Json::parse(base + 8, base + 8 + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Bad(path, absl::StrCat("the JSON header (bytes 8..", 8 + header_len,
                                  ") does not parse as an object"));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const Json& e = it.value();
    const std::string where = absl::StrCat("tensor '", it.key(), "'");
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") ||
        !e["shape"].is_array() || !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return Bad(path, absl::StrCat(where, ": needs dtype (string), shape (array) and "
                                    "data_offsets ([begin, end])"));
    }
    StTensor t;
    t.name = it.key();
    t.dtype_name = e["dtype"].get<std::string>();
    int element_bytes = 0;
    t.dtype = ParseDtype(t.dtype_name, &element_bytes);
    if (element_bytes == 0) return Bad(path, absl::StrCat(where, ": unknown dtype '", t.dtype_name, "'"));
    uint64_t elements = 1;
    for (const Json& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return Bad(path, absl::StrCat(where, ": shape entries must be non-negative integers"));
      }
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      elements *= d.get<uint64_t>();
      if (elements > (uint64_t{1} << 40)) return Bad(path, absl::StrCat(where, ": too many elements"));
    }
    const Json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return Bad(path, absl::StrCat(where, ": data_offsets must be non-negative integers"));
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end - begin != elements * element_bytes) {
      return Bad(path, absl::StrCat(where, ": data_offsets [", begin, ", ", end, "] hold ",
                                    end - begin, " bytes; dtype ", t.dtype_name, " and shape ",
                                    ShapeToString(t.shape), " need ", elements * element_bytes));
    }
    if (end > data_size) {
      return Bad(path, absl::StrCat(where, ": data ends at file byte ", data_start + end,
                                    " but the file has ", size, " bytes (truncated?)"));
    }
    t.data = absl::Span<const uint8_t>(base + data_start + begin, end - begin);
    t.file = &file->mapping_->path();
    file->tensors_.emplace(t.name, std::move(t));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  namespace fs = std::filesystem;
  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  std::vector<std::string> shards;
  std::map<std::string, std::string> expected;  // tensor -> shard file name, from the index
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path);
    std::stringstream text;
    text << in.rdbuf();
    Json index = Json::parse(text.str(), nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": expected a JSON object with a 'weight_map' object"));
    }
    std::set<std::string> names;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": weight_map['",
                                                       it.key(), "'] is not a file name"));
      }
      expected[it.key()] = it.value().get<std::string>();
      names.insert(it.value().get<std::string>());
    }
    for (const std::string& n : names) shards.push_back((fs::path(dir) / n).string());
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
    }
    if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list the directory: ", ec.message()));
    std::sort(shards.begin(), shards.end());
  }
  if (shards.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors file (nor ",
                                            "model.safetensors.index.json) in the directory"));
  }
  for (const std::string& s : shards) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(s);
    if (!f.ok()) return f.status();
    for (const auto& [name, t] : (*f)->tensors()) {
      if (auto [it, inserted] = ckpt->index_.emplace(name, &t); !inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is in both ",
                                                       *it->second->file, " and ", s));
      }
    }
    ckpt->files_.push_back(std::move(*f));
  }
  for (const auto& [name, shard] : expected) {
    const StTensor* t = ckpt->Find(name);
    if (t == nullptr || fs::path(*t->file).filename() != shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path.string(), ": lists tensor '", name, "' in ", shard, ", which does not hold it"));
    }
  }
  return ckpt;
}

const StTensor* SafetensorsCheckpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsCheckpoint::ReadF32(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const StTensor* t = Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing"));
  if (!expected_shape.empty() && t->shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape ",
                                                   ShapeToString(t->shape), ", expected ",
                                                   ShapeToString(expected_shape)));
  }
  const int64_t n = t->elements();
  std::vector<float> out(n);
  const uint8_t* p = t->data.data();
  switch (t->dtype) {
    case StDtype::kF32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case StDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = Fp16ToFp32(v);
      }
      break;
    case StDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = FloatFromBits(static_cast<uint32_t>(v) << 16);
      }
      break;
    case StDtype::kOther:
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dtype ", t->dtype_name,
                                                     "; the converter reads F32, F16 and BF16"));
  }
  return out;
}

}  // namespace tandem
