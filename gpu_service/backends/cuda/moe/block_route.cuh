// BlockRoute: one block routes one token (softmax over the E router logits, top-K picks with
// RouteBefore's tie-break, weights renormalised in f64), bit-identical to device_plan.cu's
// RouteToken; the one-token MoE kernels (expert_decode_one.cu) route with it. Device code only
// (include from .cu files); internal linkage, as in matvec_core.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_BLOCK_ROUTE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_BLOCK_ROUTE_CUH_

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

namespace tandem::cuda {
namespace {

// A lane's largest key and its slot j (the lowest j among equal keys): a pairwise tree.
template <int kPer>
__device__ __forceinline__ unsigned LaneBestKey(const unsigned (&key)[kPer], int* slot) {
  unsigned k[kPer];
  int at[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    k[j] = key[j];
    at[j] = j;
  }
#pragma unroll
  for (int w = 1; w < kPer; w <<= 1) {
#pragma unroll
    for (int i = 0; i + w < kPer; i += 2 * w) {
      const bool right = k[i + w] > k[i];  // strictly: the left (lower j) keeps a tie
      k[i] = right ? k[i + w] : k[i];
      at[i] = right ? at[i + w] : at[i];
    }
  }
  *slot = at[0];
  return k[0];
}

// `rounds` picks from a warp's keys (lane l holds ids l, l + 32, ...; 0: taken or absent): each
// round two warp reductions (redux.sync) give the largest key and the lowest id holding it, which
// is then taken; every lane calls take(r, key, id) (key 0: nothing was left). Call from every lane.
// A lane's best key comes from a pairwise tree (log2(kPer) dependent compare-selects a round, not
// kPer in a chain: the chain was most of a round's latency at kPer = 16); the lower j wins a tie,
// so the lane still offers its lowest id among equal keys.
template <int kPer, typename Take>
__device__ __forceinline__ void WarpTakeKeys(unsigned (&key)[kPer], int rounds, Take&& take) {
  const int lane = threadIdx.x & 31;
  for (int r = 0; r < rounds; ++r) {
    int slot;
    const unsigned best = LaneBestKey<kPer>(key, &slot);
    const unsigned best_id = static_cast<unsigned>(lane + 32 * slot);
    const unsigned top = __reduce_max_sync(0xFFFFFFFFu, best);
    const unsigned id = __reduce_min_sync(0xFFFFFFFFu, best == top && top != 0u ? best_id : 0xFFFFFFFFu);
    take(r, top, id);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (lane + 32 * j == static_cast<int>(id)) key[j] = 0u;
    }
  }
}

// Routes the token with the whole block, to the same picks and bit-identical weights as
// device_plan.cu's RouteToken (one warp there): the f64 exponentials are spread over every thread
// (they dominated the one-warp time: 16 a lane, at the f64 rate), then warp 0 sums them in
// RouteToken's order (lane l: experts l, l + 32, ... in turn, then the xor butterfly), scales them
// to f32 probabilities and takes `rounds` picks (WarpTakeKeys: two warp reductions a round
// instead of WarpTakeFirst's five shuffle steps of (value, id)): the probabilities are >= 0, so
// their bits + 1 order them as floats (0 marks a taken, absent or NaN entry), and the lowest id
// holding the largest key wins, RouteBefore's tie-break. Lane 0 writes pick r's expert to ids[r]
// and its probability to probs[r]. Every thread of the block must call it; `overlap` runs in the
// warps other than 0 (in warp 0 when the block is one warp) while warp 0 picks. Returns, in warp 0,
// the f64 sum of the picked probabilities in pick order (the renormaliser once rounds == K).
// A NaN logit is never picked here; RouteToken could pick it or an expert twice (garbage either way).
template <int kPer, typename Overlap, typename Stamp = void (*)(int)>
__device__ double BlockRoute(const float* logits, int E, int rounds, float* s_p, float* s_red, int* ids, float* probs,
                             Overlap&& overlap, Stamp&& stamp = [](int) {}) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
  float mx = -FLT_MAX;
  for (int i = t; i < E; i += blockDim.x) {
    const float v = logits[i];
    s_p[i] = v;
    mx = fmaxf(mx, v);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  mx = s_red[0];
  for (int w = 1; w < warps; ++w) mx = fmaxf(mx, s_red[w]);  // fmaxf is exact: any order gives RouteToken's max
  stamp(0);
  for (int i = t; i < E; i += blockDim.x) s_p[i] = static_cast<float>(exp(static_cast<double>(s_p[i] - mx)));
  __syncthreads();
  stamp(1);
  double picked_sum = 0.0;
  if (warp == 0) {
    float p[kPer];
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane + 32 * j;
      p[j] = i < E ? s_p[i] : 0.0f;
      sum += p[j];
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
    const float inv = static_cast<float>(1.0 / sum);
    stamp(2);
    unsigned key[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float q = p[j] * inv;
      key[j] = lane + 32 * j < E && !(q != q) ? __float_as_uint(q) + 1u : 0u;
    }
    WarpTakeKeys<kPer>(key, rounds, [&](int r, unsigned top, unsigned id) {
      const float bv = top != 0u ? __uint_as_float(top - 1u) : -FLT_MAX;
      if (lane == 0) {
        ids[r] = top != 0u ? static_cast<int>(id) : E;
        probs[r] = bv;
      }
      picked_sum += bv;
    });
    __syncwarp();  // ids / probs written by lane 0
  }
  if (warp != 0 || warps == 1) overlap();
  __syncthreads();
  return picked_sum;
}

// A logit's pick key: its bits made unsigned-ordered, 0 for a NaN (never picked). Callers pass
// the logit + 0 (-0 read as +0, so that equal logits tie).
__device__ __forceinline__ unsigned LogitKey(float v) {
  const unsigned u = __float_as_uint(v);
  return v != v ? 0u : (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// The logit of a pick key (LogitKey's inverse on keys it makes), -inf for 0 (no pick left).
__device__ __forceinline__ float KeyLogit(unsigned key) {
  return key == 0u ? -INFINITY : __uint_as_float((key & 0x80000000u) != 0u ? key & 0x7FFFFFFFu : ~key);
}

// Lane l's logits l, l + 32, ... (32 · 16 of them, all present) with all 16 loads issued before any
// is used. Why inline PTX: in the fused MoE kernel (96 registers) nvcc issued WarpPickLogits'
// predicated loop four loads at a time, each group reusing the previous group's registers, so the
// routing waited four L2 round trips for the logits (~2.8 us after the router count in the probe,
// where one round trip is ~0.3-0.7 us). One asm statement keeps the 16 loads together.
template <bool kThroughL2>
__device__ __forceinline__ void LoadLogits16(const float* p, float (&v)[16]) {
#define TANDEM_LOGIT_LOADS(OP)                                                                          \
  asm volatile(OP " %0, [%16];\n\t" OP " %1, [%16+128];\n\t" OP " %2, [%16+256];\n\t"               \
               OP " %3, [%16+384];\n\t" OP " %4, [%16+512];\n\t" OP " %5, [%16+640];\n\t"           \
               OP " %6, [%16+768];\n\t" OP " %7, [%16+896];\n\t" OP " %8, [%16+1024];\n\t"          \
               OP " %9, [%16+1152];\n\t" OP " %10, [%16+1280];\n\t" OP " %11, [%16+1408];\n\t"      \
               OP " %12, [%16+1536];\n\t" OP " %13, [%16+1664];\n\t" OP " %14, [%16+1792];\n\t"     \
               OP " %15, [%16+1920];"                                                                   \
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]), "=f"(v[4]), "=f"(v[5]), "=f"(v[6]),    \
                 "=f"(v[7]), "=f"(v[8]), "=f"(v[9]), "=f"(v[10]), "=f"(v[11]), "=f"(v[12]), "=f"(v[13]), \
                 "=f"(v[14]), "=f"(v[15])                                                              \
               : "l"(p)                                                                                \
               : "memory")
  if constexpr (kThroughL2) {
    TANDEM_LOGIT_LOADS("ld.global.cg.f32");
  } else {
    TANDEM_LOGIT_LOADS("ld.global.f32");
  }
#undef TANDEM_LOGIT_LOADS
}

// The fast mode's routing (OneTokenMoeArgs::logit_route), one warp: the top `rounds` router logits
// themselves, not their softmax. Softmax is monotonic and the model renormalises the K picked
// probabilities, so the full sum over E cancels: w_k = exp(l_k - l_0) / Σ_j exp(l_j - l_0) over
// the picks alone (PickWeights). That skips BlockRoute's E f64 exponentials, its f64 sum and a
// block barrier (~3 us of every gate/up block's routing at E = 512, the probe's phases 5-7). The
// picks equal RouteToken's but where two logits round to one probability (then RouteToken takes
// the lower id, here the larger logit); the weights differ in the last bits. Keys: the logit's
// bits made unsigned-ordered (-0 read as +0, so equal logits tie and the lowest id wins, as
// RouteBefore); 0 marks a taken or NaN entry. Lane r writes pick r's expert to ids[r] (E when none
// is left) and its logit to picked[r] (-inf then); rounds <= 32. Call from every lane of one warp.
// through_l2: read the logits with ld.global.cg (written by other blocks of the running grid).
// loaded(v) runs once the keys are formed, v a value that depends on every loaded logit (a probe
// stamps there; the default does nothing).
template <int kPer, typename Loaded = void (*)(unsigned)>
__device__ void WarpPickLogits(const float* logits, int E, int rounds, int* ids, float* picked,
                               bool through_l2 = false, Loaded&& loaded = [](unsigned) {}) {
  const int lane = threadIdx.x & 31;
  unsigned key[kPer];
  if (kPer == 16 && E >= 32 * kPer) {  // every logit present: LoadLogits16
    float l[16];
    if (through_l2) {
      LoadLogits16<true>(logits + lane, l);
    } else {
      LoadLogits16<false>(logits + lane, l);
    }
#pragma unroll
    // + 0: -0 -> +0. (j % 16 is j: this branch runs at kPer = 16 only; the index lets other kPer compile.)
    for (int j = 0; j < kPer; ++j) key[j] = LogitKey(l[j % 16] + 0.0f);
  } else {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane + 32 * j;
      const float l = i < E ? (through_l2 ? __ldcg(logits + i) : logits[i]) : 0.0f;
      key[j] = LogitKey(i < E ? l + 0.0f : __int_as_float(0x7FC00000));  // + 0: -0 -> +0; past E a NaN
    }
  }
  unsigned every = 0u;
#pragma unroll
  for (int j = 0; j < kPer; ++j) every ^= key[j];
  loaded(every);
  // Lane r keeps pick r (selects, no branch a round) and writes it once after the rounds.
  int my_id = E;
  float my_picked = -INFINITY;
  WarpTakeKeys<kPer>(key, rounds, [&](int r, unsigned top, unsigned id) {
    if (lane == r) {
      my_id = top != 0u ? static_cast<int>(id) : E;
      my_picked = KeyLogit(top);
    }
  });
  if (lane < rounds) {
    ids[lane] = my_id;
    picked[lane] = my_picked;
  }
  __syncwarp();  // ids / picked written by lanes 0 .. rounds - 1
}

// The renormalised weights of WarpPickLogits' K picks (K <= 32), one warp: lane k < K returns
// exp(picked[k] - picked[0]) / Σ_j exp(picked[j] - picked[0]) (the xor-butterfly sum, the same
// bits in every kernel that calls it); other lanes return 0.
__device__ __forceinline__ float PickWeights(const float* picked, int K) {
  const int lane = threadIdx.x & 31;
  const float e = lane < K ? expf(picked[lane] - picked[0]) : 0.0f;
  float sum = e;
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
  return lane < K ? e / sum : 0.0f;
}

}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_BLOCK_ROUTE_CUH_
