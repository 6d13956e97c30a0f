#include "common/convert/logits_command.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model/reference_model.h"

namespace tandem {
namespace {

constexpr char kUsage[] =
    "usage: tandem logits --model F.gguf --ids 1,2,3 [--out F.bin] [--greedy N]\n"
    "                     [--draft K --draft-out F.bin] [--threads N]\n";

bool WriteRows(const std::string& path, const std::vector<float>& v) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), std::fclose);
  if (!f) {
    std::fprintf(stderr, "tandem logits: cannot create %s\n", path.c_str());
    return false;
  }
  if (std::fwrite(v.data(), sizeof(float), v.size(), f.get()) != v.size()) {
    std::fprintf(stderr, "tandem logits: short write to %s\n", path.c_str());
    return false;
  }
  return true;
}

int32_t Argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem logits: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int RunLogitsCommand(int argc, char** argv) {
  std::string model_path, out, draft_out;
  std::vector<int32_t> ids;
  int64_t greedy = 0, draft = 0, threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tandem logits: %s needs a value (or is unknown)\n%s", arg.c_str(), kUsage);
      return 2;
    }
    const std::string v = argv[++i];
    bool ok = true;
    if (arg == "--model") {
      model_path = v;
    } else if (arg == "--out") {
      out = v;
    } else if (arg == "--draft-out") {
      draft_out = v;
    } else if (arg == "--ids") {
      for (absl::string_view piece : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int32_t id = 0;
        ok = ok && absl::SimpleAtoi(piece, &id);
        ids.push_back(id);
      }
    } else if (arg == "--greedy") {
      ok = absl::SimpleAtoi(v, &greedy) && greedy >= 0;
    } else if (arg == "--draft") {
      ok = absl::SimpleAtoi(v, &draft) && draft >= 0;
    } else if (arg == "--threads") {
      ok = absl::SimpleAtoi(v, &threads) && threads >= 0;
    } else {
      std::fprintf(stderr, "tandem logits: unknown flag '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "tandem logits: %s '%s' is not valid\n", arg.c_str(), v.c_str());
      return 2;
    }
  }
  if (model_path.empty() || ids.empty() || (draft > 0 && draft_out.empty())) {
    std::fprintf(stderr, "tandem logits: --model, --ids (and --draft-out with --draft) are required\n%s",
                 kUsage);
    return 2;
  }
  ReferenceModelOptions options;
  options.threads = static_cast<int>(threads);
  absl::StatusOr<std::unique_ptr<ReferenceModel>> model = ReferenceModel::Open(model_path, options);
  if (!model.ok()) return Fail(model.status());
  const int64_t V = (*model)->config().vocab, T = static_cast<int64_t>(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= V) return Fail(absl::InvalidArgumentError(absl::StrCat("id ", id, " is outside [0, ", V, ")")));
  }

  absl::StatusOr<std::unique_ptr<SequenceState>> seq = (*model)->NewSequence();
  if (!seq.ok()) return Fail(seq.status());
  std::vector<float> logits(T * V);
  ReferenceModel::Step step{seq->get(), ids, logits.data(), true};
  if (absl::Status s = (*model)->Forward(std::span<ReferenceModel::Step>(&step, 1)); !s.ok()) return Fail(s);
  const int32_t next = Argmax(logits.data() + (T - 1) * V, V);
  std::vector<int32_t> generated;
  if (greedy > 0) generated.push_back(next);
  std::vector<float> row(V);
  for (int64_t j = 1; j < greedy; ++j) {
    const int32_t token = generated.back();
    ReferenceModel::Step s1{seq->get(), std::span<const int32_t>(&token, 1), row.data(), false};
    if (absl::Status s = (*model)->Forward(std::span<ReferenceModel::Step>(&s1, 1)); !s.ok()) return Fail(s);
    logits.insert(logits.end(), row.begin(), row.end());
    generated.push_back(Argmax(row.data(), V));
  }
  if (!out.empty() && !WriteRows(out, logits)) return 1;

  std::vector<int32_t> drafts;
  if (draft > 0) {
    absl::StatusOr<std::unique_ptr<SequenceState>> dseq = (*model)->NewSequence();
    if (!dseq.ok()) return Fail(dseq.status());
    ReferenceModel::Step s2{dseq->get(), ids, nullptr, false};
    if (absl::Status s = (*model)->Forward(std::span<ReferenceModel::Step>(&s2, 1)); !s.ok()) return Fail(s);
    std::vector<float> draft_logits;
    absl::StatusOr<std::vector<int32_t>> d =
        (*model)->DraftGreedy(dseq->get(), next, static_cast<int>(draft), &draft_logits);
    if (!d.ok()) return Fail(d.status());
    drafts = *d;
    if (!WriteRows(draft_out, draft_logits)) return 1;
  }
  std::printf("{\"positions\":%lld,\"vocab\":%lld,\"greedy\":[%s],\"draft_next\":%d,\"draft\":[%s]}\n",
              static_cast<long long>(T), static_cast<long long>(V),
              absl::StrJoin(generated, ",").c_str(), next, absl::StrJoin(drafts, ",").c_str());
  return 0;
}

}  // namespace tandem
