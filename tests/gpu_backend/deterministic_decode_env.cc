// gpu_backend_test compares fast-mode decode steps bit for bit across schedules, switches, graphs
// and buffers. Two fast-mode defaults add their sums with atomics, whose order, and so whose last
// bits, may change between runs: the fused one-token MoE (moe_stage.h's OneTokenFused) and the
// fused GDN kernel with ssm_out inside (gdn_decode_fused.cuh, GetGdnDecodeFused 3) and attention's
// column-split o product (dense_colsplit.cuh). The suite therefore runs the two one-token MoE
// kernels, GDN mode 1 (ssm_out as its own product) and the row-split o product, and the tests of
// the atomic forms turn them on themselves, within tolerances (DecodeScheduleTest's
// FusedOneTokenMoeKeepsDecodeLogitsClose, GdnOutProductInside..., AttnOutColumnSplit...).
#include <gtest/gtest.h>

#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"

namespace tandem {
namespace {

class DeterministicDecode : public ::testing::Environment {
 public:
  void SetUp() override {
    cuda::SetOneTokenFused(false);
    cuda::SetGdnDecodeFused(1);
    cuda::SetAttnOutColumnSplit(false);
  }
};

[[maybe_unused]] ::testing::Environment* const kDeterministicDecode =
    ::testing::AddGlobalTestEnvironment(new DeterministicDecode);

}  // namespace
}  // namespace tandem
