#include "gpu_service/backend/remote_experts_spec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem {

std::string RemoteWorkerSpec::share_text() const {
  return absl::StrCat(share_index, "/", share_count);
}

absl::StatusOr<RemoteWorkerSpec> ParseRemoteWorkerSpec(const std::string& text, bool spawn,
                                                       const std::string& flag) {
  RemoteWorkerSpec spec;
  spec.spawn = spawn;
  spec.text = text;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", text, "': ", why));
  };
  // Items; one without '=' continues the previous value (CPU lists hold commas).
  std::vector<std::pair<std::string, std::string>> items;
  if (!text.empty()) {
    for (const std::string& item : std::vector<std::string>(absl::StrSplit(text, ','))) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos) {
        if (items.empty()) return bad(absl::StrCat("item '", item, "' is not key=value"));
        absl::StrAppend(&items.back().second, ",", item);
        continue;
      }
      items.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  }
  std::vector<std::string> seen;
  for (const auto& [key, value] : items) {
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return bad(absl::StrCat("key '", key, "' is given twice"));
    }
    seen.push_back(key);
    if (key == "share") {
      const std::vector<std::string> kn = absl::StrSplit(value, '/');
      if (kn.size() != 2 || !absl::SimpleAtoi(kn[0], &spec.share_index) ||
          !absl::SimpleAtoi(kn[1], &spec.share_count) || spec.share_count < 1 ||
          spec.share_index < 0 || spec.share_index >= spec.share_count) {
        return bad(absl::StrCat("share '", value, "' must be K/N with 0 <= K < N"));
      }
      spec.share_given = true;
      continue;
    }
    if (!spawn) {
      return bad(absl::StrCat("key '", key,
                              "' is not accepted: give only share=K/N; binding flags go on the "
                              "hand-started worker's command line"));
    }
    if (key == "numa") {
      if (!absl::SimpleAtoi(value, &spec.numa_node) || spec.numa_node < 0) {
        return bad(absl::StrCat("numa '", value, "' must be a node number >= 0"));
      }
    } else if (key == "cpus") {
      if (value.empty() || value.find_first_not_of("0123456789-,") != std::string::npos) {
        return bad(absl::StrCat("cpus '", value, "' must be a CPU list such as 0-7 or 0-3,8-11"));
      }
      spec.cpus = value;
    } else if (key == "threads") {
      if (!absl::SimpleAtoi(value, &spec.threads) || spec.threads < 1) {
        return bad(absl::StrCat("threads '", value, "' must be a number >= 1"));
      }
    } else if (key == "isa") {
      if (value != "auto" && value != "scalar" && value != "avx2" && value != "avx512vnni") {
        return bad(absl::StrCat("isa '", value, "' must be auto, scalar, avx2 or avx512vnni"));
      }
      spec.isa = value;
    } else {
      return bad(absl::StrCat("unknown key '", key, "' (known: share, numa, cpus, threads, isa)"));
    }
  }
  return spec;
}

absl::StatusOr<std::vector<RemoteWorkerSpec>> OrderWorkerShares(
    std::vector<RemoteWorkerSpec> specs) {
  const int n = static_cast<int>(specs.size());
  if (n == 1 && !specs[0].share_given) return specs;  // 0/1
  std::vector<bool> taken(static_cast<size_t>(n), false);
  for (const RemoteWorkerSpec& s : specs) {
    const std::string flag = s.spawn ? "--worker" : "--connect-worker";
    if (!s.share_given) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " '", s.text, "': with ", n, " workers every spec needs share=K/", n));
    }
    if (s.share_count != n) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", s.text, "': share ",
                                                     s.share_text(), " is a share of ",
                                                     s.share_count, " but ", n,
                                                     " workers are given"));
    }
    if (taken[static_cast<size_t>(s.share_index)]) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", s.text, "': share ",
                                                     s.share_text(), " is given twice"));
    }
    taken[static_cast<size_t>(s.share_index)] = true;
  }
  std::sort(specs.begin(), specs.end(), [](const RemoteWorkerSpec& a, const RemoteWorkerSpec& b) {
    return a.share_index < b.share_index;
  });
  return specs;
}

std::vector<std::string> WorkerArguments(const RemoteWorkerSpec& spec, const std::string& model,
                                         bool exact) {
  std::vector<std::string> args = {absl::StrCat("--model=", model),
                                   absl::StrCat("--share=", spec.share_text())};
  if (spec.numa_node >= 0) args.push_back(absl::StrCat("--numa-node=", spec.numa_node));
  if (!spec.cpus.empty()) args.push_back(absl::StrCat("--cpus=", spec.cpus));
  if (spec.threads > 0) args.push_back(absl::StrCat("--threads=", spec.threads));
  if (!spec.isa.empty()) args.push_back(absl::StrCat("--isa=", spec.isa));
  if (exact) args.push_back("--exact");
  return args;
}

}  // namespace tandem
