#include "common/convert/convert_command.h"

#include <cstdio>
#include <string>

#include "common/convert/qwen3next_converter.h"

namespace tandem {
namespace {

constexpr char kUsage[] =
    "usage: tandem convert --hf DIR --out F.gguf [--type T] [--expert-type T] [--no-mtp] [--quiet]\n"
    "  --hf DIR           a Qwen3NextForCausalLM checkpoint: config.json, *.safetensors (F32, F16 or\n"
    "                     BF16; sharded with model.safetensors.index.json), tokenizer.json,\n"
    "                     tokenizer_config.json\n"
    "  --out F.gguf       the qwen3next GGUF to write (llama.cpp's names and transformations)\n"
    "  --type T           matrices: f32, f16 (default), bf16, q8_0, q4_k (rows that are not whole\n"
    "                     blocks of T fall back to f16; norms and routers are always f32)\n"
    "  --expert-type T    the routed experts' matrices (default: --type)\n"
    "  --no-mtp           drop the MTP head (mtp.*)\n"
    "  --quiet            no progress line\n";

}  // namespace

int RunConvertCommand(int argc, char** argv) {
  std::string hf, out;
  ConvertOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tandem convert: %s needs a value\n%s", arg.c_str(), kUsage);
        return nullptr;
      }
      return argv[++i];
    };
    auto type = [&](WeightType* t) {
      const char* v = value();
      if (v == nullptr) return false;
      absl::StatusOr<WeightType> parsed = ParseWeightType(v);
      if (!parsed.ok() || (*parsed != WeightType::kF32 && *parsed != WeightType::kF16 &&
                           *parsed != WeightType::kBF16 && *parsed != WeightType::kQ8_0 &&
                           *parsed != WeightType::kQ4_K)) {
        std::fprintf(stderr, "tandem convert: %s '%s': expected f32, f16, bf16, q8_0 or q4_k\n",
                     arg.c_str(), v);
        return false;
      }
      *t = *parsed;
      return true;
    };
    if (arg == "--hf" || arg == "--out") {
      const char* v = value();
      if (v == nullptr) return 2;
      (arg == "--hf" ? hf : out) = v;
    } else if (arg == "--type") {
      if (!type(&options.type)) return 2;
    } else if (arg == "--expert-type") {
      WeightType t;
      if (!type(&t)) return 2;
      options.expert_type = t;
    } else if (arg == "--no-mtp") {
      options.keep_mtp = false;
    } else if (arg == "--quiet") {
      options.progress = false;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "tandem convert: unknown flag '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (hf.empty() || out.empty()) {
    std::fprintf(stderr, "tandem convert: --hf and --out are required\n%s", kUsage);
    return 2;
  }
  if (absl::Status s = ConvertQwen3NextCheckpoint(hf, out, options); !s.ok()) {
    std::fprintf(stderr, "tandem convert: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (options.progress) std::fprintf(stderr, "tandem convert: wrote %s\n", out.c_str());
  return 0;
}

}  // namespace tandem
