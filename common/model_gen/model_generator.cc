#include "common/model_gen/model_generator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_writer.h"
#include "common/model_gen/model_metadata.h"
#include "common/model_gen/model_plan.h"
#include "common/model_gen/tensor_fill.h"
#include "common/tokenizer/small_tokenizer.h"
#include "common/unique_fd.h"

namespace tandem {
namespace {

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Deletes the file at `path` unless released: a failed generation leaves nothing behind.
class RemoveUnlessKept {
 public:
  explicit RemoveUnlessKept(std::string path) : path_(std::move(path)) {}
  ~RemoveUnlessKept() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  void Keep() { path_.clear(); }

 private:
  std::string path_;
};

// Tensors drawn from floats and quantized (the vocabulary matrices above all) cost far more per
// byte than directly drawn expert blocks: start them first so that they do not form the tail.
std::vector<const PlannedTensor*> FillOrder(const std::vector<PlannedTensor>& plan) {
  std::vector<const PlannedTensor*> order;
  for (const PlannedTensor& t : plan) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const PlannedTensor* a, const PlannedTensor* b) {
    const double ca = static_cast<double>(a->n_bytes) * (a->direct_quant ? 1.0 : 16.0);
    const double cb = static_cast<double>(b->n_bytes) * (b->direct_quant ? 1.0 : 16.0);
    return ca > cb;
  });
  return order;
}

}  // namespace

absl::Status GenerateModel(const GenModelSpec& spec, const std::string& path,
                           const GenProgressFn& progress, int threads) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<PlannedTensor>> plan = PlanTensors(spec);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<TokenizerSpec> tokenizer = MakeSmallByteLevelTokenizer(static_cast<int>(spec.vocab));
  if (!tokenizer.ok()) return tokenizer.status();

  // 1. The layout: header, then every tensor as a hole (no bytes written), renamed to `filling`.
  const std::string filling = path + ".filling";
  uint64_t data_offset = 0;
  std::vector<uint64_t> offsets;  // per planned tensor, from the start of the file
  {
    absl::StatusOr<std::unique_ptr<GgufWriter>> writer = GgufWriter::Create(filling);
    if (!writer.ok()) return writer.status();
    GgufWriter& w = **writer;
    for (auto& [key, value] : BuildModelMetadata(spec, *tokenizer)) {
      if (absl::Status s = w.AddMetadata(key, std::move(value)); !s.ok()) return s;
    }
    tokenizer->tokens.clear();  // the header holds its own copy now
    tokenizer->merges.clear();
    for (const PlannedTensor& t : *plan) {
      if (absl::Status s = w.AddTensor(t.name, t.ggml_type, absl::MakeConstSpan(t.ne)); !s.ok()) {
        return s;
      }
    }
    for (const PlannedTensor& t : *plan) {
      if (absl::Status s = w.WriteTensorZeros(t.name, t.n_bytes); !s.ok()) return s;
    }
    if (absl::Status s = w.Finish(); !s.ok()) return s;
    data_offset = w.data_offset();
    for (const PlannedTensor& t : *plan) {
      absl::StatusOr<uint64_t> off = w.TensorOffset(t.name);
      if (!off.ok()) return off.status();
      offsets.push_back(data_offset + *off);
    }
  }
  RemoveUnlessKept cleanup(filling);
  UniqueFd fd(open(filling.c_str(), O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("cannot open", filling);

  // 2. The tensors, `threads` at a time, each written at its offset.
  GenProgress p;
  for (const PlannedTensor& t : *plan) p.total_bytes += t.n_bytes;
  auto seconds = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::vector<const PlannedTensor*> order = FillOrder(*plan);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;  // guards first_error, p and the progress calls
  absl::Status first_error;
  auto fail = [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(s);
    failed = true;
  };
  auto worker = [&] {
    for (size_t i = next++; i < order.size() && !failed; i = next++) {
      const PlannedTensor& t = *order[i];
      uint64_t off = offsets[static_cast<size_t>(&t - plan->data())];
      uint64_t tensor_written = 0;
      absl::Status s = FillTensor(spec, t, [&](absl::Span<const uint8_t> piece) -> absl::Status {
        if (failed) return absl::CancelledError("another tensor failed");
        size_t done = 0;
        while (done < piece.size()) {
          const ssize_t n = pwrite(fd.get(), piece.data() + done, piece.size() - done,
                                   static_cast<off_t>(off + done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return ErrnoError(absl::StrCat("cannot write tensor '", t.name, "' to"), filling);
          done += static_cast<size_t>(n);
        }
        off += piece.size();
        tensor_written += piece.size();
        std::lock_guard<std::mutex> lock(mu);
        p.bytes_written += piece.size();
        if (progress) {
          p.seconds = seconds();
          p.tensor = t.name;
          progress(p);
        }
        return absl::OkStatus();
      });
      if (s.ok() && tensor_written != t.n_bytes) {
        s = absl::InternalError(absl::StrCat("tensor '", t.name, "': generated ", tensor_written,
                                             " bytes, planned ", t.n_bytes));
      }
      if (!s.ok() && !absl::IsCancelled(s)) fail(std::move(s));
    }
  };
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), order.size()));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (!first_error.ok()) return first_error;
  if (close(fd.release()) != 0) return ErrnoError("cannot close", filling);
  if (rename(filling.c_str(), path.c_str()) != 0) return ErrnoError("cannot rename to", path);
  cleanup.Keep();
  if (progress) {
    p.seconds = seconds();
    p.tensor = {};
    p.done = true;
    progress(p);
  }
  return absl::OkStatus();
}

}  // namespace tandem
