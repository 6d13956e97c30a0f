#include "common/model_gen/gen_model_command.h"

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_plan.h"

namespace tandem {
namespace {

using Setter = std::function<absl::Status(GenModelArgs&, const std::string&)>;

struct FlagDef {
  const char* name;   // without the leading "--"
  const char* value;  // the value's placeholder in the usage text; nullptr for a switch
  const char* help;
  Setter set;
};

absl::Status BadValue(const std::string& flag, const std::string& value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", why));
}

Setter IntField(const char* flag, int64_t GenModelSpec::*field, int64_t min) {
  return [flag, field, min](GenModelArgs& a, const std::string& v) -> absl::Status {
    int64_t n;
    if (!absl::SimpleAtoi(v, &n)) return BadValue(flag, v, "not an integer");
    if (n < min) return BadValue(flag, v, absl::StrCat("must be >= ", min));
    a.spec.*field = n;
    return absl::OkStatus();
  };
}

Setter TypeField(const char* flag, std::vector<WeightType GenModelSpec::*> fields) {
  return [flag, fields](GenModelArgs& a, const std::string& v) -> absl::Status {
    absl::StatusOr<WeightType> t = ParseWeightType(v);
    if (!t.ok()) {
      return BadValue(flag, v, "not a weight type (f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, "
                               "q5_k, q6_k)");
    }
    for (WeightType GenModelSpec::*f : fields) a.spec.*f = *t;
    return absl::OkStatus();
  };
}

const std::vector<FlagDef>& Flags() {
  static const std::vector<FlagDef>* flags = new std::vector<FlagDef>{
      {"preset", "NAME", "tiny (default), tiny-q3n, small, q3n-80b, q4x-80b",
       [](GenModelArgs&, const std::string&) { return absl::OkStatus(); }},  // applied first
      {"out", "FILE", "the GGUF file to write (required)",
       [](GenModelArgs& a, const std::string& v) {
         a.out = v;
         return absl::OkStatus();
       }},
      {"seed", "N", "weights seed (default 1); same spec and seed give the same bytes",
       [](GenModelArgs& a, const std::string& v) -> absl::Status {
         uint64_t n;
         if (!absl::SimpleAtoi(v, &n)) return BadValue("seed", v, "not an unsigned integer");
         a.spec.seed = n;
         return absl::OkStatus();
       }},
      {"arch", "A", "qwen3next (drops streams, indexer and Engram) or qwen4exp",
       [](GenModelArgs& a, const std::string& v) -> absl::Status {
         if (v != "qwen3next" && v != "qwen4exp") {
           return BadValue("arch", v, "must be qwen3next or qwen4exp");
         }
         a.spec.arch = v;
         if (v == "qwen3next") {
           a.spec.streams = 1;
           a.spec.hc_rank = 0;
           a.spec.idx_heads = 0;
           a.spec.engram_layers.clear();
         }
         return absl::OkStatus();
       }},
      {"name", "TEXT", "general.name",
       [](GenModelArgs& a, const std::string& v) {
         a.spec.name = v;
         return absl::OkStatus();
       }},
      {"experts-type", "T", "type of all expert matrices (gate, up and down)",
       TypeField("experts-type", {&GenModelSpec::expert_gate_up_type, &GenModelSpec::expert_down_type})},
      {"experts-gate-up-type", "T", "type of ffn_gate_exps and ffn_up_exps",
       TypeField("experts-gate-up-type", {&GenModelSpec::expert_gate_up_type})},
      {"experts-down-type", "T", "type of ffn_down_exps",
       TypeField("experts-down-type", {&GenModelSpec::expert_down_type})},
      {"dense-type", "T", "type of attention, GDN, shared-expert, hc, Engram and MTP matrices",
       TypeField("dense-type", {&GenModelSpec::dense_type})},
      {"head-type", "T", "type of token_embd and output",
       TypeField("head-type", {&GenModelSpec::head_type})},
      {"zipf", "S", "skew routing: expert popularity ~ rank^-S (0: none)",
       [](GenModelArgs& a, const std::string& v) -> absl::Status {
         double s;
         if (!absl::SimpleAtod(v, &s) || !(s >= 0)) return BadValue("zipf", v, "not a number >= 0");
         a.spec.zipf = s;
         return absl::OkStatus();
       }},
      {"vocab", "N", "vocabulary size", IntField("vocab", &GenModelSpec::vocab, 1)},
      {"layers", "N", "main layers", IntField("layers", &GenModelSpec::layers, 1)},
      {"hidden", "N", "embedding length h", IntField("hidden", &GenModelSpec::h, 1)},
      {"nextn", "N", "MTP layers (0 or 1)", IntField("nextn", &GenModelSpec::nextn, 0)},
      {"experts", "N", "experts per layer E", IntField("experts", &GenModelSpec::experts, 1)},
      {"experts-used", "N", "experts per token K",
       IntField("experts-used", &GenModelSpec::experts_used, 1)},
      {"expert-ffn", "N", "expert hidden size I", IntField("expert-ffn", &GenModelSpec::expert_ffn, 1)},
      {"shared-ffn", "N", "shared expert hidden size (0: none)",
       IntField("shared-ffn", &GenModelSpec::shared_ffn, 0)},
      {"context-length", "N", "context_length",
       IntField("context-length", &GenModelSpec::context_length, 1)},
      {"streams", "N", "hyper-connection streams S (qwen4exp)",
       IntField("streams", &GenModelSpec::streams, 1)},
      {"hc-rank", "N", "hyper-connection rank lr", IntField("hc-rank", &GenModelSpec::hc_rank, 0)},
      {"engram-layers", "LIST", "comma-separated Engram layers, or 'none'",
       [](GenModelArgs& a, const std::string& v) -> absl::Status {
         a.spec.engram_layers.clear();
         if (v == "none") return absl::OkStatus();
         for (absl::string_view part : absl::StrSplit(v, ',')) {
           int64_t n;
           if (!absl::SimpleAtoi(part, &n)) return BadValue("engram-layers", v, "not a list of integers");
           a.spec.engram_layers.push_back(n);
         }
         return absl::OkStatus();
       }},
      {"tied-output", nullptr, "omit output.weight (tied to token_embd)",
       [](GenModelArgs& a, const std::string&) {
         a.spec.tied_output = true;
         return absl::OkStatus();
       }},
      {"threads", "N", "tensors drawn at once (default: one per hardware thread); the bytes do not depend on it",
       [](GenModelArgs& a, const std::string& v) -> absl::Status {
         int n;
         if (!absl::SimpleAtoi(v, &n) || n < 1) return BadValue("threads", v, "not an integer >= 1");
         a.threads = n;
         return absl::OkStatus();
       }},
      {"dry-run", nullptr, "print the plan (tensors, bytes) and write nothing",
       [](GenModelArgs& a, const std::string&) {
         a.dry_run = true;
         return absl::OkStatus();
       }},
      {"quiet", nullptr, "no progress line",
       [](GenModelArgs& a, const std::string&) {
         a.quiet = true;
         return absl::OkStatus();
       }},
      {"help", nullptr, "this text",
       [](GenModelArgs& a, const std::string&) {
         a.help = true;
         return absl::OkStatus();
       }},
  };
  return *flags;
}

const FlagDef* FindFlag(const std::string& name) {
  for (const FlagDef& f : Flags()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

void PrintProgress(const GenProgress& p, bool tty) {
  const double mb = p.bytes_written / 1e6, total = p.total_bytes / 1e6;
  const double rate = p.seconds > 0 ? mb / p.seconds : 0;
  const double pct = p.total_bytes > 0 ? 100.0 * p.bytes_written / p.total_bytes : 100.0;
  std::fprintf(stderr, "%sgen-model: %.1f / %.1f MB (%.1f%%), %.1f MB/s, %s%s", tty ? "\r" : "",
               mb, total, pct, rate, std::string(p.tensor).c_str(), tty ? "\033[K" : "\n");
  std::fflush(stderr);
}

}  // namespace

std::string GenModelUsage() {
  std::string out =
      "usage: tandem gen-model --out FILE.gguf [--preset NAME] [--seed N] [flags]\n"
      "Writes a synthetic qwen3next / qwen4exp model with random weights (docs/GEN_MODEL.md).\n\n";
  for (const FlagDef& f : Flags()) {
    const std::string lhs = f.value ? absl::StrCat("--", f.name, " ", f.value) : absl::StrCat("--", f.name);
    absl::StrAppend(&out, "  ", lhs, std::string(lhs.size() < 28 ? 28 - lhs.size() : 1, ' '), f.help,
                    "\n");
  }
  return out;
}

absl::StatusOr<GenModelArgs> ParseGenModelArgs(int argc, char** argv) {
  std::vector<std::pair<const FlagDef*, std::string>> given;
  std::string preset = "tiny";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg,
                                                     "' (flags start with --; try --help)"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const FlagDef* f = FindFlag(name);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (try --help)"));
    }
    if (f->value == nullptr) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value (", f->value, ")"));
      }
      value = argv[++i];
    }
    if (name == "preset") preset = value;
    given.emplace_back(f, value);
  }
  GenModelArgs args;
  for (const auto& [f, value] : given) {
    if (std::string(f->name) == "help") args.help = true;
  }
  if (args.help) return args;
  absl::StatusOr<GenModelSpec> spec = PresetSpec(preset);
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat("--preset: ", spec.status().message()));
  args.spec = *std::move(spec);
  for (const auto& [f, value] : given) {
    if (absl::Status s = f->set(args, value); !s.ok()) return s;
  }
  if (args.out.empty() && !args.dry_run) {
    return absl::InvalidArgumentError("--out FILE is required");
  }
  return args;
}

int RunGenModelCommand(int argc, char** argv) {
  absl::StatusOr<GenModelArgs> args = ParseGenModelArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "gen-model: %s\n", std::string(args.status().message()).c_str());
    return 2;
  }
  if (args->help) {
    std::fputs(GenModelUsage().c_str(), stdout);
    return 0;
  }
  if (absl::Status s = CheckGenModelSpec(args->spec); !s.ok()) {
    std::fprintf(stderr, "gen-model: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<std::vector<PlannedTensor>> plan = PlanTensors(args->spec);
  if (!plan.ok()) {
    std::fprintf(stderr, "gen-model: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  const uint64_t data_bytes = PlannedDataBytes(*plan);
  if (args->dry_run) {
    std::printf("%s %s: %zu tensors, %.3f GB of tensor data\n", args->spec.arch.c_str(),
                args->spec.name.c_str(), plan->size(), data_bytes / 1e9);
    return 0;
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  // A progress line for models that take more than a moment: every 0.25 s on a terminal, every
  // 10 s in a log.
  const bool show = !args->quiet && data_bytes > (uint64_t{64} << 20);
  double next_report = tty ? 0.25 : 10.0;
  double elapsed = 0;
  absl::Status s = GenerateModel(args->spec, args->out, [&](const GenProgress& p) {
    elapsed = p.seconds;
    if (!show || p.done || p.seconds < next_report) return;
    next_report = p.seconds + (tty ? 0.25 : 10.0);
    PrintProgress(p, tty);
  }, args->threads);
  if (show && tty) std::fputs("\n", stderr);
  if (!s.ok()) {
    std::fprintf(stderr, "gen-model: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!args->quiet) {
    std::fprintf(stderr,
                 "gen-model: wrote %s (%s, %zu tensors, %.1f MB of tensor data, seed %llu) in "
                 "%.1f s\n",
                 args->out.c_str(), args->spec.arch.c_str(), plan->size(), data_bytes / 1e6,
                 static_cast<unsigned long long>(args->spec.seed), elapsed);
  }
  return 0;
}

}  // namespace tandem
