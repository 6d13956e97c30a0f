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

}  // namespace tandem::cuda

#endif  // TANDEM_TESTS_GPU_DECODE_MATVEC_BENCH_H_
