// Routing on the GPU (docs/MODEL.md §4.6 step 1): from router logits to each token's K experts and
// renormalised weights, exactly as RouteTokens of common/reference/moe.h computes them: π = softmax
// over all E in f32 (exponentials rounded from f64, the sum in f64), the K largest π with ties to
// the lower expert id, w_k = π_k / Σ_selected π, picks in descending weight order.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTER_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTER_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// Largest expert count the route kernel handles (its logits live in shared memory).
inline constexpr int kMaxRouterExperts = 8192;

// logits: n × E (device). Writes experts (n × K int32) and weights (n × K f32), device pointers.
// cudaErrorInvalidValue unless 1 <= K <= E <= kMaxRouterExperts and K <= 64.
cudaError_t LaunchRouteTopK(const float* logits, int n, int E, int K, int32_t* experts, float* weights,
                            cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ROUTER_CUH_
