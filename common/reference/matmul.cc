#include "common/reference/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/reference/matmul_kernels.h"

namespace tandem {
namespace {

using matmul_internal::kRowTile;
using matmul_internal::MatMulJob;
using RowsFn = void (*)(const MatMulJob&, int64_t, int64_t);

// A parallel chunk should carry at least this many multiply-adds: below it, waking a worker
// costs more than the work it takes over.
constexpr int64_t kMinParallelWork = int64_t{1} << 17;

[[noreturn]] void Die(const char* what, unsigned value) {
  std::fprintf(stderr, "tandem: MatMul: %s %u\n", what, value);
  std::abort();
}

RowsFn RowsFor(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kScalar: return matmul_internal::MatMulRowsScalar;
#if defined(__x86_64__)
    case MatMulIsa::kAvx2: return matmul_internal::MatMulRowsAvx2;
    case MatMulIsa::kAvx512: return matmul_internal::MatMulRowsAvx512;
#else
    default: break;
#endif
  }
  Die("no kernels for instruction set", static_cast<unsigned>(isa));
}

bool TypeSupported(WeightType type) {
  switch (type) {
    case WeightType::kF32:
    case WeightType::kF16:
    case WeightType::kBF16:
    case WeightType::kQ4_0:
    case WeightType::kQ8_0:
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K: return true;
  }
  return false;
}

}  // namespace

bool MatMulIsaSupported(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kScalar: return true;
#if defined(__x86_64__)
    case MatMulIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case MatMulIsa::kAvx512: return MatMulIsaSupported(MatMulIsa::kAvx2) && __builtin_cpu_supports("avx512f");
#else
    case MatMulIsa::kAvx2:
    case MatMulIsa::kAvx512: return false;
#endif
  }
  return false;
}

MatMulIsa BestMatMulIsa() {
  static const MatMulIsa best = MatMulIsaSupported(MatMulIsa::kAvx512) ? MatMulIsa::kAvx512
                                : MatMulIsaSupported(MatMulIsa::kAvx2) ? MatMulIsa::kAvx2
                                                                        : MatMulIsa::kScalar;
  return best;
}

std::string_view MatMulIsaName(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kScalar: return "scalar";
    case MatMulIsa::kAvx2: return "avx2";
    case MatMulIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

void MatMulWithIsa(MatMulIsa isa, const MatrixView& w, const float* x, int64_t n, float* y,
                   ThreadPool* pool) {
  if (n <= 0 || w.rows <= 0) return;
  if (!MatMulIsaSupported(isa)) Die("instruction set not supported by this CPU:", static_cast<unsigned>(isa));
  if (!TypeSupported(w.type)) Die("unsupported weight type id", static_cast<unsigned>(w.type));
  const RowsFn rows_fn = RowsFor(isa);
  const MatMulJob job{w, x, n, y};
  const int64_t rows = w.rows;
  // Tiles of kRowTile rows are the unit of work; small products stay on one thread.
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  const int64_t grain = std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(1, w.cols * kRowTile * n));
  ParallelFor(pool, 0, tiles, grain, [&](int64_t tile_begin, int64_t tile_end) {
    rows_fn(job, tile_begin * kRowTile, std::min(rows, tile_end * kRowTile));
  });
}

void MatMul(const MatrixView& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  MatMulWithIsa(BestMatMulIsa(), w, x, n, y, pool);
}

}  // namespace tandem
