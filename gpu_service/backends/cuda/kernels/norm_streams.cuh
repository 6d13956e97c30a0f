// Hyper-connection streams on the GPU (docs/MODEL.md §4.1): per-stream RMS norm (optionally fused
// with the pending inject of the previous block), the fold of the normed streams into the block
// input, the inject weights, and the inject itself. The low-rank products z = D·vec(N),
// m = U·SiLU(z) and c = J·vec(N) are dense products (dense_matvec.cuh / gemm_plan.h).
//
// Layouts as the CPU reference (common/reference/streams.h): H is n tokens × S streams × h, token
// t's stream s at H + (t·S + s)·h; x and y are n × h; a (inject weights) and c are n × S.
// h must be a multiple of 4 and every pointer 16-byte aligned.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_STREAMS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_STREAMS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// Optional output of the plain norms below (S = 1): the normed rows also quantized as the MoE
// experts' integer-MMA input (moe/expert_prefill_mmq.cuh MmqActivations, the planes of
// LaunchMmqQuantize over N with K = h: hi/lo int8 [n][h], scale f32 [n][h / 256], sumx f32
// [n][h / 32]), bit for bit what LaunchMmqQuantize over N leaves (the same device function,
// moe/mmq_quantize.cuh), in the norm's launch instead of one more. Needs S = 1, h a multiple of
// 256 and at most 12288 (the row is staged in shared memory), hi/lo 8-byte aligned.
// x16 (set alone or with the planes; the planes' fields may then stay nullptr): the normed rows
// rounded to f16 (nearest even), [n][h], bit for bit what LaunchConvertToF16 (moe/expert_prefill.cuh)
// over N leaves: the streamed Q4_K expert kernels' input (ExpertPrefillRunner's x_f16_), written
// here instead of by one more launch that reads N back (98.5 us a layer at 8192 tokens of h 2048).
// Needs S = 1 and x16 8-byte aligned; any h the norm takes.
struct NormMmqOut {
  int8_t* hi = nullptr;
  int8_t* lo = nullptr;
  float* scale = nullptr;
  float* sumx = nullptr;
  uint16_t* x16 = nullptr;
};

// The gated shared expert's term that the one-token MoE step left out of its output y (the down
// kernel no longer waits for the shared expert: expert_decode_one.cuh, MoeStage::Run's
// MoeDeferredShared) for y's consumer to add: the inject then uses, per token t and column j,
//   y_eff[t·h + j] = fmaf(g_t, shared[t·h + j], y[t·h + j]),  g_t = 1.0f / (1.0f + expf(-gate_logit[t]))
// (g_t = 1 when gate_logit is nullptr): OneDownKernel's very expression and operations, so y_eff
// has the bits that y had when the down kernel added the term itself. shared nullptr: no term.
// Read after the kernels' PDL wait (the caller orders their producers before the launch).
struct PendingShared {
  const float* shared = nullptr;      // n × h
  const float* gate_logit = nullptr;  // n, or nullptr (ungated)
};

// An inject that an earlier read left to this one: that read's norm was formed inside the product
// that reads it (dense_matvec.cuh LaunchDenseMatVecNormIn), which does not write H, so H still
// lacks y + g·shared. The norm adds it to H before the launch's own inject, as the earlier read's
// norm would have (the same operations: H then has the bits it would have had). One stream, no
// inject weights, rows the register kernel takes (h ≤ 4096, fewer than 4096 rows with an inject).
struct EarlierInject {
  const float* y = nullptr;  // n × h; nullptr: none
  PendingShared sh;          // its shared term (PendingShared), or none
};

// The routing logits formed by a one-token, one-stream norm's launch from the parts its mixer's
// output product summed (kernels/route_compose.cuh): extra blocks of the launch compute, for
// r < rows,
//   logits[r] = (1/ρ) · (Σ_j w[r][j]·γ[j]·H'[j] + inv_scale[r]·(parts[r] + kRouteLoScale·parts[padded + r]))
// with H' the norm's row before y is added (after an EarlierInject) and 1/ρ the norm's own scale,
// i.e. w · x up to the parts' rounding, for the fused MoE kernel to read instead of a router
// product. The first sum is formed before the launch's PDL wait.
struct NormRoute {
  const float* w = nullptr;          // rows × h f32, row-major (the router's rows, the shared gate's)
  int rows = 0;
  const float* parts = nullptr;      // the output product's sums: hi terms, then lo terms at +padded
  int64_t padded = 0;
  const float* inv_scale = nullptr;  // 1 / S_r of each row (route_compose.cuh)
  float* logits = nullptr;           // rows floats
  // A counter, zero between launches: the route blocks read H before their PDL wait, and the
  // norm's own block rewrites H after its wait, so it first waits until every route block has
  // counted its reads here (then takes the count back out).
  int* h_reads = nullptr;
};

// Whether a plain norm of rows h wide can write NormMmqOut (h a multiple of 256, at most 12288:
// the staged row's shared memory); callers ask before they plan the quantized planes.
inline bool NormMmqFits(int64_t h) { return h % 256 == 0 && h <= 12288; }

// If y is not nullptr, first H_s += a_s·y for every token and stream (a may be nullptr: a = 1;
// y with the PendingShared term added when sh names one: sh needs y);
// then N_s = γ_s ⊙ ρ(H_s) with γ_s = gamma + s·h (gamma holds S·h values) for every token and
// stream. With S = 1 and no hc tensors N is the block input x itself. N must not alias H.
// earlier (EarlierInject, with y set): H += its term before y's; cudaErrorInvalidValue where the
// register kernel does not take the rows, with S > 1 or with inject weights a.
// route (NormRoute; may be nullptr): also the routing logits; needs n = S = 1, y, no inject
// weights or shared term, h_written_earlier, the register kernel's rows, and 16-byte aligned w
// rows (h a multiple of 4); cudaErrorInvalidValue otherwise.
cudaError_t LaunchInjectRmsNorm(float* H, int64_t n, int64_t S, int64_t h, const float* a,
                                const float* y, const float* gamma, float eps, float* N,
                                cudaStream_t stream, const NormMmqOut* q = nullptr,
                                const PendingShared* sh = nullptr, bool h_written_earlier = false,
                                const EarlierInject* earlier = nullptr, const NormRoute* route = nullptr);

// LaunchInjectRmsNorm that also writes the normed rows as the f16 input of a prepared product
// (gemm_plan.h, DenseGemm::F16Input; token t's row holds its S streams, cols = S·h): copies 1
// (kFast) f16(N) rows of S·h, copies 3 (kFastSplit) split rows [lo | hi | hi] of 3·S·h (gemm.cuh). The f16 rows are
// bit for bit what LaunchInjectRmsNorm followed by LaunchF32ToF16 / LaunchF32ToF16SplitRows over N
// would leave (the same f32 values, the same roundings), in one launch instead of two and without
// reading N back. N may be nullptr when nothing reads the f32 rows. N16 8-byte aligned, room for
// n·copies·S·h values. cudaErrorInvalidValue for another copies.
cudaError_t LaunchInjectRmsNormF16(float* H, int64_t n, int64_t S, int64_t h, const float* a, const float* y,
                                   const float* gamma, float eps, float* N, int copies, uint16_t* N16,
                                   cudaStream_t stream, const NormMmqOut* q = nullptr,
                                   const PendingShared* sh = nullptr, bool h_written_earlier = false);

// h_written_earlier (both launches above): the caller knows that no kernel since the one two
// launches back wrote H's rows (the backend's norms with an inject: the last writer of H is the
// previous norm), so the register kernel reads them before its PDL wait, overlapping the kernel
// before; the same values, the same bits. TANDEM_OLD_NORM_EARLY_H=1 (read once; settable; read at
// launch) reads them after the wait, for A/B.
bool OldNormEarlyH();
void SetOldNormEarlyH(bool on);

// The same with a block of 256 threads per row that reads the row twice (any h): what
// LaunchInjectRmsNorm runs past h = 4096 and for inject steps of 4096 rows or more, and the
// baseline its tests and benchmark compare with (LaunchInjectRmsNorm otherwise keeps rows of up to
// 4096 floats in registers).
cudaError_t LaunchInjectRmsNormGeneral(float* H, int64_t n, int64_t S, int64_t h, const float* a,
                                       const float* y, const float* gamma, float eps, float* N,
                                       cudaStream_t stream, const PendingShared* sh = nullptr);

// x_j = (2/S)·Σ_s σ(m_{s,j})·N_{s,j} per token; m and N are n × S × h.
cudaError_t LaunchStreamFold(const float* N, const float* m, int64_t n, int64_t S, int64_t h,
                             float* x, cudaStream_t stream);

// v ← SiLU(v) over count values.
cudaError_t LaunchSiluInPlace(float* v, int64_t count, cudaStream_t stream);

// a ← 2σ(c) over count values (a may alias c); with c = nullptr, a ← 1.
cudaError_t LaunchInjectWeights(const float* c, int64_t count, float* a, cudaStream_t stream);

// H_s ← H_s + a_s·y for every token and stream (the unfused inject: after the last layer, or when
// no norm follows). a may be nullptr: a = 1. sh: y with that shared term added (PendingShared).
cudaError_t LaunchStreamInject(float* H, int64_t n, int64_t S, int64_t h, const float* a,
                               const float* y, cudaStream_t stream, const PendingShared* sh = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_STREAMS_CUH_
