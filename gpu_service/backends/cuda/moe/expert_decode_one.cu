// The one-token MoE kernels of expert_decode_one.cuh (what they compute is described there).
//
// Geometry follows the Q4_K tile kernel (expert_decode_q4k.cuh): a lane owns one 144-byte
// super-block of a row, a row of `cols` inputs takes nsb = cols / 256 lanes and a warp step covers
// rps = 32 / nsb rows; the warp copies its rows' raw bytes into shared memory with cp.async and
// decodes from there; activations are staged in shared memory with their sub-block sums.
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_one_probe.h"

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "gpu_service/backends/cuda/moe/q4k_dot.cuh"
#include "gpu_service/backends/cuda/moe/one_token_act.cuh"
#include "gpu_service/backends/cuda/moe/route_order.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/smem_limit.h"
#include "gpu_service/backends/cuda/spin_wait.cuh"

namespace tandem::cuda {
namespace {

using q4k::CpAsync16;
using q4k::DotSuperBlock;
using q4k::DotSuperBlockI16;
using q4k::kSbBytes;
using q4k::kXSbStride;
using q4k::SiluQ4K;

constexpr int kGateUpWarps = 4;  // the tile kernel's measured best at one token (PERF_NOTES.md)
constexpr int kDownMaxWarps = 16;

// expert_decode_one_probe.h's state and stamps (compiled into the kProbe instantiations only).
struct ProbeState {
  unsigned long long* stamps;
  unsigned capacity;
  unsigned count[2];
  unsigned down_late;
};
__device__ ProbeState g_probe;

template <bool kProbe>
struct PhaseProbe {
  unsigned long long* row = nullptr;
  __device__ explicit PhaseProbe(int kernel) {
    if constexpr (kProbe) {
      if (threadIdx.x == 0) {
        const unsigned slot = atomicAdd(&g_probe.count[kernel], 1u);
        if (g_probe.stamps != nullptr && slot < g_probe.capacity) {
          row = g_probe.stamps + (static_cast<unsigned long long>(kernel) * g_probe.capacity + slot) * kOneTokenProbeWords;
          const unsigned smid = SmId();
          row[kOneTokenProbeWords - 2] = smid;
          row[kOneTokenProbeWords - 1] = blockIdx.x + blockIdx.y * gridDim.x;
          Stamp(0);
        }
      }
    }
  }
  __device__ void Stamp(int phase) const {
    if constexpr (kProbe) {
      if (row != nullptr) row[phase] = GlobalTimerNs();
    }
  }
};

// One warp waits until `need` gate/up blocks have counted themselves done in *count
// (OneTokenMoeArgs::pick_counts); their act rows are then visible to every lane (lane 0's acquire,
// then the warp barrier). Every gate/up block is resident or done by now (this grid started only
// after each had passed its PDL wait), so the count completes; one that never did would be a bug,
// and the wait traps (spin_wait.cuh).
__device__ __forceinline__ void WaitPickCount(const int* count, int need) {
  if ((threadIdx.x & 31) == 0) SpinUntil<64>([&] { return LoadAcquire(count) >= need; });
  __syncwarp();
}

// Whether pick e names a computable expert (the plan's test: in [0, E) with a location).
__device__ __forceinline__ bool PickValid(const ExpertLocation* table, int E, int e) {
  return e >= 0 && e < E && table[e].gate != nullptr;
}

// Kernel 1. grid (ceil(inner / (kGateUpWarps · rps)), K), kGateUpWarps warps. Shared memory:
// [weights: warp, matrix (gate, up), rps rows][x: nsb padded super-blocks][Σx: nsb × 8]
// [gate pointers: E][up pointers: E]; with kI16 no f32 x (x is quantized straight from global
// memory: ~8 KB less a block at the 80B shape, so that a down block fits beside three gate/up
// blocks and enters early) and after the pointers [x as int16: nsb × kXqSbStride][x scales: nsb].
template <int kPer, bool kProbe = false, bool kI16 = false>
__global__ void __launch_bounds__(kGateUpWarps * 32) OneGateUpKernel(OneTokenMoeArgs a) {
  const PhaseProbe<kProbe> probe(0);
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float s_p[kPer * 32];
  __shared__ float s_red[kGateUpWarps];
  __shared__ int s_ids[kOneTokenMaxPicks];
  __shared__ float s_probs[kOneTokenMaxPicks];
  const int nsb = a.h >> 8;
  const int row_bytes = nsb * kSbBytes;
  const int rps = 32 / nsb;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rho = lane / nsb, sb = lane - rho * nsb;
  const int mat_bytes = rps * row_bytes;
  uint8_t* wsm = smem + warp * 2 * mat_bytes;
  float* xs = reinterpret_cast<float*>(smem + kGateUpWarps * 2 * mat_bytes);  // f32 only
  float* sxs = xs + (kI16 ? 0 : nsb * kXSbStride);
  const void** tgate = reinterpret_cast<const void**>(sxs + nsb * 8);
  const void** tup = tgate + a.E;
  [[maybe_unused]] int16_t* xq = reinterpret_cast<int16_t*>(tup + a.E);  // kI16 only
  [[maybe_unused]] float* xsc = reinterpret_cast<float*>(xq + nsb * kXqSbStride);
  const int k = blockIdx.y;
  const int row0 = (blockIdx.x * kGateUpWarps + warp) * rps;

  // Before the wait: the expert table's gate and up pointers (constant), so that the pick's
  // matrices are known from shared memory as soon as it is made; x too when its writer is two or
  // more launches back (pdl.cuh's rule).
  for (int i = threadIdx.x; i < a.E; i += kGateUpWarps * 32) {
    tgate[i] = a.table[i].gate;
    tup[i] = a.table[i].up;
  }
  const bool x_early = a.x_written_earlier;
  if (x_early) {
    if constexpr (kI16) {
      QuantizeI16(a.x, nsb, xq, xsc, sxs, warp, kGateUpWarps, lane);
    } else {
      StageRow(a.x, a.h, xs, threadIdx.x, 0, kGateUpWarps * 32);
      __syncthreads();
      SubBlockSums(xs, nsb, sxs, threadIdx.x, kGateUpWarps * 32);
    }
  }
  // The logits are the previous kernel's output (and x, unless x_early).
  PdlWaitForPrevious();
  probe.Stamp(1);
  PdlAllowNext();
  // With kI16 no f32 copy: x is quantized straight from global memory during the routing below.
  if constexpr (!kI16) {
    if (!x_early) StageRow(a.x, a.h, xs, threadIdx.x, 0, kGateUpWarps * 32);
  }
  // Block (0, K - 1) routes all K picks anyway: it publishes them for the routing sink, the host
  // copy and the tests. The others stop at their own pick.
  const bool writer = blockIdx.x == 0 && k == a.K - 1;
  double picked_sum = 0.0;
  if (a.logit_route) {
    if (warp == 0) {
      WarpPickLogits<kPer>(a.logits, a.E, writer ? a.K : k + 1, s_ids, s_probs);
    } else if (!x_early) {
      if constexpr (kI16) QuantizeI16(a.x, nsb, xq, xsc, sxs, warp - 1, kGateUpWarps - 1, lane);
    }
    __syncthreads();
    if constexpr (!kI16) {
      if (!x_early) {
        SubBlockSums(xs, nsb, sxs, threadIdx.x, kGateUpWarps * 32);
        __syncthreads();
      }
    }
  } else {
    picked_sum = BlockRoute<kPer>(
        a.logits, a.E, k + 1, s_p, s_red, s_ids, s_probs,
        [&] {
          if (x_early) return;
          if constexpr (kI16) {
            QuantizeI16(a.x, nsb, xq, xsc, sxs, warp - 1, kGateUpWarps - 1, lane);
          } else {
            SubBlockSums(xs, nsb, sxs, threadIdx.x - 32, (kGateUpWarps - 1) * 32);
          }
        },
        [&](int sub) { probe.Stamp(5 + sub); });
  }
  probe.Stamp(2);
  if (writer && warp == 0) {
    const float w = a.logit_route ? PickWeights(s_probs, a.K) : 0.0f;  // every lane of the warp
    if (lane < a.K) {
      const int e = s_ids[lane];
      a.experts_out[lane] = e;
      a.weights_out[lane] = a.logit_route ? w : static_cast<float>(s_probs[lane] / picked_sum);
      if (!(e >= 0 && e < a.E && tgate[e] != nullptr)) *a.error = 1;
    }
  }
  const int e = s_ids[k];
  const int nrows = min(rps, a.inner - row0);
  // A flagged pick computes nothing (uniform over the block); nrows is warp-uniform.
  if (e >= 0 && e < a.E && tgate[e] != nullptr && nrows > 0) {
    WarpCopyGateUpRows(wsm, mat_bytes, tgate[e], tup[e], row0, row_bytes, nrows * row_bytes / 16, lane);
    CpAsyncWait<0>();
    __syncwarp();  // the other lanes' copies are visible
    probe.Stamp(3);
    const int row = row0 + rho;
    const bool valid = rho < rps && rho < nrows;
    float acc[2][1] = {{0.0f}, {0.0f}};
    if (valid) {
      const uint8_t* wsb[2] = {wsm + rho * row_bytes + sb * kSbBytes, wsm + mat_bytes + rho * row_bytes + sb * kSbBytes};
      if constexpr (kI16) {
        DotSuperBlockI16<2>(wsb, xq + sb * kXqSbStride, xsc[sb], sxs + sb * 8, acc);
      } else {
        DotSuperBlock<1, 2>(wsb, xs + sb * kXSbStride, 0, sxs + sb * 8, 0, 1, acc);
      }
    }
    for (int off = 1; off < nsb; off <<= 1) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float o = __shfl_down_sync(0xFFFFFFFFu, acc[m][0], off);
        if (sb + off < nsb) acc[m][0] += o;
      }
    }
    if (valid && sb == 0) a.act[static_cast<int64_t>(k) * a.inner + row] = SiluQ4K(acc[0][0]) * acc[1][0];
    probe.Stamp(4);
  }
  if (a.pick_counts != nullptr) {
    // Release this block's act rows to the down warps of pick k (OneTokenMoeArgs::pick_counts):
    // every block counts, whether its pick was computable or not.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(a.pick_counts + k, 1);
    }
  }
}

// Bytes of a down warp's act region: nsb padded f32 super-blocks, or with int16 activations nsb
// padded int16 super-blocks and their scales (half as much: with the f32 form's region a down block
// did not fit beside three int16 gate/up blocks), a multiple of 16.
__host__ __device__ constexpr int DownActBytes(int nsb, bool i16) {
  return i16 ? (nsb * (kXqSbStride * 2 + 4) + 15) / 16 * 16 : nsb * kXSbStride * 4;
}

// Kernel 2. grid ceil(h / rps) (rps for the inner-wide rows), W = min(K, kDownMaxWarps) warps;
// warp w computes picks w, w + W, ... Shared memory: [weights: K picks × rps rows][act: W warps ×
// nsb padded super-blocks][Σact: W × nsb × 8][results: K × rps]; with kI16 a warp's act region
// holds its int16 act (nsb × kXqSbStride) and their scales (nsb) instead.
template <int kPer, bool kProbe = false, bool kI16 = false>
__global__ void __launch_bounds__(kDownMaxWarps * 32) OneDownKernel(OneTokenMoeArgs a) {
  const PhaseProbe<kProbe> probe(1);
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float s_p[kPer * 32];
  __shared__ float s_red[kDownMaxWarps];
  __shared__ int s_ids[kOneTokenMaxPicks];
  __shared__ float s_w[kOneTokenMaxPicks];
  __shared__ bool s_ok[kOneTokenMaxPicks];
  const int nsb = a.inner >> 8;
  const int row_bytes = nsb * kSbBytes;
  const int rps = 32 / nsb;
  const int W = blockDim.x >> 5;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int rho = lane / nsb, sb = lane - rho * nsb;
  const int mat_bytes = rps * row_bytes;
  const int xr = DownActBytes(nsb, kI16);  // a warp's act region
  float* xs = reinterpret_cast<float*>(smem + a.K * mat_bytes + warp * xr);
  float* sxs = reinterpret_cast<float*>(smem + a.K * mat_bytes + W * xr) + warp * nsb * 8;
  float* res = reinterpret_cast<float*>(smem + a.K * mat_bytes + W * xr) + W * nsb * 8;
  const int row0 = blockIdx.x * rps;
  const int nrows = min(rps, a.h - row0);

  // Before the wait: routing from the logits (complete before kernel 1 passed its own wait and
  // let this grid start) and the copies of the down rows (constant weights).
  auto route_and_copy = [&] {
    if (a.logit_route) {
      if (warp == 0) {
        WarpPickLogits<kPer>(a.logits, a.E, a.K, s_ids, s_w);
        const float w = PickWeights(s_w, a.K);
        __syncwarp();  // every lane has read s_w
        if (lane < a.K) {
          s_w[lane] = w;
          s_ok[lane] = PickValid(a.table, a.E, s_ids[lane]);
        }
      }
    } else {
      const double picked_sum =
          BlockRoute<kPer>(a.logits, a.E, a.K, s_p, s_red, s_ids, s_w, [] {}, [&](int sub) { probe.Stamp(8 + sub); });
      if (warp == 0 && lane < a.K) {
        s_w[lane] = static_cast<float>(s_w[lane] / picked_sum);
        s_ok[lane] = PickValid(a.table, a.E, s_ids[lane]);
      }
    }
    __syncthreads();
    for (int k = warp; k < a.K; k += W) {
      if (!s_ok[k]) continue;
      const uint8_t* src = static_cast<const uint8_t*>(a.table[s_ids[k]].down) + static_cast<int64_t>(row0) * row_bytes;
      uint8_t* dst = smem + k * mat_bytes;
      const int chunks = nrows * row_bytes / 16;
      for (int c = lane; c < chunks; c += 32) CpAsync16(dst + 16 * c, src + 16 * c);
    }
    CpAsyncCommit();
    probe.Stamp(1);
  };
  // The probe's A/B (SetOneTokenProbe's down_late): routing and copies after the wait instead.
  bool late = false;
  if constexpr (kProbe) late = g_probe.down_late != 0;
  if (!late) route_and_copy();

  // With pick counts each warp waits for its own pick's gate/up blocks instead (below), and the
  // block waits for the whole gate/up grid only before it reads shared and writes y. Allowing the
  // next kernel before that wait keeps pdl.cuh's rule: this grid started once every gate/up block
  // had passed its wait, so the kernels before gate/up have completed, and this grid completes
  // only after its own wait.
  const bool counted = a.pick_counts != nullptr && !late;
  if (counted) {
    PdlAllowNext();
  } else {
    PdlWaitForPrevious();  // act (kernel 1), shared and its gate logit are read from here on
    probe.Stamp(2);
    PdlAllowNext();
  }
  if (late) route_and_copy();
  CpAsyncWait<0>();
  __syncwarp();
  probe.Stamp(3);
  // Gate/up blocks a pick (the gate/up kernel's grid.x).
  const int gate_up_rows = kGateUpWarps * (32 / (a.h >> 8));
  const int gate_up_blocks = (a.inner + gate_up_rows - 1) / gate_up_rows;
  for (int k = warp; k < a.K; k += W) {
    if (!s_ok[k]) continue;  // warp-uniform
    if (counted) WaitPickCount(a.pick_counts + k, gate_up_blocks);
    [[maybe_unused]] int16_t* xq = reinterpret_cast<int16_t*>(xs);
    [[maybe_unused]] float* xsc = reinterpret_cast<float*>(xq + nsb * kXqSbStride);
    if constexpr (kI16) {
      StageQuantizeI16(a.act + static_cast<int64_t>(k) * a.inner, a.inner, xq, xsc, sxs, lane);
      __syncwarp();
      if (k == 0) probe.Stamp(11);
    } else {
      StageRow(a.act + static_cast<int64_t>(k) * a.inner, a.inner, xs, lane, 0, 32);
      __syncwarp();
      if (k == 0) probe.Stamp(11);
      SubBlockSums(xs, nsb, sxs, lane, 32);
    }
    __syncwarp();
    if (k == 0) probe.Stamp(12);
    const bool valid = rho < rps && rho < nrows;
    float acc[1][1] = {{0.0f}};
    if (valid) {
      const uint8_t* wsb[1] = {smem + k * mat_bytes + rho * row_bytes + sb * kSbBytes};
      if constexpr (kI16) {
        DotSuperBlockI16<1>(wsb, xq + sb * kXqSbStride, xsc[sb], sxs + sb * 8, acc);
      } else {
        DotSuperBlock<1, 1>(wsb, xs + sb * kXSbStride, 0, sxs + sb * 8, 0, 1, acc);
      }
    }
    for (int off = 1; off < nsb; off <<= 1) {
      const float o = __shfl_down_sync(0xFFFFFFFFu, acc[0][0], off);
      if (sb + off < nsb) acc[0][0] += o;
    }
    if (valid && sb == 0) res[k * rps + rho] = acc[0][0];
    __syncwarp();  // xs and sxs are restaged for the warp's next pick
    if (k == 0) probe.Stamp(13);
  }
  __syncthreads();
  if (counted) {
    PdlWaitForPrevious();  // gate/up has completed: shared and its gate logit are read below
    probe.Stamp(2);
  }
  probe.Stamp(4);
  const int t = threadIdx.x;
  if (t < nrows) {
    // moe_scatter.cu's sum: picks in order, then the shared term.
    float acc = 0.0f;
    for (int k = 0; k < a.K; ++k) {
      if (s_ok[k]) acc = fmaf(s_w[k], res[k * rps + t], acc);
    }
    if (a.shared != nullptr) {
      float g = 1.0f;
      if (a.shared_gate_logit != nullptr) g = 1.0f / (1.0f + expf(-a.shared_gate_logit[0]));
      acc = fmaf(g, a.shared[row0 + t], acc);
    }
    a.y[row0 + t] = acc;
  }
  probe.Stamp(5);
  if (a.pick_counts != nullptr && t == 0) {
    // Every warp of this block has seen its picks' counts complete (before the block barrier), or
    // waited for the whole gate/up grid: the last block to get here zeroes them for the next
    // launch, which starts after this grid ends.
    if (atomicAdd(a.pick_counts + a.K, 1) == static_cast<int>(gridDim.x) - 1) {
      for (int k = 0; k <= a.K; ++k) a.pick_counts[k] = 0;
    }
  }
}

size_t GateUpSmem(int h, int E, bool i16) {
  const int nsb = h / 256, rps = 32 / nsb;
  return static_cast<size_t>(kGateUpWarps) * 2 * rps * nsb * kSbBytes +
         static_cast<size_t>(nsb) * ((i16 ? 0 : kXSbStride) + 8) * 4 + static_cast<size_t>(E) * 2 * sizeof(void*) +
         (i16 ? static_cast<size_t>(nsb) * (kXqSbStride * 2 + 4) : 0);
}

int DownWarps(int K) { return K < kDownMaxWarps ? K : kDownMaxWarps; }

size_t DownSmem(int K, int inner, bool i16) {
  const int nsb = inner / 256, rps = 32 / nsb;
  return static_cast<size_t>(K) * rps * nsb * kSbBytes +
         static_cast<size_t>(DownWarps(K)) * (DownActBytes(nsb, i16) + nsb * 8 * 4) + static_cast<size_t>(K) * rps * 4;
}

constexpr size_t kMaxSmem = 227 * 1024;

bool Tiles(int cols) { return cols >= 256 && cols % 256 == 0 && cols / 256 <= 32; }

template <int kPer, bool kProbe = false, bool kI16 = false>
cudaError_t LaunchGateUp(const OneTokenMoeArgs& a, cudaStream_t stream) {
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = GateUpSmem(a.h, a.E, kI16);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneGateUpKernel<kPer, kProbe, kI16>, smem, raised); err != cudaSuccess) {
    return err;
  }
  const int rows_per_block = kGateUpWarps * (32 / (a.h / 256));
  const dim3 grid(static_cast<unsigned>((a.inner + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(a.K));
  return LaunchPdl(OneGateUpKernel<kPer, kProbe, kI16>, grid, dim3(kGateUpWarps * 32), smem, stream, a);
}

template <int kPer, bool kProbe = false, bool kI16 = false>
cudaError_t LaunchDown(const OneTokenMoeArgs& a, cudaStream_t stream) {
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = DownSmem(a.K, a.inner, kI16);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneDownKernel<kPer, kProbe, kI16>, smem, raised); err != cudaSuccess) {
    return err;
  }
  const int rps = 32 / (a.inner / 256);
  return LaunchPdl(OneDownKernel<kPer, kProbe, kI16>, dim3(static_cast<unsigned>((a.h + rps - 1) / rps)),
                   dim3(32 * DownWarps(a.K)), smem, stream, a);
}

bool ArgsOk(const OneTokenMoeArgs& a) {
  return OneTokenMoeFits(a.E, a.K, a.h, a.inner) && a.logits != nullptr && a.table != nullptr && a.x != nullptr &&
         a.act != nullptr && a.experts_out != nullptr && a.weights_out != nullptr && a.error != nullptr &&
         a.y != nullptr;
}

// Registers per lane for E logits: the route kernels' buckets.
template <typename F>
cudaError_t DispatchPer(int E, F&& f) {
  if (E <= 128) return f(std::integral_constant<int, 4>{});
  if (E <= 256) return f(std::integral_constant<int, 8>{});
  if (E <= 512) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, kOneTokenMaxExperts / 32>{});
}

}  // namespace

bool OneTokenMoeFits(int E, int K, int h, int inner) {
  return E >= 1 && E <= kOneTokenMaxExperts && K >= 1 && K <= E && K <= kOneTokenMaxPicks && Tiles(h) &&
         Tiles(inner) && GateUpSmem(h, E, false) <= kMaxSmem && GateUpSmem(h, E, true) <= kMaxSmem &&
         DownSmem(K, inner, false) <= kMaxSmem && DownSmem(K, inner, true) <= kMaxSmem;
}

cudaError_t LaunchOneTokenMoeGateUp(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  return DispatchPer(a.E, [&](auto per) {
    return a.int16_activations ? LaunchGateUp<decltype(per)::value, false, true>(a, stream)
                               : LaunchGateUp<decltype(per)::value>(a, stream);
  });
}

cudaError_t LaunchOneTokenMoeDown(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  return DispatchPer(a.E, [&](auto per) {
    return a.int16_activations ? LaunchDown<decltype(per)::value, false, true>(a, stream)
                               : LaunchDown<decltype(per)::value>(a, stream);
  });
}

cudaError_t SetOneTokenProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream, bool down_late) {
  const ProbeState state{stamps, capacity, {0u, 0u}, down_late ? 1u : 0u};
  return cudaMemcpyToSymbolAsync(g_probe, &state, sizeof(state), 0, cudaMemcpyHostToDevice, stream);
}

cudaError_t LaunchOneTokenMoeGateUpProbed(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  if (a.E <= 256 || a.E > 512) return cudaErrorNotSupported;
  return a.int16_activations ? LaunchGateUp<16, true, true>(a, stream) : LaunchGateUp<16, true>(a, stream);
}

cudaError_t LaunchOneTokenMoeDownProbed(const OneTokenMoeArgs& a, cudaStream_t stream) {
  if (!ArgsOk(a)) return cudaErrorInvalidValue;
  if (a.E <= 256 || a.E > 512) return cudaErrorNotSupported;
  return a.int16_activations ? LaunchDown<16, true, true>(a, stream) : LaunchDown<16, true>(a, stream);
}

}  // namespace tandem::cuda
