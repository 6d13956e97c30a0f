#include "host_expert_worker/kernels/expert_ffn_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "host_expert_worker/kernels/exact_row_dot.h"

namespace tandem {
namespace {

// A 64-byte aligned, zero-initialised byte buffer.
class AlignedBytes {
 public:
  AlignedBytes() = default;
  explicit AlignedBytes(size_t bytes)
      : data_(static_cast<uint8_t*>(::operator new(std::max<size_t>(bytes, 64), std::align_val_t{64}))) {
    std::fill(data_, data_ + std::max<size_t>(bytes, 64), 0);
  }
  ~AlignedBytes() {
    if (data_ != nullptr) ::operator delete(data_, std::align_val_t{64});
  }
  AlignedBytes(AlignedBytes&& o) noexcept : data_(o.data_) { o.data_ = nullptr; }
  AlignedBytes& operator=(AlignedBytes&& o) noexcept {
    std::swap(data_, o.data_);
    return *this;
  }
  uint8_t* get() const { return data_; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(data_); }

 private:
  uint8_t* data_ = nullptr;
};

inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// A tile's cost per weight row, in units of one output row's integer work: decoding a weight
// block costs about two activation rows' worth of multiply-adds in the int8 kernels (instruction
// counts of the AVX-512 K-quant kernel); the claimed tail absorbs the estimate's error.
constexpr int64_t kDecodeCost = 2;

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

bool IsFloatType(WeightType t) {
  return t == WeightType::kF32 || t == WeightType::kF16 || t == WeightType::kBF16;
}

}  // namespace

struct ExpertFfnEngine::Buffers {
  int64_t q8k_h_bytes, q8x32_h_bytes, q8k_i_bytes, q8x32_i_bytes, scratch_floats;
  AlignedBytes act_q8k, act_q8x32;      // per activation row
  AlignedBytes gate_out, up_out;        // per sorted pair slot: I floats
  AlignedBytes inter_q8k, inter_q8x32;  // per sorted pair slot: two-term rows hi, lo
  AlignedBytes order, tiles;
  AlignedBytes thread_scratch;          // per thread: scratch_floats floats
  AlignedBytes tile_cost;               // per tile: int64 cost per row (row_split.h)
  AlignedBytes up_bounds, down_bounds;  // threads + 1 int64 each
  // Per tile: gate / up rows finished, and the epoch of the pass whose down input is ready.
  std::unique_ptr<std::atomic<int64_t>[]> tile_rows_done;
  std::unique_ptr<std::atomic<uint64_t>[]> tile_ready;
};

ExpertFfnEngine::ExpertFfnEngine(const ExpertFfnEngineOptions& options, WorkerThreadPool* pool)
    : options_(options), pool_(pool) {}
ExpertFfnEngine::~ExpertFfnEngine() = default;

absl::StatusOr<std::unique_ptr<ExpertFfnEngine>> ExpertFfnEngine::Create(
    const ExpertFfnEngineOptions& o, WorkerThreadPool* pool) {
  if (o.hidden <= 0 || o.inner <= 0 || o.hidden % 32 != 0 || o.inner % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("expert dims h = ", o.hidden, ", I = ", o.inner,
                                                   " must be positive multiples of 32"));
  }
  if (o.max_pairs < 1 || o.max_activation_rows < 1) {
    return absl::InvalidArgumentError("max_pairs and max_activation_rows must be >= 1");
  }
  if (!KernelIsaSupported(o.isa)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU cannot run the ", std::string(KernelIsaName(o.isa)), " kernels"));
  }
  std::unique_ptr<ExpertFfnEngine> engine(new ExpertFfnEngine(o, pool));
  auto b = std::make_unique<Buffers>();
  b->q8k_h_bytes = ActivationRowBytes(ActivationFormat::kQ8K, o.hidden);
  b->q8x32_h_bytes = ActivationRowBytes(ActivationFormat::kQ8x32, o.hidden);
  b->q8k_i_bytes = ActivationRowBytes(ActivationFormat::kQ8K, o.inner);
  b->q8x32_i_bytes = ActivationRowBytes(ActivationFormat::kQ8x32, o.inner);
  b->scratch_floats = (std::max(o.hidden, o.inner) + 15) / 16 * 16;
  const size_t rows = static_cast<size_t>(o.max_activation_rows);
  const size_t pairs = static_cast<size_t>(o.max_pairs);
  b->act_q8k = AlignedBytes(rows * b->q8k_h_bytes);
  b->act_q8x32 = AlignedBytes(rows * b->q8x32_h_bytes);
  b->gate_out = AlignedBytes(pairs * o.inner * sizeof(float));
  b->up_out = AlignedBytes(pairs * o.inner * sizeof(float));
  b->inter_q8k = AlignedBytes(2 * pairs * b->q8k_i_bytes);
  b->inter_q8x32 = AlignedBytes(2 * pairs * b->q8x32_i_bytes);
  b->order = AlignedBytes(pairs * sizeof(uint32_t));
  b->tiles = AlignedBytes(pairs * sizeof(Tile));
  b->thread_scratch = AlignedBytes(static_cast<size_t>(pool->size()) * b->scratch_floats * sizeof(float));
  b->tile_cost = AlignedBytes(pairs * sizeof(int64_t));
  b->up_bounds = AlignedBytes((static_cast<size_t>(pool->size()) + 1) * sizeof(int64_t));
  b->down_bounds = AlignedBytes((static_cast<size_t>(pool->size()) + 1) * sizeof(int64_t));
  b->tile_rows_done = std::make_unique<std::atomic<int64_t>[]>(pairs);
  b->tile_ready = std::make_unique<std::atomic<uint64_t>[]>(pairs);
  for (size_t i = 0; i < pairs; ++i) b->tile_ready[i].store(0, std::memory_order_relaxed);
  engine->buffers_ = std::move(b);
  return engine;
}

KernelIsa ExpertFfnEngine::IsaFor(WeightType type) const {
  KernelIsa used = KernelIsa::kScalar;
  FindBestRowDotKernel(options_.isa, type, &used);
  return used;
}

absl::Status ExpertFfnEngine::CheckLayer(const ExpertLayerView& layer) const {
  const int64_t n = layer.gate.experts;
  const int64_t h = options_.hidden, I = options_.inner;
  if (absl::Status s = CheckExpertMatrix("ffn_gate_exps", layer.gate, h, I, n); !s.ok()) return s;
  if (absl::Status s = CheckExpertMatrix("ffn_up_exps", layer.up, h, I, n); !s.ok()) return s;
  if (absl::Status s = CheckExpertMatrix("ffn_down_exps", layer.down, I, h, n); !s.ok()) return s;
  for (const auto& [name, m] : {std::pair{"ffn_gate_exps", &layer.gate}, std::pair{"ffn_up_exps", &layer.up},
                                std::pair{"ffn_down_exps", &layer.down}}) {
    if (!IsFloatType(m->type) && FindRowDotKernel(KernelIsa::kScalar, m->type) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": weight type ", std::string(GetWeightTypeInfo(m->type).name),
          " has no expert kernel (supported: f32 f16 bf16 q8_0 q4_0 q2_K q3_K q4_K q5_K q6_K)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ExpertFfnEngine::Compute(const ExpertLayerView& layer, std::span<const ExpertRowPair> pairs,
                                      const float* activations, int64_t activation_rows, bool exact,
                                      float* outputs) {
  if (activation_rows > options_.max_activation_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "activation_row_count ", activation_rows, " exceeds the worker's capacity of ",
        options_.max_activation_rows, " rows (raise --max-rows)"));
  }
  bool quantize = true;
  for (size_t begin = 0; begin < pairs.size() || begin == 0; begin += options_.max_pairs) {
    const size_t n = std::min<size_t>(pairs.size() - begin, options_.max_pairs);
    if (n == 0) break;
    if (absl::Status s = ComputePass(layer, pairs.subspan(begin, n), exact,
                                     outputs + begin * options_.hidden, quantize, activations,
                                     activation_rows);
        !s.ok()) {
      return s;
    }
    quantize = false;  // the quantized activations stay valid for the next pass
  }
  return absl::OkStatus();
}

absl::Status ExpertFfnEngine::ComputePass(const ExpertLayerView& layer, std::span<const ExpertRowPair> pairs,
                                          bool exact, float* outputs, bool quantize_activations,
                                          const float* activations, int64_t activation_rows) {
  Buffers& b = *buffers_;
  uint32_t* order = b.order.as<uint32_t>();
  Tile* tiles = b.tiles.as<Tile>();
  const uint32_t n = static_cast<uint32_t>(pairs.size());
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order, order + n, [&](uint32_t x, uint32_t y) {
    return pairs[x].expert != pairs[y].expert ? pairs[x].expert < pairs[y].expert : x < y;
  });
  int64_t tile_count = 0;
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i;
    while (j < n && j - i < kMaxRowBlock && pairs[order[j]].expert == pairs[order[i]].expert) ++j;
    tiles[tile_count++] = Tile{pairs[order[i]].expert - layer.first_expert, i, j - i};
    i = j;
  }
  Pass& p = pass_;
  p.layer = &layer;
  p.pairs = pairs;
  p.activations = activations;
  p.activation_rows = activation_rows;
  p.quantize_activations = quantize_activations;
  p.exact = exact;
  p.outputs = outputs;
  p.tiles = tile_count;
  const int threads = pool_->size();
  auto format = [exact](WeightType t) {
    return exact ? ActivationFormat::kF32 : IntegerActivationFormat(t);
  };
  p.gate_format = format(layer.gate.type);
  p.up_format = format(layer.up.type);
  p.down_format = format(layer.down.type);
  int64_t* cost = b.tile_cost.as<int64_t>();
  const int64_t down_terms = p.down_format == ActivationFormat::kF32 ? 1 : 2;
  for (int64_t i = 0; i < tile_count; ++i) cost[i] = kDecodeCost + tiles[i].count;
  p.up_split = MakeRowSplit(cost, tile_count, options_.inner, threads, b.up_bounds.as<int64_t>());
  for (int64_t i = 0; i < tile_count; ++i) cost[i] = kDecodeCost + down_terms * tiles[i].count;
  p.down_split = MakeRowSplit(cost, tile_count, options_.hidden, threads, b.down_bounds.as<int64_t>());
  p.epoch += 1;
  for (int64_t i = 0; i < tile_count; ++i) b.tile_rows_done[i].store(0, std::memory_order_relaxed);
  next_quant_.store(0, std::memory_order_relaxed);
  next_up_.store(0, std::memory_order_relaxed);
  next_down_.store(0, std::memory_order_relaxed);
  pool_->Run([this](int t) { RunThread(t); });
  return absl::OkStatus();
}

const void* ExpertFfnEngine::ActivationRow(uint32_t slot, ActivationFormat format) const {
  const Buffers& b = *buffers_;
  const int64_t row = pass_.pairs[b.order.as<uint32_t>()[slot]].row;
  switch (format) {
    case ActivationFormat::kQ8K: return b.act_q8k.get() + row * b.q8k_h_bytes;
    case ActivationFormat::kQ8x32: return b.act_q8x32.get() + row * b.q8x32_h_bytes;
    case ActivationFormat::kF32: break;
  }
  return pass_.activations + row * options_.hidden;
}

void ExpertFfnEngine::RowDots(const ExpertMatrixView& m, ActivationFormat format, uint32_t e, int64_t r0,
                              int64_t rows, const void* const* acts, int count, int terms,
                              float* const* out, float* scratch) const {
  const uint8_t* w = static_cast<const uint8_t*>(m.data) + (e * m.rows + r0) * m.row_bytes;
  if (format == ActivationFormat::kF32) {
    ExactRowDots(m.type, w, m.row_bytes, rows, m.cols, reinterpret_cast<const float* const*>(acts),
                 count, out, scratch);
  } else {
    FindBestRowDotKernel(options_.isa, m.type)(w, m.row_bytes, rows, m.cols / GetWeightTypeInfo(m.type).block_elems,
                                               acts, count, terms, out);
  }
}

void ExpertFfnEngine::GateUpRows(int64_t i, int64_t r0, int64_t rows, float* scratch) {
  const Pass& p = pass_;
  Buffers& b = *buffers_;
  const int64_t I = options_.inner;
  const Tile& tile = b.tiles.as<Tile>()[i];
  float* gate_out = b.gate_out.as<float>();
  float* up_out = b.up_out.as<float>();
  const void* acts[kMaxRowBlock] = {};  // initialised: GCC cannot see that count >= 1
  float* outs[kMaxRowBlock] = {};
  const int count = static_cast<int>(tile.count);
  for (int k = 0; k < count; ++k) {
    acts[k] = ActivationRow(tile.first + k, p.gate_format);
    outs[k] = gate_out + (tile.first + k) * I + r0;
  }
  RowDots(p.layer->gate, p.gate_format, tile.expert, r0, rows, acts, count, 1, outs, scratch);
  for (int k = 0; k < count; ++k) {
    acts[k] = ActivationRow(tile.first + k, p.up_format);
    outs[k] = up_out + (tile.first + k) * I + r0;
  }
  RowDots(p.layer->up, p.up_format, tile.expert, r0, rows, acts, count, 1, outs, scratch);
  for (int k = 0; k < count; ++k) {
    float* g = gate_out + (tile.first + k) * I + r0;
    const float* up = up_out + (tile.first + k) * I + r0;
    for (int64_t r = 0; r < rows; ++r) g[r] = Silu(g[r]) * up[r];
  }
  // acq_rel: the thread that completes the tile sees every other thread's rows of it.
  if (b.tile_rows_done[i].fetch_add(rows, std::memory_order_acq_rel) + rows != I) return;
  // The tile's intermediate rows into down's integer format, as two-term rows: a single int8
  // row of SiLU(g)·u (heavy-tailed) would be the largest error term of the fast mode
  // (docs/PERF.md). Slot s has hi at inter + 2 s * inter_bytes, lo right after it.
  if (p.down_format != ActivationFormat::kF32) {
    const bool down_k = p.down_format == ActivationFormat::kQ8K;
    const int64_t inter_bytes = down_k ? b.q8k_i_bytes : b.q8x32_i_bytes;
    uint8_t* inter = down_k ? b.inter_q8k.get() : b.inter_q8x32.get();
    for (int k = 0; k < count; ++k) {
      const int64_t s = tile.first + k;
      uint8_t* hi = inter + 2 * s * inter_bytes;
      QuantizeActivationsTwoTerm(p.down_format, gate_out + s * I, I, scratch, hi, hi + inter_bytes);
    }
  }
  b.tile_ready[i].store(p.epoch, std::memory_order_release);
}

void ExpertFfnEngine::DownRows(int64_t i, int64_t r0, int64_t rows, float* scratch) {
  const Pass& p = pass_;
  Buffers& b = *buffers_;
  const int64_t h = options_.hidden, I = options_.inner;
  const Tile& tile = b.tiles.as<Tile>()[i];
  // Every step-1 row has been claimed by a running thread before any thread gets here, so
  // this wait ends; on an oversubscribed machine, let the thread it waits for run.
  for (int spins = 1; b.tile_ready[i].load(std::memory_order_acquire) != p.epoch; ++spins) {
    CpuRelax();
    if (spins % 4096 == 0) std::this_thread::yield();
  }
  const bool down_k = p.down_format == ActivationFormat::kQ8K;
  const int64_t inter_bytes = down_k ? b.q8k_i_bytes : b.q8x32_i_bytes;
  const uint8_t* inter = down_k ? b.inter_q8k.get() : b.inter_q8x32.get();
  const uint32_t* order = b.order.as<uint32_t>();
  const void* acts[kMaxRowBlock * kMaxTerms] = {};
  float* outs[kMaxRowBlock] = {};
  const int count = static_cast<int>(tile.count);
  const int terms = p.down_format == ActivationFormat::kF32 ? 1 : 2;
  for (int k = 0; k < count; ++k) {
    const uint32_t s = tile.first + k;
    if (terms == 1) {
      acts[k] = b.gate_out.as<float>() + s * I;
    } else {
      acts[2 * k] = inter + 2 * s * inter_bytes;
      acts[2 * k + 1] = inter + (2 * s + 1) * inter_bytes;
    }
    outs[k] = p.outputs + static_cast<int64_t>(order[s]) * h + r0;
  }
  RowDots(p.layer->down, p.down_format, tile.expert, r0, rows, acts, count, terms, outs, scratch);
}

void ExpertFfnEngine::RunThread(int t) {
  const Pass& p = pass_;
  Buffers& b = *buffers_;
  const int64_t h = options_.hidden;
  float* scratch = b.thread_scratch.as<float>() + t * b.scratch_floats;

  // Step 0: activation rows into the integer formats gate and up need, one 256-element block
  // (or, when h is no multiple of 256, one row) per claim, so that a single row is spread over
  // the team rather than quantized by one thread while the rest wait.
  const bool need_q8k = p.gate_format == ActivationFormat::kQ8K || p.up_format == ActivationFormat::kQ8K;
  const bool need_q8x32 = p.gate_format == ActivationFormat::kQ8x32 || p.up_format == ActivationFormat::kQ8x32;
  if (p.quantize_activations && (need_q8k || need_q8x32)) {
    const int64_t piece = h % 256 == 0 ? 256 : h;
    const int64_t pieces_per_row = h / piece;
    const int64_t units = p.activation_rows * pieces_per_row;
    for (int64_t u; (u = next_quant_.fetch_add(1, std::memory_order_relaxed)) < units;) {
      const int64_t r = u / pieces_per_row, first = (u % pieces_per_row) * piece;
      const float* x = p.activations + r * h + first;
      if (need_q8k) {
        QuantizeActivationsQ8K(x, piece, reinterpret_cast<ActivationBlockQ8K*>(b.act_q8k.get() + r * b.q8k_h_bytes) + first / 256);
      }
      if (need_q8x32) {
        QuantizeActivationsQ8x32(x, piece, reinterpret_cast<ActivationBlockQ8x32*>(b.act_q8x32.get() + r * b.q8x32_h_bytes) + first / 32);
      }
    }
    pool_->Barrier();
  }

  // Step 1: gate and up, then SiLU(g) * u; the last thread on a tile readies its down input.
  ForEachRowRange(p.up_split, t, next_up_, [&](int64_t i, int64_t r0, int64_t rows) {
    GateUpRows(i, r0, rows, scratch);
  });
  // Step 2: down, straight into each pair's output row, as each tile becomes ready.
  ForEachRowRange(p.down_split, t, next_down_, [&](int64_t i, int64_t r0, int64_t rows) {
    DownRows(i, r0, rows, scratch);
  });
}

}  // namespace tandem
