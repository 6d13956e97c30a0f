// Engram (docs/MODEL.md §4.3) steps 4-6 on the GPU; step 3's projections run through
// LaunchDenseMatVec and the table rows come from the host (engram_host.h).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ENGRAM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ENGRAM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// For n positions and S streams (width = S·h): g_s = ⟨γk_s ⊙ ρ(kv_s), γq_s ⊙ ρ(H_s)⟩/√h,
// α_s = σ(sign(g_s)·sqrt(max(|g_s|, 1e-6))), u_s = α_s·v, ū_s = γc_s ⊙ ρ(u_s).
// kv, H, u, ubar: n × width; v: n × h; the norms: width. Norm sums and the dot run in f64 as in
// the reference.
cudaError_t LaunchEngramGate(const float* kv, const float* v, const float* H, const float* key_norm,
                             const float* query_norm, const float* conv_norm, int n, int S, int h, float eps,
                             float* u, float* ubar, cudaStream_t stream);

// window: (hist + n) × width, the hist = (ck − 1)·dilation previous ū rows (oldest first) then the
// n new ones; taps: width × ck (channel c's taps at c·ck). H[t] += u[t] + SiLU(conv[t]) with
// conv[t][c] = Σ_q taps[c][q]·window[hist + t − (ck − 1 − q)·dilation][c].
cudaError_t LaunchEngramConvInject(const float* window, const float* taps, const float* u, int n, int width, int ck,
                                   int dilation, float* H, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_ENGRAM_CUH_
