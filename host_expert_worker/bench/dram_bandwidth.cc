#include "host_expert_worker/bench/dram_bandwidth.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>

#include "host_expert_worker/kernels/kernel_isa.h"

namespace tandem {
namespace {

__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint8_t* p, uint64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (uint64_t i = 0; i < n; i += 256) {
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
    c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
    d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
  }
  a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(_mm512_castsi512_si128(a)));
}

uint64_t ReadPortable(const uint8_t* p, uint64_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (uint64_t i = 0; i < n / 8; i += 4) {
    a ^= w[i];
    b ^= w[i + 1];
    c ^= w[i + 2];
    d ^= w[i + 3];
  }
  return a ^ b ^ c ^ d;
}

}  // namespace

double MeasureReadBandwidth(const uint8_t* data, uint64_t bytes, int passes, WorkerThreadPool* pool) {
  const bool wide = KernelIsaSupported(KernelIsa::kAvx512Vnni);
  const int threads = pool->size();
  const uint64_t slice = bytes / threads / 4096 * 4096;
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    pool->Run([&](int t) {
      const uint8_t* p = data + slice * t;
      sink.fetch_xor(wide ? ReadAvx512(p, slice) : ReadPortable(p, slice), std::memory_order_relaxed);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(slice * threads) / seconds);
  }
  // Keeps the reads observable.
  if (sink.load() == 0x5EED) best += 0;
  return best;
}

}  // namespace tandem
