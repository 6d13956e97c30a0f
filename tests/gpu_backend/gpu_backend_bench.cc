// The CUDA backend's end-to-end speed on a real-sized model (not a test: timing never decides a
// test), measured the way llama-bench measures: decode (tg) of `--decode-steps` tokens per sequence
// from an almost empty context at each batch size, and prefill (pp) of one prompt of each length in
// one step. Every figure is printed beside its floor from the same run:
//   decode:  bytes a step must read (every non-expert matrix, the distinct routed experts the
//            step's picks name, the shared experts, the LM head, the GDN state read and written,
//            the KV cache read) over the HBM read bandwidth measured here;
//   prefill: the larger of those bytes over the bandwidth, and the step's matrix FLOPs (2 per
//            weight per token, routed experts K per token, causal attention 4·n²/2·nh·hd per
//            attention layer) over the bf16 cuBLAS GEMM rate measured here.
// Then one profiled step of each kind (the per-stage breakdown of CudaBackendOptions::profile).
//
//   gpu_backend_bench --model q3n-80b.gguf [--mode fast|exact] [--batches 1,8,32]
//                     [--prefill 512,2048,8192] [--decode-steps 128] [--dense split|single] [--pdl on|off]
//                     [--l2-prefetch 0|1|2] [--nvtx] [--probe-step] [--json out.json]
// --probe-step (--probe-gdn-product, its older name, is still taken): the GDN layers' input product
// and fused kernel, every layer's fused MoE kernel and every attention layer's split attention and
// output product, stamped inside a batch-1 step (step_probe.h, step_probe_report.h,
// kernels/gdn_decode_out_probe.h, moe/expert_decode_fused_probe.h, kernels/attention_probe.h,
// kernels/dense_colsplit_probe.h; the whole run takes the stamped kernels).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/gguf/gguf_file.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/moe/route_plan_grid.cuh"
#include "gpu_service/backends/cuda/step_probe.h"
#include "tests/gpu_backend/bench_args.h"
#include "tests/gpu_backend/bench_ceilings.h"
#include "tests/gpu_backend/step_probe_report.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model;
  std::string mode = "fast";
  std::vector<int> batches = {1, 8, 32};
  std::vector<int> prefill = {512, 2048, 8192};
  int decode_steps = 128;
  std::string json;
  bool dense_split = false;  // fast mode's dense products split (hi/lo f16 triples or f16 + fp8); the default: one f16 product
  bool pdl = true;          // programmatic dependent launch (the default)
  int l2_prefetch = -1;     // CudaBackendOptions::l2_prefetch (-1: the backend's default)
  bool nvtx = false;        // one more decode / prefill step each inside an NVTX range (profile_80b.sh)
  // Prefill A/B of the MoE stage's planning (moe_stage.h), in this order: "device" (the default),
  // "host" (HostPrefillPlan: the units back to the host once per layer), "oldplan" (the device
  // plan with the old route-and-plan kernel and tile builder instead of the grid kernel,
  // route_plan_grid.cuh: TANDEM_OLD_PREFILL_PLAN).
  std::vector<std::string> prefill_plans;
  // The GDN, MoE and attention kernels stamped inside one batch-1 decode step (step_probe.h,
  // step_probe_report.h).
  bool probe_step = false;
};

// A flag with two values: out = (v == yes); false (after saying so) for anything else.
bool ParseInts(const std::string& v, std::vector<int>& out) {
  out.clear();
  for (absl::string_view p : absl::StrSplit(v, ',')) {
    int x;
    if (!absl::SimpleAtoi(p, &x) || x < 1) return false;
    out.push_back(x);
  }
  return !out.empty();
}

// What one step reads and computes, from the file's tensor list.
struct ModelBytes {
  uint64_t dense = 0;          // every matrix of the main layers but the routed experts, plus the head
  uint64_t dense_params = 0;   // their weights (the head counted once per token whose logits are wanted)
  uint64_t head_params = 0;
  std::vector<uint64_t> expert_bytes;   // per layer: one routed expert's three matrices
  std::vector<uint64_t> expert_params;  // per layer: one routed expert's weights
};

ModelBytes CountModelBytes(const GgufFile& f, const ModelConfig& c) {
  ModelBytes m;
  m.expert_bytes.assign(static_cast<size_t>(c.n_layers), 0);
  m.expert_params.assign(static_cast<size_t>(c.n_layers), 0);
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.n_dims < 2) continue;  // norms and vectors: negligible
    if (t.name == "token_embd.weight") continue;  // one row per token is read
    if (t.name == "output.weight") {
      m.dense += t.n_bytes;
      m.head_params = static_cast<uint64_t>(t.n_elements);
      continue;
    }
    int layer = -1;
    if (std::sscanf(t.name.c_str(), "blk.%d.", &layer) != 1 || layer >= c.n_layers) continue;  // MTP
    if (t.name.find("_exps") != std::string::npos) {
      m.expert_bytes[layer] += t.n_bytes / static_cast<uint64_t>(c.moe.E);
      m.expert_params[layer] += static_cast<uint64_t>(t.n_elements / c.moe.E);
    } else {
      m.dense += t.n_bytes;
      m.dense_params += static_cast<uint64_t>(t.n_elements);
    }
  }
  return m;
}

// Bytes of recurrent state and KV a step reads (GDN S read and written, KV read) for `seqs`
// sequences at context `ctx`.
uint64_t StateBytes(const ModelConfig& c, int64_t seqs, int64_t ctx) {
  uint64_t b = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.is_gdn(l)) {
      b += 2ull * c.gdn.nv * c.gdn.dk * c.gdn.dv * sizeof(float) * seqs;
    } else {
      b += 2ull * c.attn.kvh * c.attn.hd * sizeof(float) * ctx * seqs;
    }
  }
  return b;
}

uint64_t RoutedBytes(const ModelBytes& mb, const std::vector<MoeRouting>& routing) {
  uint64_t b = 0;
  for (size_t l = 0; l < routing.size() && l < mb.expert_bytes.size(); ++l) {
    const std::set<int32_t> distinct(routing[l].experts.begin(), routing[l].experts.end());
    b += distinct.size() * mb.expert_bytes[l];
  }
  return b;
}

double Seconds(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

struct Figures {
  std::vector<std::string> json;
  void Add(const std::string& kind, int size, double tok_s, double floor_tok_s, const std::string& extra) {
    json.push_back(absl::StrFormat("{\"kind\":\"%s\",\"size\":%d,\"tokens_per_s\":%.2f,\"floor_tokens_per_s\":%.2f,"
                                   "\"of_floor\":%.4f%s}",
                                   kind, size, tok_s, floor_tok_s, tok_s / floor_tok_s, extra));
  }
};

int Run(const Args& a) {
  // Ceilings first, before the model takes the memory.
  absl::StatusOr<double> bw = bench::MeasureHbmReadBandwidth(uint64_t{4} << 30, 5);
  absl::StatusOr<double> gemm = bench::MeasureBf16GemmRate(8192, 8192, 8192, 5);
  if (!bw.ok() || !gemm.ok()) {
    fprintf(stderr, "ceilings: %s %s\n", bw.status().ToString().c_str(), gemm.status().ToString().c_str());
    return 1;
  }
  printf("ceilings: HBM read %.0f GB/s, bf16 GEMM 8192^3 %.0f TFLOP/s\n", *bw / 1e9, *gemm / 1e12);

  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(a.model);
  if (!file.ok()) {
    fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  const int max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  const int max_prefill = *std::max_element(a.prefill.begin(), a.prefill.end());
  cuda::SetProbeDecodeStep(a.probe_step);  // before the decode graphs are captured
  CudaBackendOptions o;
  o.mode = a.mode == "exact" ? CudaMode::kExact : CudaMode::kFast;
  o.fast_dense_split = a.dense_split;
  o.pdl = a.pdl;
  if (a.l2_prefetch >= 0) o.l2_prefetch = a.l2_prefetch;
  o.max_batch_tokens = std::max(max_batch, max_prefill);
  o.max_sequences = max_batch + 1;
  o.max_context = max_prefill + a.decode_steps + 8;
  // Pages for the longest prompt plus every decoding sequence's context.
  o.kv_pages = (max_prefill + 63) / 64 + 1 + (max_batch + 1) * ((a.decode_steps + 8 + 63) / 64 + 1);
  const auto t_open = Clock::now();
  absl::StatusOr<std::unique_ptr<CudaBackend>> opened = CudaBackend::Open(a.model, o);
  if (!opened.ok()) {
    fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  CudaBackend& b = **opened;
  const ModelConfig& c = b.config();
  const ModelBytes mb = CountModelBytes(**file, c);
  printf("model: %s, %lld layers, E %lld K %lld; weights on the GPU %.2f GB (and their prefill copies %.2f GB), "
         "state+scratch %.2f GB; opened in %.1f s\n",
         c.name.c_str(), static_cast<long long>(c.n_layers), static_cast<long long>(c.moe.E),
         static_cast<long long>(c.moe.K), b.weight_bytes() / 1e9, b.prepared_weight_bytes() / 1e9,
         b.state_bytes() / 1e9, Seconds(t_open));
  printf("mode: %s%s%s%s\n", a.mode.c_str(), a.mode == "fast" ? (a.dense_split ? " (dense f16 hi/lo split)" : " (dense f16)") : "",
         b.dense_out_single() ? ", mixer output products (ssm_out, o) in one f16 product" : "", a.pdl ? "" : ", PDL off");
  if (a.l2_prefetch >= 0) printf("l2 prefetch: %d\n", a.l2_prefetch);
  printf("mixer input products: %s (widest stack %lld rows)\n",
         b.stacked_mixer_rows() > 0 ? "stacked" : "separate", static_cast<long long>(b.stacked_mixer_rows()));
  Figures fig;
  std::mt19937 rng(7);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab));
    return t;
  };
  // The logits in page-locked memory, as llama.cpp's output buffer is on a CUDA build (what
  // llama-bench times): the backend copies the head's rows straight into it.
  absl::StatusOr<cuda::PinnedBuffer> logits_buffer =
      cuda::PinnedBuffer::Allocate(static_cast<size_t>(max_batch) * c.vocab * sizeof(float));
  if (!logits_buffer.ok()) {
    fprintf(stderr, "logits: %s\n", logits_buffer.status().ToString().c_str());
    return 1;
  }
  float* const logits = logits_buffer->as<float>();

  // Decode at each batch size.
  for (int B : a.batches) {
    std::vector<SequenceSlot> slots;
    for (int i = 0; i < B; ++i) {
      absl::StatusOr<SequenceSlot> s = b.CreateSequence();
      if (!s.ok()) {
        fprintf(stderr, "%s\n", s.status().ToString().c_str());
        return 1;
      }
      slots.push_back(*s);
    }
    auto step = [&](std::vector<MoeRouting>* sink) -> absl::Status {
      const std::vector<int32_t> toks = random_tokens(B);
      std::vector<Backend::StepInput> in;
      for (int i = 0; i < B; ++i) {
        // Not rewindable, as the engine steps: no KeepFirst checkpoint copy.
        in.push_back({slots[i], std::span<const int32_t>(&toks[i], 1), logits + static_cast<size_t>(i) * c.vocab,
                      false, false});
      }
      b.set_routing_sink(sink);
      absl::Status s = b.Step(in);
      b.set_routing_sink(nullptr);
      return s;
    };
    for (int w = 0; w < 3; ++w) {  // warm-up (first-use costs, graph captures)
      if (absl::Status s = step(nullptr); !s.ok()) {
        fprintf(stderr, "decode: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const auto t0 = Clock::now();
    for (int i = 0; i < a.decode_steps; ++i) {
      if (absl::Status s = step(nullptr); !s.ok()) {
        fprintf(stderr, "decode: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const double secs = Seconds(t0);
    // The bytes of a step: a few more steps with the routing recorded.
    uint64_t routed = 0;
    const int probe = 4;
    for (int i = 0; i < probe; ++i) {
      std::vector<MoeRouting> routing;
      if (absl::Status s = step(&routing); !s.ok()) return 1;
      routed += RoutedBytes(mb, routing);
    }
    routed /= probe;
    const int64_t ctx = 3 + a.decode_steps + probe;
    const uint64_t bytes = mb.dense + routed + StateBytes(c, B, ctx / 2);
    const double floor_s = bytes / *bw;
    const double tok_s = B * a.decode_steps / secs;
    const double floor_tok_s = B / floor_s;
    printf("decode batch %2d: %8.1f tokens/s (%.3f ms/step); floor %.3f ms/step = %.1f tokens/s "
           "(%.2f GB/step: dense %.2f, routed %.2f); %.1f%% of the floor\n",
           B, tok_s, 1e3 * secs / a.decode_steps, 1e3 * floor_s, floor_tok_s, bytes / 1e9, mb.dense / 1e9,
           routed / 1e9, 100.0 * tok_s / floor_tok_s);
    fig.Add("decode", B, tok_s, floor_tok_s,
            absl::StrFormat(",\"ms_per_step\":%.4f,\"bytes_per_step\":%llu", 1e3 * secs / a.decode_steps,
                            static_cast<unsigned long long>(bytes)));
    if (a.nvtx) {  // One more step inside an NVTX range, for Nsight Compute (scripts/device/profile_80b.sh).
      const std::string range = absl::StrCat("decode_b", B);
      nvtxRangePushA(range.c_str());
      absl::Status s = step(nullptr);
      nvtxRangePop();
      if (!s.ok()) return 1;
    }
    if (a.probe_step && B == 1) {
      if (absl::Status s = ReportDecodeStepProbe([&] { return step(nullptr); }); !s.ok()) {
        fprintf(stderr, "probe: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    b.set_profile(true);
    if (absl::Status s = step(nullptr); !s.ok()) return 1;
    printf("  profile: %s\n", b.last_profile().c_str());
    b.set_profile(false);
    for (SequenceSlot s : slots) b.ReleaseSequence(s);
  }

  // Prefill of each length, one sequence, one step; with --prefill-plans, once per MoE planning
  // configuration in the given order (same process, same model).
  std::vector<std::string> plans = a.prefill_plans;
  if (plans.empty()) plans.push_back("");
  for (int n : a.prefill) {
    for (const std::string& plan : plans) {
      if (!plan.empty()) {
        cuda::SetHostPrefillPlan(plan == "host");
        cuda::SetRoutePlanGrid(plan != "oldplan");
      }
      const std::string label = plan.empty() ? "" : absl::StrCat(" [", plan, "]");
      double best = 1e30;
      std::vector<MoeRouting> routing;
      const int reps = n <= 2048 ? 3 : 2;
      for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
        absl::StatusOr<SequenceSlot> slot = b.CreateSequence();
        if (!slot.ok()) return 1;
        const std::vector<int32_t> prompt = random_tokens(n);
        Backend::StepInput in{*slot, prompt, logits, false, false};
        if (r == reps) b.set_routing_sink(&routing);
        const auto t0 = Clock::now();
        absl::Status s = b.Step(std::span<const Backend::StepInput>(&in, 1));
        const double secs = Seconds(t0);
        b.set_routing_sink(nullptr);
        b.ReleaseSequence(*slot);
        if (!s.ok()) {
          fprintf(stderr, "prefill %d: %s\n", n, s.ToString().c_str());
          return 1;
        }
        if (r > 0 && r < reps) best = std::min(best, secs);  // the recorded step (r == reps) is not timed
      }
      // The routed bytes and FLOPs of the recorded step.
      const uint64_t routed = RoutedBytes(mb, routing);
      const uint64_t bytes = mb.dense + routed + StateBytes(c, 1, n);
      double flops = 2.0 * n * static_cast<double>(mb.dense_params) + 2.0 * static_cast<double>(mb.head_params);
      for (int64_t l = 0; l < c.n_layers; ++l) {
        flops += 2.0 * n * c.moe.K * static_cast<double>(mb.expert_params[l]);
        if (!c.is_gdn(l)) flops += 4.0 * (static_cast<double>(n) * n / 2) * c.attn.nh * c.attn.hd;
      }
      const double floor_s = std::max(bytes / *bw, flops / *gemm);
      const double tok_s = n / best, floor_tok_s = n / floor_s;
      printf("prefill %5d%s: %8.1f tokens/s (%.1f ms); floor %.1f ms = %.0f tokens/s (bytes %.2f GB -> %.1f ms, "
             "%.1f TFLOP -> %.1f ms); %.1f%% of the floor\n",
             n, label.c_str(), tok_s, 1e3 * best, 1e3 * floor_s, floor_tok_s, bytes / 1e9, 1e3 * bytes / *bw, flops / 1e12,
             1e3 * flops / *gemm, 100.0 * tok_s / floor_tok_s);
      fig.Add("prefill", n, tok_s, floor_tok_s,
              absl::StrFormat(",\"ms\":%.3f,\"bytes\":%llu,\"flops\":%.4g", 1e3 * best,
                              static_cast<unsigned long long>(bytes), flops));
      b.set_profile(true);
      absl::StatusOr<SequenceSlot> slot = b.CreateSequence();
      if (!slot.ok()) return 1;
      const std::vector<int32_t> prompt = random_tokens(n);
      Backend::StepInput in{*slot, prompt, logits, false};
      if (absl::Status s = b.Step(std::span<const Backend::StepInput>(&in, 1)); !s.ok()) return 1;
      printf("  profile: %s\n", b.last_profile().c_str());
      b.set_profile(false);
      if (a.nvtx) {  // The same step without the profile's events, inside an NVTX range (profile_80b.sh).
        b.ReleaseSequence(*slot);
        slot = b.CreateSequence();
        if (!slot.ok()) return 1;
        in.slot = *slot;
        const std::string range = absl::StrCat("prefill_", n);
        nvtxRangePushA(range.c_str());
        absl::Status s = b.Step(std::span<const Backend::StepInput>(&in, 1));
        nvtxRangePop();
        if (!s.ok()) return 1;
      }
      b.ReleaseSequence(*slot);
    }
  }
  if (!a.prefill_plans.empty()) {
    cuda::SetHostPrefillPlan(false);
    cuda::SetRoutePlanGrid(true);
  }
  if (!a.json.empty()) {
    FILE* out = fopen(a.json.c_str(), "w");
    if (out == nullptr) {
      fprintf(stderr, "cannot write %s\n", a.json.c_str());
      return 1;
    }
    fprintf(out, "{\"hbm_read_bytes_per_s\":%.4g,\"bf16_gemm_flops_per_s\":%.4g,\"mode\":\"%s\",\"results\":[%s]}\n",
            *bw, *gemm, a.mode.c_str(), absl::StrJoin(fig.json, ",").c_str());
    fclose(out);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&] { return tandem::NextArgValue(argc, argv, i, arg); };
    if (arg == "--model") {
      a.model = value();
    } else if (arg == "--mode") {
      a.mode = value();
      if (a.mode != "fast" && a.mode != "exact") {
        fprintf(stderr, "--mode: '%s' is not fast or exact\n", a.mode.c_str());
        return 2;
      }
    } else if (arg == "--batches" || arg == "--prefill") {
      const std::string v = value();
      if (!tandem::ParseInts(v, arg == "--batches" ? a.batches : a.prefill)) {
        fprintf(stderr, "%s: '%s' is not a list of positive integers\n", arg.c_str(), v.c_str());
        return 2;
      }
    } else if (arg == "--decode-steps") {
      if (!absl::SimpleAtoi(value(), &a.decode_steps) || a.decode_steps < 1) {
        fprintf(stderr, "--decode-steps: not a positive integer\n");
        return 2;
      }
    } else if (arg == "--dense") {
      if (!tandem::ParseChoice(arg, value(), "split", "single", a.dense_split)) return 2;
    } else if (arg == "--pdl") {
      if (!tandem::ParseChoice(arg, value(), "on", "off", a.pdl)) return 2;
    } else if (arg == "--probe-step" || arg == "--probe-gdn-product") {
      a.probe_step = true;
    } else if (arg == "--nvtx") {
      a.nvtx = true;
    } else if (arg == "--l2-prefetch") {
      if (!absl::SimpleAtoi(value(), &a.l2_prefetch) || a.l2_prefetch < 0 || a.l2_prefetch > 2) {
        fprintf(stderr, "--l2-prefetch: not 0, 1 or 2\n");
        return 2;
      }
    } else if (arg == "--prefill-plans") {
      for (absl::string_view p : absl::StrSplit(value(), ',')) {
        if (p != "device" && p != "host" && p != "oldplan") {
          fprintf(stderr, "--prefill-plans: '%s' is not device, host or oldplan\n",
                  std::string(p).c_str());
          return 2;
        }
        a.prefill_plans.emplace_back(p);
      }
    } else if (arg == "--json") {
      a.json = value();
    } else {
      fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (a.model.empty()) {
    fprintf(stderr, "usage: gpu_backend_bench --model FILE.gguf [--mode fast|exact] [--batches 1,8,32] "
                    "[--prefill 512,2048,8192] [--decode-steps 128] [--dense split|single] [--pdl on|off] "
                    "[--l2-prefetch 0|1|2] [--nvtx] [--probe-step] [--prefill-plans device,host,oldplan] [--json out.json]\n");
    return 2;
  }
  return tandem::Run(a);
}
