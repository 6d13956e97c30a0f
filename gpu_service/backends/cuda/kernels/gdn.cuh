// Gated DeltaNet on the GPU (docs/MODEL.md §4.4), everything between the input projections
// (qkv, z, ba: dense products) and the output projection (ssm_out: a dense product).
//
// Per layer and step of n tokens of one sequence, in order:
//   LaunchGdnConv        causal depthwise conv with the kk−1 token history, SiLU;
//   LaunchGdnPrepare     q/k L2 norm (q also scaled by 1/√dk) in place, gates β and g;
//   LaunchGdnRecurrent   the delta rule over the n tokens, state S[nv][dk][dv] f32 in device memory;
//   LaunchGdnGatedNorm   o ← ssm_norm ⊙ ρ(o) ⊙ SiLU(z).
// Layouts match the CPU reference (common/reference/gdn.h): qkv rows are q (nk·dk), k (nk·dk),
// v (nv·dv); the conv history holds kk−1 rows of c_dim, oldest first; conv taps are c_dim × kk.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

inline constexpr int kGdnMaxConvKernel = 8;

struct GdnShape {
  int nk = 0, nv = 0, dk = 0, dv = 0, kk = 0;
  int c_dim() const { return 2 * nk * dk + nv * dv; }
};

// out (n × c_dim) = SiLU(conv(qkv)) with `history` ((kk−1) × c_dim) prepended; history is then
// replaced by the last kk−1 inputs (so a split of the tokens gives the same result). kk <= 8.
cudaError_t LaunchGdnConv(const float* qkv, float* history, const float* taps, int64_t n,
                          const GdnShape& d, float* out, cudaStream_t stream);

// In place on the conv output (n × c_dim): each q head ← q/√(Σq²+1e-6)/√dk, each k head ←
// k/√(Σk²+1e-6). And per token and value head vh (group = vh / r, r = nv/nk, j = vh % r, the
// group's ba entries [b_0..b_{r−1}, a_0..a_{r−1}]): beta = σ(b_j),
// g = ssm_a[vh]·softplus(a_j + dt_bias[vh]). ba is n × 2nv; g and beta are n × nv.
cudaError_t LaunchGdnPrepare(float* conv_out, const float* ba, const float* ssm_a,
                             const float* dt_bias, int64_t n, const GdnShape& d, float* g,
                             float* beta, cudaStream_t stream);

// The gated delta rule over n tokens from the prepared conv output; o is n × nv·dv. state is
// S[nv][dk][dv], read and overwritten. dk must be 64 or 128 (each thread keeps one state column
// of dk values in registers); dv a multiple of 32.
cudaError_t LaunchGdnRecurrent(const float* conv_out, const float* g, const float* beta, int64_t n,
                               const GdnShape& d, float* state, float* o, cudaStream_t stream);

// out = norm ⊙ ρ(o_head) ⊙ SiLU(z_head) per token and value head (o, z, out: n × nv·dv; out may
// alias o).
cudaError_t LaunchGdnGatedNorm(const float* o, const float* z, const float* norm, float eps,
                               int64_t n, const GdnShape& d, float* out, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CUH_
