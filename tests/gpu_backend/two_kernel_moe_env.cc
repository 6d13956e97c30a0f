// gpu_backend_test compares fast-mode decode steps bit for bit across schedules, switches, graphs
// and buffers. The fused one-token MoE (the fast mode's default, moe_stage.h's OneTokenFused) adds
// its sums with atomics, whose order, and so whose last bits, may change between runs; the suite
// therefore runs the two one-token kernels, and the tests of the fused kernel turn it on themselves
// (DecodeScheduleTest.FusedOneTokenMoeKeepsDecodeLogitsClose, within tolerances).
#include <gtest/gtest.h>

#include "gpu_service/backends/cuda/backend/moe_stage.h"

namespace tandem {
namespace {

class TwoKernelOneTokenMoe : public ::testing::Environment {
 public:
  void SetUp() override { cuda::SetOneTokenFused(false); }
};

[[maybe_unused]] ::testing::Environment* const kTwoKernelOneTokenMoe =
    ::testing::AddGlobalTestEnvironment(new TwoKernelOneTokenMoe);

}  // namespace
}  // namespace tandem
