// Gated DeltaNet on the GPU (docs/MODEL.md §4.4), everything between the input projections
// (qkv, z, ba: dense products) and the output projection (ssm_out: a dense product).
//
// Per layer and step of n tokens of one sequence, in order:
//   LaunchGdnConv        causal depthwise conv with the kk−1 token history, SiLU;
//   LaunchGdnPrepare     q/k L2 norm (q also scaled by 1/√dk) in place, gates β and g;
//                        (LaunchGdnConvPrepare: both in one pass over memory, for prefill)
//   LaunchGdnRecurrent   the delta rule over the n tokens, state S[nv][dk][dv] f32 in device memory
//                        (or LaunchGdnChunked, the same rule in chunks: prefill);
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

// The per-token kernels (conv, prepare, gated norm) run on 16-byte vectors, a warp per 128
// channels, when the shape and pointers allow (c_dim, dk, dv multiples of 4; dk and dv powers of
// two <= 128 for the norms; every pointer 16-byte aligned), else on the general scalar kernels
// (the *General launchers below): the same results either way, to rounding of the norms' sums.
//
// Row strides: the input rows that a dense product writes (qkv, ba, z) may be parts of wider rows,
// the output of one stacked product of several matrices over the same input (DenseGemm::RunStack:
// row t holds [qkv | z | ba]). qkv_stride, ba_stride and z_stride give the floats from one token's
// row to the next (>= the part's width; 0, the default: the width, i.e. a contiguous array). Rows
// 16-byte aligned for the vector kernels (a stride that is a multiple of 4 keeps them so).

// out (n × c_dim) = SiLU(conv(qkv)) with `history` ((kk−1) × c_dim) prepended; history is then
// replaced by the last kk−1 inputs (so a split of the tokens gives the same result). kk <= 8.
cudaError_t LaunchGdnConv(const float* qkv, float* history, const float* taps, int64_t n,
                          const GdnShape& d, float* out, cudaStream_t stream, int64_t qkv_stride = 0);

// LaunchGdnConv then LaunchGdnPrepare on its output, in one pass over memory when the vector
// kernels apply (the q/k norms and the gates are computed from the conv results in registers).
cudaError_t LaunchGdnConvPrepare(const float* qkv, float* history, const float* taps, const float* ba,
                                 const float* ssm_a, const float* dt_bias, int64_t n, const GdnShape& d,
                                 float* out, float* g, float* beta, cudaStream_t stream, int64_t qkv_stride = 0,
                                 int64_t ba_stride = 0);

// In place on the conv output (n × c_dim): each q head ← q/√(Σq²+1e-6)/√dk, each k head ←
// k/√(Σk²+1e-6). And per token and value head vh (group = vh / r, r = nv/nk, j = vh % r, the
// group's ba entries [b_0..b_{r−1}, a_0..a_{r−1}]): beta = σ(b_j),
// g = ssm_a[vh]·softplus(a_j + dt_bias[vh]). ba is n × 2nv; g and beta are n × nv.
cudaError_t LaunchGdnPrepare(float* conv_out, const float* ba, const float* ssm_a,
                             const float* dt_bias, int64_t n, const GdnShape& d, float* g,
                             float* beta, cudaStream_t stream, int64_t ba_stride = 0);

// Below this many tokens LaunchGdnPrepare's vector path runs one token a warp (decode batches),
// from it on runs of tokens: two kernels whose sums of squares the compiler contracts differently,
// which the fused decode kernel (gdn_decode_fused_kernel.cuh) follows to keep their bits.
inline constexpr int64_t kGdnPrepareShortRunBelow = 128;

// The gated delta rule over n tokens from the prepared conv output; o is n × nv·dv. state is
// S[nv][dk][dv], read and overwritten. dk must be 64 or 128 (each thread keeps one state column
// of dk values in registers); dv a multiple of 32.
cudaError_t LaunchGdnRecurrent(const float* conv_out, const float* g, const float* beta, int64_t n,
                               const GdnShape& d, float* state, float* o, cudaStream_t stream);

// The chunked form of the same rule for prefill (common/reference/gdn_rule.h, flash-linear-
// attention's chunk_gated_delta_rule): tokens go in chunks of kGdnChunk; within a chunk the UT
// transform T = (I + A)⁻¹ (a triangular solve) gives the WY representation, and only the state
// update runs sequentially, once per chunk. Same inputs, outputs and state semantics as
// LaunchGdnRecurrent (any n >= 1; a split of the tokens over calls gives the same result to
// rounding). Requires dk == dv, 64 or 128.
inline constexpr int kGdnChunk = 64;

enum class GdnChunkPrecision {
  kF32,   // exact mode: f32 products on the CUDA cores (relative L2 ~1e-6 against the reference)
  kTf32,  // fast mode: tf32 tensor-core products with f32 accumulation (~1e-3)
};

// Device scratch for a pass over up to max_tokens tokens (rounded up to whole chunks):
// per chunk and value head the WY matrices W (64 × dk) and U (64 × dv), the masked decayed q·k
// products (64 × 64) and two decay vectors (2 × 64), all f32. For Qwen3-Next-80B (nv 32, dk = dv
// = 128) that is 82,432 B per chunk and value head: 2048 tokens take 84 MB.
int64_t GdnChunkedScratchBytes(const GdnShape& d, int64_t max_tokens);

// The chunked delta rule over n tokens. scratch (256-byte aligned, scratch_bytes long, at least
// GdnChunkedScratchBytes(d, kGdnChunk)) is overwritten; when it holds fewer chunks than n needs,
// the tokens run in several passes of as many chunks as fit (same result, slightly slower).
// Returns cudaErrorInvalidValue for unsupported shapes or too little or misaligned scratch.
cudaError_t LaunchGdnChunked(const float* conv_out, const float* g, const float* beta, int64_t n,
                             const GdnShape& d, GdnChunkPrecision precision, void* scratch,
                             int64_t scratch_bytes, float* state, float* o, cudaStream_t stream);

// Decode of n sequences at once, one token each (row t of qkv / conv_out / g / beta / o is the
// token of the sequence whose conv history and state start at history + rows[t]·row_stride and
// state + rows[t]·row_stride; rows is device memory, n entries, distinct). The same results as
// LaunchGdnConv / LaunchGdnRecurrent with n = 1 per sequence, in one launch each. n <= 65535.
// qkv_stride: the floats from one token's qkv row to the next (0: c_dim; see "Row strides" above).
cudaError_t LaunchGdnConvDecode(const float* qkv, float* history, int64_t row_stride, const int32_t* rows,
                                const float* taps, int64_t n, const GdnShape& d, float* out, cudaStream_t stream,
                                int64_t qkv_stride = 0);
cudaError_t LaunchGdnRecurrentDecode(const float* conv_out, const float* g, const float* beta, int64_t n,
                                     const GdnShape& d, float* state, int64_t row_stride, const int32_t* rows,
                                     float* o, cudaStream_t stream);

// out = norm ⊙ ρ(o_head) ⊙ SiLU(z_head) per token and value head (o, z, out: n × nv·dv, z's rows
// z_stride apart; out may alias o).
cudaError_t LaunchGdnGatedNorm(const float* o, const float* z, const float* norm, float eps,
                               int64_t n, const GdnShape& d, float* out, cudaStream_t stream,
                               int64_t z_stride = 0);

// The gated norm written as the f16 input rows of the output product (DenseGemm::F16Input in
// gemm_plan.h): per token [f16(out)] (nv·dv values) or, split, [lo | hi | hi] (3·nv·dv), into
// out16, instead of f32 rows that a conversion pass would read back. Same values per element as
// LaunchGdnGatedNorm. The general path (unaligned or odd head sizes) overwrites o with the f32
// result on its way.
cudaError_t LaunchGdnGatedNormToF16(float* o, const float* z, const float* norm, float eps, int64_t n,
                                    const GdnShape& d, bool split, uint16_t* out16, cudaStream_t stream,
                                    int64_t z_stride = 0);

// The general scalar kernels behind LaunchGdnConv, LaunchGdnPrepare and LaunchGdnGatedNorm (any
// shape, any alignment; a thread per channel): what those fall back to, and the baseline that
// tests and benchmarks compare the vector kernels with.
cudaError_t LaunchGdnConvGeneral(const float* qkv, float* history, const float* taps, int64_t n,
                                 const GdnShape& d, float* out, cudaStream_t stream, int64_t qkv_stride = 0);
cudaError_t LaunchGdnPrepareGeneral(float* conv_out, const float* ba, const float* ssm_a,
                                    const float* dt_bias, int64_t n, const GdnShape& d, float* g,
                                    float* beta, cudaStream_t stream, int64_t ba_stride = 0);
cudaError_t LaunchGdnGatedNormGeneral(const float* o, const float* z, const float* norm, float eps,
                                      int64_t n, const GdnShape& d, float* out, cudaStream_t stream,
                                      int64_t z_stride = 0);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_CUH_
