// Engram n-gram memory (qwen4exp, docs/MODEL.md §4.3): hashed table rows from token ids, then a
// gated, convolved injection into the residual streams.
#ifndef TANDEM_COMMON_REFERENCE_ENGRAM_H_
#define TANDEM_COMMON_REFERENCE_ENGRAM_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

// One Engram layer's configuration (the layer's own slices of A.engram.multipliers / table_sizes).
struct EngramConfig {
  int64_t max_ngram = 0;    // N: orders 2..N
  int64_t heads = 0;        // K hash heads per order
  int64_t head_dim = 0;     // de
  int64_t conv_kernel = 0;  // ck
  int64_t dilation = 1;     // δ
  std::vector<uint64_t> multipliers;  // N odd multipliers m_0 .. m_{N−1}
  std::vector<uint32_t> table_sizes;  // (N−1)·K primes P_{n,k}, order n = 2..N, then k

  int64_t rows_per_token() const { return (max_ngram - 1) * heads; }
  int64_t pin() const { return rows_per_token() * head_dim; }
  int64_t total_rows() const;  // Σ P_{n,k}: the rows of engram_embd
  int64_t conv_history() const { return (conv_kernel - 1) * dilation; }  // state rows (w each)
};

absl::Status CheckEngramConfig(const EngramConfig& c);

// x' = token_map[token] (token itself when the map is empty), as an unsigned 64-bit value.
uint64_t CompressTokenId(std::span<const int32_t> token_map, int32_t token);

// Table rows of one position from recent[i] = x'_{p−i} for i < N (0 for positions before the
// sequence start): for order n and head k, mix = XOR_{i<n} recent[i]·m_i (wrapping u64) and
// row = offset_{n,k} + mix mod P_{n,k}. Writes rows_per_token() rows in (n, k) order.
void EngramPositionRows(const EngramConfig& c, const uint64_t* recent, int64_t* rows);

// Rows of positions start .. start + n − 1 (n × rows_per_token()); tokens holds the sequence's ids
// from position 0 through at least start + n − 1.
void EngramRows(const EngramConfig& c, std::span<const int32_t> token_map,
                std::span<const int32_t> tokens, int64_t start, int64_t n, int64_t* rows);

struct EngramWeights {
  MatrixView embd;        // engram_embd {de, total_rows}
  MatrixView key;         // engram_key {pin, S·h}
  MatrixView value;       // engram_value {pin, h}
  VectorView key_norm;    // engram_key_norm {S·h}
  VectorView query_norm;  // engram_query_norm {S·h}
  VectorView conv_norm;   // engram_conv_norm {S·h}
  VectorView conv;        // engram_conv {ck, S·h} f32: channel c's taps at [c·ck, c·ck + ck)
};

absl::Status CheckEngramWeights(const EngramWeights& w, const EngramConfig& c, int64_t S, int64_t h);

// Steps 3-6 for n consecutive positions: H (n × S × h) is updated in place; rows are the positions'
// table rows (EngramRows). conv_state holds the last conv_history() normed inputs ū (oldest row
// first, S·h each; zero at sequence start) and is advanced past the n positions.
void EngramForward(const EngramWeights& w, const EngramConfig& c, const int64_t* rows, float* H,
                   int64_t n, int64_t S, int64_t h, float eps, float* conv_state, ThreadPool* pool);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_ENGRAM_H_
