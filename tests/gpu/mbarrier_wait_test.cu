// The mbarrier phase waits (gpu_service/backends/cuda/mbarrier.cuh): WaitParity (CTA scope) and
// WaitParityCluster return once the phase completes (arrivals, or a bulk copy's bytes), and a phase
// that never completes makes WaitParityCluster trap after kSpinWaitTimeoutNs instead of hanging
// the stream. The trap leaves the CUDA context unusable, so those cases run in a death-test child
// (re-executed: "threadsafe"), whose launch must fail; a watchdog exits the child with another code
// should the wait hang. (WaitParity at CTA scope has no timeout: mbarrier.cuh says why.)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gpu_service/backends/cuda/mbarrier.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::cuda {
namespace {

constexpr int kBytes = 4096;

// Thread 0 sets up a barrier expecting `arrivals` arrivals (and, with bulk, a bulk copy of kBytes
// from src counted against it), makes `made` of them, and every thread waits for phase 0; then the
// block copies what landed to out. made < arrivals: the phase never completes.
template <bool kClusterScope>
__global__ void WaitKernel(const float* src, float* out, int arrivals, int made, bool bulk) {
  __shared__ __align__(128) float data[kBytes / 4];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  for (int i = threadIdx.x; i < kBytes / 4; i += blockDim.x) data[i] = 0.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier::Init(bar_addr, static_cast<uint32_t>(arrivals));
    mbarrier::InitFence();
    mbarrier::FenceProxyAsyncShared();  // data's zeros before the copy's writes (the async proxy's)
    if (bulk) {
      // One of the `made` arrivals, with the copy's bytes.
      mbarrier::BulkCopyRunToShared(static_cast<uint32_t>(__cvta_generic_to_shared(data)), src, kBytes, bar_addr);
      for (int i = 1; i < made; ++i) mbarrier::Arrive(bar_addr);
    } else {
      for (int i = 0; i < made; ++i) mbarrier::Arrive(bar_addr);
    }
  }
  __syncthreads();
  if constexpr (kClusterScope) {
    mbarrier::WaitParityCluster(bar_addr, 0);
  } else {
    mbarrier::WaitParity(bar_addr, 0);
  }
  for (int i = threadIdx.x; i < kBytes / 4; i += blockDim.x) out[i] = data[i];
}

cudaError_t RunWait(bool cluster_scope, const float* src, float* out, int arrivals, int made, bool bulk) {
  if (cluster_scope) {
    WaitKernel<true><<<1, 128>>>(src, out, arrivals, made, bulk);
  } else {
    WaitKernel<false><<<1, 128>>>(src, out, arrivals, made, bulk);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

class MbarrierWaitTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// Completed phases: every arrival made, and a bulk copy's bytes with the arrivals: the wait returns
// and the copied data is there.
TEST_P(MbarrierWaitTest, ReturnsOnceThePhaseCompletes) {
  std::vector<float> host(kBytes / 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) + 0.5f;
  const auto src = gpu_testing::Upload(host);
  const auto out = gpu_testing::Upload(std::vector<float>(host.size(), -1.0f));
  ASSERT_EQ(RunWait(GetParam(), src.get(), out.get(), 3, 3, false), cudaSuccess);
  EXPECT_EQ(gpu_testing::Download(out), std::vector<float>(host.size(), 0.0f));  // no copy: the zeros
  ASSERT_EQ(RunWait(GetParam(), src.get(), out.get(), 2, 2, true), cudaSuccess);
  EXPECT_EQ(gpu_testing::Download(out), host);
}

// A cluster-scope phase that never completes (an arrival missing; or the copy's bytes there but an
// arrival missing) fails the launch within seconds rather than hanging.
TEST(MbarrierWaitClusterTest, APhaseThatNeverCompletesFailsTheLaunch) {
  TANDEM_SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const bool bulk : {false, true}) {
    EXPECT_EXIT(
        {
          std::thread([] {  // a hung wait: a distinct exit code, not a hung test
            std::this_thread::sleep_for(std::chrono::seconds(30));
            std::_Exit(4);
          }).detach();
          const auto src = gpu_testing::Upload(std::vector<float>(kBytes / 4, 1.0f));
          const auto out = gpu_testing::Upload(std::vector<float>(kBytes / 4, 0.0f));
          const auto start = std::chrono::steady_clock::now();
          const cudaError_t e = RunWait(true, src.get(), out.get(), 3, 2, bulk);
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          // The timeout is 2 s: a failure much sooner would be some other error.
          std::_Exit(e != cudaSuccess && s > 1.5 ? 3 : 5);
        },
        ::testing::ExitedWithCode(3), "")
        << (bulk ? "with a bulk copy" : "arrivals only");
  }
}

INSTANTIATE_TEST_SUITE_P(Scopes, MbarrierWaitTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "cluster" : "cta"; });

}  // namespace
}  // namespace tandem::cuda
