// Study (not a test): how well can a layer's routed-expert picks be known before its MoE input
// exists? A decode step's fused MoE kernel spends ~7 us of its ~17 us routing before it asks for a
// single expert row (docs/PERF.md); a prediction made a layer earlier would let it ask for the
// predicted experts' rows at once. The layer's time is its slowest pick, so what matters is how
// often a predicted set of M experts holds all K true picks.
//
// Runs the CPU reference over a random prompt and greedy decode, records every layer's MoE input x
// and picks, and scores these predictors of layer L's picks for each token:
//   same    layer L's router on x_L itself (must be exact: checks the plumbing);
//   prev    layer L's router on x_{L-1} (the previous layer's MoE input, a layer ahead);
//   prev_g  the same with x_{L-1}'s norm weights swapped for layer L's (x / γ_{L-1} · γ_L);
//   prev2   layer L's router on x_{L-2} (two layers ahead);
//   resid   layer L's router on γ_L ⊙ H_L, H_L the residual before layer L's mixer output (what the
//           ffn norm's route blocks hold before their PDL wait; the norm's scale does not change
//           the ranking);
//   last    the previous token's picks at layer L (decode tokens only), M = K.
//
//   routing_prediction_study --model=q3n-8l.gguf [--prompt_tokens=32] [--decode_tokens=32]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/model/reference_model.h"
#include "common/model/sampler.h"
#include "common/reference/moe.h"
#include "common/reference/ops.h"
#include "common/reference/weight_view.h"

ABSL_FLAG(std::string, model, "", "a qwen3next or qwen4exp GGUF (one stream)");
ABSL_FLAG(int, prompt_tokens, 32, "random prompt length");
ABSL_FLAG(int, decode_tokens, 32, "greedy decode steps after the prompt");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(uint64_t, seed, 1, "prompt seed");

namespace tandem {
namespace {

// Records each call's MoE input rows, then computes the experts as the reference does.
class CapturingExecutor : public ExpertExecutor {
 public:
  CapturingExecutor(const MoeWeights& w, ThreadPool* pool, std::vector<float>* x_rows)
      : inner_(w, pool), x_rows_(x_rows) {}
  absl::Status Run(std::span<const ExpertWork> work, const float* x, int64_t h,
                   float* out) override {
    int64_t n = 0;
    for (const ExpertWork& w : work) n = std::max<int64_t>(n, w.token + 1);
    x_rows_->assign(x, x + n * h);
    return inner_.Run(work, x, h, out);
  }

 private:
  ReferenceExpertExecutor inner_;
  std::vector<float>* x_rows_;
};

std::vector<int32_t> TopM(const std::vector<float>& router, int64_t E, int64_t h, const float* x,
                          int64_t m) {
  std::vector<std::pair<float, int32_t>> logits(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    logits[static_cast<size_t>(e)] = {Dot(router.data() + e * h, x, h), static_cast<int32_t>(e)};
  }
  std::partial_sort(logits.begin(), logits.begin() + m, logits.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<int32_t> out;
  for (int64_t i = 0; i < m; ++i) out.push_back(logits[static_cast<size_t>(i)].second);
  return out;
}

struct Score {
  double covered = 0;  // Σ |truth ∩ predicted| / K
  int64_t whole = 0;   // cases where every true pick was predicted
  int64_t cases = 0;
  void Add(std::span<const int32_t> truth, const std::vector<int32_t>& predicted) {
    const std::set<int32_t> p(predicted.begin(), predicted.end());
    int64_t hit = 0;
    for (int32_t e : truth) hit += p.count(e);
    covered += static_cast<double>(hit) / static_cast<double>(truth.size());
    whole += hit == static_cast<int64_t>(truth.size()) ? 1 : 0;
    ++cases;
  }
};

int Run() {
  ReferenceModelOptions options;
  options.threads = absl::GetFlag(FLAGS_threads);
  auto model = ReferenceModel::Open(absl::GetFlag(FLAGS_model), options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  ReferenceModel& m = **model;
  const ModelConfig& c = m.config();
  if (c.n_streams != 1) {
    std::fprintf(stderr, "one stream only (this model has %lld)\n", static_cast<long long>(c.n_streams));
    return 1;
  }
  const int64_t h = c.h, L = c.n_layers, E = c.moe.E, K = c.moe.K;
  std::vector<std::vector<float>> routers(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const MatrixView& r = m.weights().layers[static_cast<size_t>(l)].moe.router;
    routers[static_cast<size_t>(l)].resize(static_cast<size_t>(E * h));
    for (int64_t e = 0; e < E; ++e) DequantizeMatrixRow(r, e, routers[static_cast<size_t>(l)].data() + e * h);
  }
  std::vector<std::vector<float>> x(static_cast<size_t>(L));
  std::vector<std::unique_ptr<CapturingExecutor>> executors;
  for (int64_t l = 0; l < L; ++l) {
    executors.push_back(std::make_unique<CapturingExecutor>(m.weights().layers[static_cast<size_t>(l)].moe,
                                                            m.threads(), &x[static_cast<size_t>(l)]));
  }
  ReferenceModel::ForwardOptions fo;
  fo.experts = [&](int64_t l) -> ExpertExecutor* { return executors[static_cast<size_t>(l)].get(); };
  std::vector<MoeRouting> routing(static_cast<size_t>(L));
  fo.routing = &routing;

  // K + 3: at the 80B shapes, the most pick groups the fused MoE kernel could run in one wave (the
  // forty-fifth session's prediction, removed: docs/PERF.md).
  const std::vector<int64_t> ms = {K, K + 3, K + K / 2, 2 * K, 3 * K, 5 * K};
  // Each predictor's scores, one per M.
  std::vector<Score> same(ms.size()), prev = same, prev_g = same, prev2 = same, resid = same;
  std::vector<std::vector<float>> block_inputs(static_cast<size_t>(L));
  fo.block_inputs = &block_inputs;
  // `prev` at M = 2K, by layer (does depth change it?).
  std::vector<Score> prev_by_layer(static_cast<size_t>(L)), resid_by_layer(static_cast<size_t>(L));
  Score last;

  auto seq = m.NewSequence();
  if (!seq.ok()) return 1;
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::vector<int32_t> tokens(static_cast<size_t>(absl::GetFlag(FLAGS_prompt_tokens)));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab));
  std::vector<float> logits(static_cast<size_t>(c.vocab));
  std::vector<std::vector<int32_t>> last_picks(static_cast<size_t>(L));
  const int steps = 1 + absl::GetFlag(FLAGS_decode_tokens);
  for (int s = 0; s < steps; ++s) {
    ReferenceModel::Step step{seq->get(), tokens, logits.data(), false};
    if (absl::Status st = m.Forward(std::span(&step, 1), fo); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return 1;
    }
    const int64_t T = static_cast<int64_t>(tokens.size());
    for (int64_t l = 0; l < L; ++l) {
      const std::vector<int32_t>& picks = routing[static_cast<size_t>(l)].experts;
      for (int64_t t = 0; t < T; ++t) {
        std::span<const int32_t> truth(picks.data() + t * K, static_cast<size_t>(K));
        const float* xl = x[static_cast<size_t>(l)].data() + t * h;
        for (size_t i = 0; i < ms.size(); ++i) {
          same[i].Add(truth, TopM(routers[static_cast<size_t>(l)], E, h, xl, ms[i]));
        }
        if (l > 0) {
          const float* xp = x[static_cast<size_t>(l - 1)].data() + t * h;
          std::vector<float> xg(xp, xp + h);
          const VectorView g_prev = m.weights().layers[static_cast<size_t>(l - 1)].ffn_read.norm;
          const VectorView g_this = m.weights().layers[static_cast<size_t>(l)].ffn_read.norm;
          for (int64_t j = 0; j < h; ++j) {
            xg[static_cast<size_t>(j)] = g_prev[static_cast<size_t>(j)] != 0
                ? xp[j] / g_prev[static_cast<size_t>(j)] * g_this[static_cast<size_t>(j)] : 0.0f;
          }
          for (size_t i = 0; i < ms.size(); ++i) {
            const std::vector<int32_t> predicted = TopM(routers[static_cast<size_t>(l)], E, h, xp, ms[i]);
            prev[i].Add(truth, predicted);
            if (ms[i] == 2 * K) prev_by_layer[static_cast<size_t>(l)].Add(truth, predicted);
            prev_g[i].Add(truth, TopM(routers[static_cast<size_t>(l)], E, h, xg.data(), ms[i]));
          }
        }
        {
          const float* hl = block_inputs[static_cast<size_t>(l)].data() + t * h;
          const VectorView g = m.weights().layers[static_cast<size_t>(l)].ffn_read.norm;
          std::vector<float> u(static_cast<size_t>(h));
          for (int64_t j = 0; j < h; ++j) u[static_cast<size_t>(j)] = g[static_cast<size_t>(j)] * hl[j];
          for (size_t i = 0; i < ms.size(); ++i) {
            const std::vector<int32_t> predicted = TopM(routers[static_cast<size_t>(l)], E, h, u.data(), ms[i]);
            resid[i].Add(truth, predicted);
            if (ms[i] == 2 * K) resid_by_layer[static_cast<size_t>(l)].Add(truth, predicted);
          }
        }
        if (l > 1) {
          const float* xp2 = x[static_cast<size_t>(l - 2)].data() + t * h;
          for (size_t i = 0; i < ms.size(); ++i) {
            prev2[i].Add(truth, TopM(routers[static_cast<size_t>(l)], E, h, xp2, ms[i]));
          }
        }
        if (s > 0 && !last_picks[static_cast<size_t>(l)].empty()) last.Add(truth, last_picks[static_cast<size_t>(l)]);
        if (t == T - 1) last_picks[static_cast<size_t>(l)].assign(truth.begin(), truth.end());
      }
    }
    tokens = {Argmax(logits)};
  }
  std::printf("model %s: %lld layers, E %lld, K %lld; %d prompt + %d decode tokens\n",
              absl::GetFlag(FLAGS_model).c_str(), static_cast<long long>(L), static_cast<long long>(E),
              static_cast<long long>(K), absl::GetFlag(FLAGS_prompt_tokens), absl::GetFlag(FLAGS_decode_tokens));
  std::printf("%-8s %4s %12s %14s %8s\n", "predictor", "M", "picks found", "all K found", "cases");
  auto line = [](const char* name, int64_t m, const Score& sc) {
    std::printf("%-8s %4lld %11.1f%% %13.1f%% %8lld\n", name, static_cast<long long>(m),
                100.0 * sc.covered / std::max<int64_t>(sc.cases, 1),
                100.0 * static_cast<double>(sc.whole) / std::max<int64_t>(sc.cases, 1),
                static_cast<long long>(sc.cases));
  };
  auto print = [&](const char* name, const std::vector<Score>& row) {
    for (size_t i = 0; i < ms.size(); ++i) line(name, ms[i], row[i]);
  };
  print("same", same);
  print("prev", prev);
  print("prev_g", prev_g);
  print("prev2", prev2);
  print("resid", resid);
  line("last", K, last);
  // A predictor's scores at M = 2K by layer, from the first layer it predicts.
  auto by_layer = [&](const char* name, const std::vector<Score>& scores, int64_t first) {
    std::printf("%s at M = %lld by layer:\n", name, static_cast<long long>(2 * K));
    for (int64_t l = first; l < L; ++l) {
      const std::string layer = absl::StrFormat("layer %lld", static_cast<long long>(l));
      line(layer.c_str(), 2 * K, scores[static_cast<size_t>(l)]);
    }
  };
  by_layer("prev", prev_by_layer, 1);
  by_layer("resid", resid_by_layer, 0);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
