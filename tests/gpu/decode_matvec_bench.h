// Decode matrix-vector benchmarks of gpu_kernels_bench (decode_matvec_bench.cc). Each prints
// its lines through bench::Report; copy_gbs is the device copy ceiling measured by the caller.
#ifndef TANDEM_TESTS_GPU_DECODE_MATVEC_BENCH_H_
#define TANDEM_TESTS_GPU_DECODE_MATVEC_BENCH_H_

namespace tandem::cuda {

void BenchLaunchFloor();
void BenchMatVec(double copy_gbs);
void BenchQ8Layouts(double copy_gbs);
void BenchQ6Head(double copy_gbs);
// matvec_probe_bench.cc (--matvec-probe): phase stamps of the batch-1 streaming products in a PDL chain.
void BenchMatVecProbe();
// cold_read_bench.cu (--cold-read): HBM reads of a product's size on a cold L2, by access order and
// page recency.
void BenchColdRead();
// cold_product_bench.cc (--cold-product): the decode step's one-row Q8_0x8 products on a cold L2, by
// kernel (f32 streaming against resident int8 MMA, each plain and with its norm inside).
void BenchColdProducts();

}  // namespace tandem::cuda

#endif  // TANDEM_TESTS_GPU_DECODE_MATVEC_BENCH_H_
