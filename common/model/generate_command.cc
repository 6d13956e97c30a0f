#include "common/model/generate_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "common/model/reference_model.h"
#include "common/model/sampler.h"
#include "common/tokenizer/chatml.h"
#include "common/tokenizer/incremental_decoder.h"

namespace tandem {
namespace {

constexpr char kUsage[] =
    "usage: tandem generate --model F.gguf --prompt TEXT [--chat] [-n N] [--temperature T]\n"
    "                       [--top-k K] [--top-p P] [--seed S] [--threads N] [--ids]\n";

struct GenerateFlags {
  std::string model, prompt;
  bool chat = false, ids = false;
  int64_t n = 32;
  SamplingParams sampling;
  int64_t threads = 0;
};

// Parses the flags; on error prints which flag is bad and returns false.
bool ParseFlags(int argc, char** argv, GenerateFlags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tandem generate: %s needs a value\n", name);
        return nullptr;
      }
      return argv[++i];
    };
    auto number = [&](const char* name, auto* out) {
      const char* v = value(name);
      if (v == nullptr) return false;
      bool ok;
      if constexpr (std::is_floating_point_v<std::remove_pointer_t<decltype(out)>>) {
        ok = absl::SimpleAtof(v, out);
      } else {
        ok = absl::SimpleAtoi(v, out);
      }
      if (!ok) std::fprintf(stderr, "tandem generate: %s: '%s' is not a number\n", name, v);
      return ok;
    };
    bool ok = true;
    if (arg == "--model") {
      const char* v = value("--model");
      ok = v != nullptr;
      if (ok) f->model = v;
    } else if (arg == "--prompt") {
      const char* v = value("--prompt");
      ok = v != nullptr;
      if (ok) f->prompt = v;
    } else if (arg == "--chat") {
      f->chat = true;
    } else if (arg == "--ids") {
      f->ids = true;
    } else if (arg == "-n") {
      ok = number("-n", &f->n);
    } else if (arg == "--temperature") {
      ok = number("--temperature", &f->sampling.temperature);
    } else if (arg == "--top-k") {
      ok = number("--top-k", &f->sampling.top_k);
    } else if (arg == "--top-p") {
      ok = number("--top-p", &f->sampling.top_p);
    } else if (arg == "--seed") {
      ok = number("--seed", &f->sampling.seed);
    } else if (arg == "--threads") {
      ok = number("--threads", &f->threads);
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "tandem generate: unknown flag '%s'\n%s", arg.c_str(), kUsage);
      return false;
    }
    if (!ok) return false;
  }
  if (f->model.empty() || f->prompt.empty()) {
    std::fprintf(stderr, "tandem generate: --model and --prompt are required\n%s", kUsage);
    return false;
  }
  // Each bad value named by its flag; NaN fails every comparison, so the tests are written to
  // pass only for good values.
  const char* bad = nullptr;
  if (!(f->n >= 1)) bad = "-n: need >= 1";
  else if (!(f->sampling.temperature >= 0) || !std::isfinite(f->sampling.temperature)) {
    bad = "--temperature: need a finite value >= 0";
  } else if (!(f->sampling.top_k >= 0)) bad = "--top-k: need >= 0";
  else if (!(f->sampling.top_p > 0 && f->sampling.top_p <= 1)) bad = "--top-p: need a value in (0, 1]";
  else if (!(f->threads >= 0)) bad = "--threads: need >= 0";
  if (bad != nullptr) {
    std::fprintf(stderr, "tandem generate: %s\n", bad);
    return false;
  }
  return true;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  GenerateFlags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  ReferenceModelOptions options;
  options.threads = static_cast<int>(f.threads);
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model = ReferenceModel::Open(f.model, options);
  if (!model.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  ReferenceModel& m = **model;
  const Tokenizer& tok = m.tokenizer();
  std::string text = f.prompt;
  if (f.chat) {
    absl::StatusOr<std::string> chat = FormatChatML({{"user", f.prompt}}, true);
    if (!chat.ok()) {
      std::fprintf(stderr, "tandem generate: %s\n", std::string(chat.status().message()).c_str());
      return 1;
    }
    text = *chat;
  }
  const std::vector<int32_t> prompt = tok.Encode(text, /*parse_special=*/f.chat);
  if (prompt.empty()) {
    std::fprintf(stderr, "tandem generate: the prompt has no tokens\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<SequenceState>> seq = m.NewSequence();
  if (!seq.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(seq.status().message()).c_str());
    return 1;
  }
  std::vector<float> logits(m.config().vocab);
  Sampler sampler(f.sampling);
  IncrementalDecoder decoder(tok);
  std::vector<int32_t> generated;

  const auto t0 = std::chrono::steady_clock::now();
  ReferenceModel::Step step{seq->get(), prompt, logits.data(), false};
  if (absl::Status s = m.Forward(std::span(&step, 1)); !s.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < f.n; ++i) {
    const int32_t next = sampler.Sample(logits);
    generated.push_back(next);
    if (absl::StatusOr<std::string> piece = decoder.Push(next); piece.ok()) {
      std::fputs(piece->c_str(), stdout);
      std::fflush(stdout);
    }
    if (tok.eos_id() && next == *tok.eos_id()) break;
    if (i + 1 == f.n) break;
    const int32_t ids[1] = {next};
    step = ReferenceModel::Step{seq->get(), ids, logits.data(), false};
    if (absl::Status s = m.Forward(std::span(&step, 1)); !s.ok()) {
      std::fprintf(stderr, "\ntandem generate: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::fputs(decoder.Finish().c_str(), stdout);
  std::fputs("\n", stdout);
  if (f.ids) {
    std::printf("prompt_ids: %s\n", absl::StrJoin(prompt, " ").c_str());
    std::printf("generated_ids: %s\n", absl::StrJoin(generated, " ").c_str());
  }
  const int64_t decode_steps = static_cast<int64_t>(generated.size()) - 1;
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %lld tokens in %.3f s "
               "(%.1f tok/s); %d threads\n",
               prompt.size(), Seconds(t0, t1), prompt.size() / Seconds(t0, t1),
               static_cast<long long>(decode_steps), Seconds(t1, t2),
               decode_steps > 0 ? decode_steps / Seconds(t1, t2) : 0.0, m.threads()->threads());
  return 0;
}

}  // namespace tandem
