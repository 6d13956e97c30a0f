// Shared pieces of gpu_moe_bench's translation units: the 80B MoE shapes, random expert layers
// and picks, event timing. Not a test.
#ifndef TANDEM_TESTS_GPU_MOE_MOE_BENCH_UTIL_H_
#define TANDEM_TESTS_GPU_MOE_MOE_BENCH_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/expert_unit.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu/bench_util.h"

namespace tandem::cuda::moe_bench {

constexpr int64_t kH = 2048, kI = 512, kE = 512, kK = 10;

// Random bytes with every f16 scale field finite: the generator only draws bytes below 0x78 in
// odd positions, so no f16 read from the block has an all-ones exponent.
inline void FillRandom(void* dst, size_t bytes, std::mt19937& rng) {
  std::vector<uint8_t> host(std::min<size_t>(bytes, size_t{64} << 20));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(rng() % (i % 2 ? 0x78 : 0x100));
  for (size_t off = 0; off < bytes; off += host.size()) {
    BENCH_CHECK(cudaMemcpy(static_cast<uint8_t*>(dst) + off, host.data(), std::min(host.size(), bytes - off),
                           cudaMemcpyHostToDevice));
  }
}

using Timer = bench::EventTimer;
using bench::Median;

struct Layer {
  void* gate;
  void* up;
  void* down;
  int64_t gate_row_bytes, down_row_bytes;
  ExpertLocation Expert(int64_t e) const {
    return {static_cast<uint8_t*>(gate) + e * kI * gate_row_bytes, static_cast<uint8_t*>(up) + e * kI * gate_row_bytes,
            static_cast<uint8_t*>(down) + e * kH * down_row_bytes};
  }
};

inline int64_t RowBytesOf(uint32_t type, int64_t cols) {
  switch (type) {
    case kTypeQ4_K: return cols / 256 * 144;
    case kTypeQ2_K: return cols / 256 * 84;
    case kTypeQ6_K: return cols / 256 * 210;
    case kTypeQ8_0: return cols / 32 * 34;
    default: return 0;
  }
}

// A layer of kE experts of the given gate/up and down types, random bytes (cudaFree its three
// arrays when done).
inline Layer RandomLayer(uint32_t gate_up_type, uint32_t down_type, std::mt19937& rng) {
  Layer layer{};
  layer.gate_row_bytes = RowBytesOf(gate_up_type, kH);
  layer.down_row_bytes = RowBytesOf(down_type, kI);
  const size_t gbytes = static_cast<size_t>(kE * kI * layer.gate_row_bytes);
  const size_t dbytes = static_cast<size_t>(kE * kH * layer.down_row_bytes);
  BENCH_CHECK(cudaMalloc(&layer.gate, gbytes));
  BENCH_CHECK(cudaMalloc(&layer.up, gbytes));
  BENCH_CHECK(cudaMalloc(&layer.down, dbytes));
  FillRandom(layer.gate, gbytes, rng);
  FillRandom(layer.up, gbytes, rng);
  FillRandom(layer.down, dbytes, rng);
  return layer;
}

inline std::vector<int32_t> RandomPicks(std::mt19937& rng, int64_t n) {
  std::vector<int32_t> picks, ids(kE);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t e = 0; e < kE; ++e) ids[e] = e;
    for (int64_t k = 0; k < kK; ++k) std::swap(ids[k], ids[k + rng() % (kE - k)]);
    picks.insert(picks.end(), ids.begin(), ids.begin() + kK);
  }
  return picks;
}

// The layer's kE expert locations in device memory (cudaFree when done).
inline ExpertLocation* UploadTable(const Layer& layer) {
  std::vector<ExpertLocation> host(kE);
  for (int64_t e = 0; e < kE; ++e) host[e] = layer.Expert(e);
  ExpertLocation* table;
  BENCH_CHECK(cudaMalloc(&table, kE * sizeof(ExpertLocation)));
  BENCH_CHECK(cudaMemcpy(table, host.data(), kE * sizeof(ExpertLocation), cudaMemcpyHostToDevice));
  return table;
}

// The one-token kernels' arguments at the 80B shapes (kE, kK, kH, kI) over a benchmark's buffers:
// picks holds the K expert ids then the K weights, ints[1] is the error flag.
inline OneTokenMoeArgs OneTokenBenchArgs(const float* logits, const ExpertLocation* table, const float* x, float* act,
                                         int32_t* picks, int* ints, const float* shared, const float* gate_logit,
                                         float* y) {
  OneTokenMoeArgs o;
  o.logits = logits;
  o.E = kE;
  o.K = kK;
  o.table = table;
  o.h = kH;
  o.inner = kI;
  o.x = x;
  o.act = act;
  o.experts_out = picks;
  o.weights_out = reinterpret_cast<float*>(picks + kK);
  o.error = ints + 1;
  o.shared = shared;
  o.shared_gate_logit = gate_logit;
  o.y = y;
  return o;
}

// The routing and one-token chain benchmarks (moe_chain_bench.cc), and the one-token chain's
// phase stamps (one_token_probe_bench.cc).
void BenchRouting(const float* x, std::mt19937& rng);
void BenchOneToken(const float* x, std::mt19937& rng);
void BenchOneTokenProbe(const float* x, std::mt19937& rng);
// pick_bench.cu (--pick): the fused kernel's logit reads and picks alone, at 384 / 48 / 1 readers.
void BenchPick();

}  // namespace tandem::cuda::moe_bench

#endif  // TANDEM_TESTS_GPU_MOE_MOE_BENCH_UTIL_H_
