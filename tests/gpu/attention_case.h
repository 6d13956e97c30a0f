// The planned attention tests' step (attention_fast_test.cc, attention_wgmma_test.cc): sequences
// over a paged cache filled from the host with random keys and values, scrambled physical pages,
// NaN in every position past a sequence's end and every unused page (so any read of them shows),
// a double-precision reference of the gated attention, and runs through a plan or the legacy
// launch. attention_decode_util.h has the decode tests' step, filled on the device.
#ifndef TANDEM_TESTS_GPU_ATTENTION_CASE_H_
#define TANDEM_TESTS_GPU_ATTENTION_CASE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::attn_testing {

// One sequence in a step: `start` positions already cached, `n` new tokens.
struct SeqStep {
  int start = 0, n = 0;
};

// A step over a paged cache, on the host and on the device.
struct AttnCase {
  cuda::AttnShape d;
  std::vector<SeqStep> seqs;
  int max_pages = 0;
  int64_t n = 0;
  std::vector<std::vector<float>> k, v;  // per sequence: (start + n) × kv_width
  std::vector<float> q, qg;              // n × nh × hd, n × nh × 2hd
  std::vector<int32_t> token_seq, token_pos, page_table;
  std::vector<float> k_pool, v_pool;     // pages × 64 × kv_width, NaN where unused

  gpu_testing::DeviceArray<float> d_k, d_v, d_q, d_qg;
  gpu_testing::DeviceArray<int32_t> d_seq, d_pos, d_table;

  // Copies the host arrays to the device ones.
  void Upload();
  cuda::PagedKv cache() const { return cuda::PagedKv{d_k.get(), d_v.get(), d_table.get(), max_pages}; }
};

// hd, GQA groups, kv heads (rotary dims hd / 4, eps 1e-6).
cuda::AttnShape Shape(int hd, int groups, int kvh);

// Sequences get scrambled physical pages; max_pages (per sequence) fixes every buffer's size.
AttnCase MakeCase(std::mt19937& rng, const cuda::AttnShape& d, const std::vector<SeqStep>& seqs, int max_pages);

// Double-precision gated attention over the host copies.
std::vector<float> Reference(const AttnCase& c);

// The planned launch's output (the case uploaded); f16_tiles: PagedKv::f16_tiles for the run (the
// AttnKv16 path when it is on), null for none.
std::vector<float> RunPlanned(const AttnCase& c, const cuda::AttentionPlan& plan, void* f16_tiles = nullptr);

// The legacy (item list) launch's output.
std::vector<float> RunLegacy(const AttnCase& c);

// "hd256_g8_kvh2": a shape's name in logged errors.
std::string Tag(const cuda::AttnShape& d);

}  // namespace tandem::attn_testing

#endif  // TANDEM_TESTS_GPU_ATTENTION_CASE_H_
