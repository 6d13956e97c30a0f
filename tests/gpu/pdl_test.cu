// Programmatic dependent launch (gpu_service/backends/cuda/pdl.cuh): a kernel launched through
// LaunchPdl after a slow kernel still sees all of that kernel's writes once it has waited, also two
// kernels down the chain and inside a captured CUDA graph; with PDL switched off the same launches
// are plain ones.
#include <cuda_runtime.h>

#include <vector>

#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::cuda {
namespace {

constexpr int kCount = 4096;

// Lets the next kernel start at once, then spins ~spin_cycles before writing out[i] = i + 1: the
// kernels after it are resident long before it ends.
__global__ void SlowWriteKernel(int* out, long long spin_cycles) {
  PdlAllowNext();
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kCount) out[i] = i + 1;
}

// Follows the rule: waits, then reads the previous kernel's output.
__global__ void DoubleKernel(const int* in, int* out) {
  PdlWaitForPrevious();
  PdlAllowNext();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < kCount) out[i] = 2 * in[i];
}

// Touches nothing of the step but waits (the rule): the kernel after it may read what the kernel
// before it wrote.
__global__ void PassKernel() {
  PdlWaitForPrevious();
  PdlAllowNext();
}

class PdlTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    TANDEM_SKIP_WITHOUT_GPU();
    SetPdlEnabled(GetParam());
  }
  void TearDown() override { SetPdlEnabled(true); }
};

// Launches slow -> pass -> double -> double on `stream`: out = 4 (i + 1).
void LaunchChain(int* a, int* b, int* c, cudaStream_t stream) {
  const unsigned blocks = (kCount + 255) / 256;
  ASSERT_EQ(LaunchPdl(SlowWriteKernel, blocks, 256, 0, stream, a, 2000000ll), cudaSuccess);
  ASSERT_EQ(LaunchPdl(PassKernel, 1, 32, 0, stream), cudaSuccess);
  ASSERT_EQ(LaunchPdl(DoubleKernel, blocks, 256, 0, stream, a, b), cudaSuccess);
  ASSERT_EQ(LaunchPdl(DoubleKernel, blocks, 256, 0, stream, b, c), cudaSuccess);
}

void ExpectChainResult(const int* c) {
  std::vector<int> host(kCount);
  ASSERT_EQ(cudaMemcpy(host.data(), c, kCount * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(host[i], 4 * (i + 1)) << "at " << i;
}

TEST_P(PdlTest, LaterKernelsSeeTheSlowKernelsWrites) {
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(3 * kCount * sizeof(int));
  ASSERT_TRUE(buf.ok()) << buf.status();
  int* a = buf->as<int>();
  int* b = a + kCount;
  int* c = b + kCount;
  ASSERT_EQ(cudaMemset(a, 0, 3 * kCount * sizeof(int)), cudaSuccess);
  absl::StatusOr<Stream> owned = Stream::Create();
  ASSERT_TRUE(owned.ok()) << owned.status();
  const cudaStream_t stream = owned->get();
  LaunchChain(a, b, c, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ExpectChainResult(c);
}

TEST_P(PdlTest, CapturedGraphKeepsTheOrder) {
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(3 * kCount * sizeof(int));
  ASSERT_TRUE(buf.ok()) << buf.status();
  int* a = buf->as<int>();
  int* b = a + kCount;
  int* c = b + kCount;
  absl::StatusOr<Stream> owned = Stream::Create();
  ASSERT_TRUE(owned.ok()) << owned.status();
  const cudaStream_t stream = owned->get();
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  LaunchChain(a, b, c, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_EQ(cudaMemsetAsync(a, 0, 3 * kCount * sizeof(int), stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ExpectChainResult(c);
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(OnAndOff, PdlTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "pdl" : "plain"; });

}  // namespace
}  // namespace tandem::cuda
