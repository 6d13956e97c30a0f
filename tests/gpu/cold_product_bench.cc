// gpu_kernels_bench --cold-product: the decode step's one-row Q8_0x8 products on a cold L2, as the
// step meets them (each launch reads weights no launch before it read: a CUDA graph of 20 launches
// over 20 copies of the matrix), by kernel: the f32 streaming kernel (matvec_stream.cuh) plain and
// with its norm inside, and the resident int8 MMA kernel (kernels/matvec_resident.cuh) plain and with its
// norm inside; then the same launches over one copy (weights in L2 after the first). Shapes: the
// 80B's stacked GDN inputs (2048 -> 12352, 27 MB), attention's q (2048 -> 8192) and [k; v]
// (2048 -> 1024). --cold-read gives the same byte counts read without a product.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/matvec_resident.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu/bench_util.h"
#include "tests/gpu/decode_matvec_bench.h"

namespace tandem::cuda {

void BenchColdProducts() {
  using bench::GraphUs;
  using bench::LaunchStream;
  using bench::Report;
  constexpr int kRegions = 20;
  constexpr int kCols = 2048;
  struct Shape {
    const char* name;
    int rows;
  };
  const Shape shapes[] = {{"gdn_in", 12352}, {"attn_q", 8192}, {"attn_kv", 1024}};
  std::vector<float> ones(kCols, 1.0f);
  float *x = nullptr, *H = nullptr, *gamma = nullptr, *yin = nullptr, *out = nullptr;
  for (float** p : {&x, &H, &gamma, &yin}) {
    BENCH_CHECK(cudaMalloc(p, kCols * sizeof(float)));
    BENCH_CHECK(cudaMemcpy(*p, ones.data(), kCols * sizeof(float), cudaMemcpyHostToDevice));
  }
  BENCH_CHECK(cudaMalloc(&out, 16384 * sizeof(float)));
  for (const Shape& s : shapes) {
    const int64_t row_bytes = Q8_0x8RowBytes(kCols);
    const int64_t bytes = (row_bytes * s.rows + 255) / 256 * 256;
    uint8_t* pool = nullptr;
    BENCH_CHECK(cudaMalloc(&pool, bytes * kRegions));
    // 0x11: f16 scales of 5.2e-4 and quants of 17 (finite everywhere; speed does not depend on values).
    BENCH_CHECK(cudaMemset(pool, 0x11, bytes * kRegions));
    auto matrix = [&](int i) {
      DeviceMatrix m;
      m.type = kTypeQ8_0x8;
      m.data = pool + i * bytes;
      m.cols = kCols;
      m.rows = s.rows;
      m.row_bytes = row_bytes;
      return m;
    };
    MatVecNormIn in;
    in.H = H;
    in.y = yin;
    in.gamma = gamma;
    in.eps = 1e-6f;
    in.h_written_earlier = true;
    const char* kernels[] = {"stream", "stream_norm_in", "resident", "resident_norm_in"};
    for (int k = 0; k < 4; ++k) {
      for (const bool cold : {true, false}) {
        int next = 0;
        auto launch = [&] {
          const DeviceMatrix m = matrix(cold ? next++ % kRegions : 0);
          cudaStream_t st = LaunchStream();
          switch (k) {
            case 0: BENCH_CHECK(LaunchDenseMatVec(m, x, kCols, 1, out, s.rows, st)); break;
            case 1: BENCH_CHECK(LaunchDenseMatVecNormIn(m, in, out, st)); break;
            case 2: BENCH_CHECK(LaunchResidentMatVec(m, x, out, st)); break;
            default: BENCH_CHECK(LaunchResidentMatVecNormIn(m, in, out, st)); break;
          }
        };
        launch();
        BENCH_CHECK(cudaDeviceSynchronize());
        next = 0;
        const double us = GraphUs(launch, kRegions);
        char detail[200];
        std::snprintf(detail, sizeof(detail), "%s 2048 -> %d (%.1f MB), %s, %s: %.2f us a launch", s.name, s.rows,
                      static_cast<double>(row_bytes * s.rows) / 1e6, kernels[k], cold ? "cold L2" : "one copy", us);
        Report(std::string("cold_product_") + s.name + "_" + kernels[k] + (cold ? "_cold" : "_warm"),
               static_cast<double>(row_bytes * s.rows) / (us * 1e3), "GB/s", detail);
      }
    }
    BENCH_CHECK(cudaFree(pool));
  }
  for (float* p : {x, H, gamma, yin, out}) BENCH_CHECK(cudaFree(p));
}

}  // namespace tandem::cuda
