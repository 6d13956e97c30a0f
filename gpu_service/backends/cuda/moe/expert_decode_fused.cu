// expert_decode_fused.cuh's launches: the grid, the cluster attribute, the dynamic shared memory
// limit, the instantiation by expert count, and the probe's launches. The kernel itself is in
// expert_decode_fused_kernel.cuh.
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"

#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_kernel.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/smem_limit.h"

namespace tandem::cuda {
namespace {

// TANDEM_MOE_LEAN (MoeLean): 0, 1 or 2, 2 by default.
ProcessInteger g_moe_lean{[] { return EnvInteger("TANDEM_MOE_LEAN", 2, 0, 2); }};
std::atomic<uint64_t> g_moe_lean_launches[3] = {0, 0, 0};  // by level

bool FusedShapeOk(int h, int inner) {
  const int nsb = h / 256;
  return h >= 256 && h % 256 == 0 && (nsb == 1 || nsb == 2 || nsb == 4 || nsb == 8) && inner >= 256 &&
         inner % 256 == 0 && inner / 256 <= 32;
}

constexpr int kMaxSmem = 227 * 1024;

// The launch attribute that makes clusters of kFusedCluster blocks along x.
cudaLaunchAttribute ClusterAttribute() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kFusedCluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

template <int kPer, bool kRouter, bool kProbe = false, int kLean = 0>
cudaError_t LaunchFused(const OneTokenMoeArgs& a, const FusedSharedExpert& sh, const FusedRouter& rt,
                        cudaStream_t stream, unsigned long long* probe = nullptr) {
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = static_cast<size_t>(FusedLayout(a.h, a.E).total);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneTokenFusedKernel<kPer, kRouter, kProbe, kLean>, smem, raised);
      err != cudaSuccess) {
    return err;
  }
  const int blocks = OneTokenFusedGridBlocks(a, sh.inner > 0 ? &sh : nullptr, kRouter ? &rt : nullptr);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0] = ClusterAttribute();
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 2;
  return cudaLaunchKernelEx(&config, OneTokenFusedKernel<kPer, kRouter, kProbe, kLean>, a, sh, rt, probe);
}

// The lean form MoeLean asks for where the arguments are its constants (0 where none is): with the
// router in the grid, E in kPer 16's range (257 .. 512), and for 2 the 80B's shapes with the shared
// expert inside (1 where only those differ).
int LeanFormFor(const OneTokenMoeArgs& a, const FusedSharedExpert& sh, const FusedRouter& rt) {
  const int level = MoeLean();
  if (level == 0 || a.E <= 256 || a.E > 512 || a.x_written_earlier || a.pick_warp_by_slot || a.shared != nullptr ||
      !rt.preload) {
    return 0;
  }
  if (level == 2 && (a.h != kMoeLeanHidden || a.inner != kMoeLeanInner || sh.inner != kMoeLeanInner)) return 1;
  return level;
}

// The logit reads' per-lane count by E (WarpPickLogits' kPer).
template <bool kRouter>
cudaError_t LaunchForExperts(const OneTokenMoeArgs& a, const FusedSharedExpert& sh, const FusedRouter& rt,
                             cudaStream_t stream) {
  if (a.E <= 128) return LaunchFused<4, kRouter>(a, sh, rt, stream);
  if (a.E <= 256) return LaunchFused<8, kRouter>(a, sh, rt, stream);
  if (a.E <= 512) return LaunchFused<16, kRouter>(a, sh, rt, stream);
  return LaunchFused<kOneTokenMaxExperts / 32, kRouter>(a, sh, rt, stream);
}

}  // namespace

bool OneTokenFusedFits(int E, int K, int h, int inner) {
  return E >= 1 && E <= kOneTokenMaxExperts && K >= 1 && K <= E && K <= kOneTokenMaxPicks && FusedShapeOk(h, inner) &&
         FusedLayout(h, E).total <= kMaxSmem;
}

bool OneTokenFusedTakesShared(int h, int shared_inner) {
  return FusedShapeOk(h, 256) && h % 512 == 0 && shared_inner >= kFusedSharedSliceCols &&
         shared_inner % kFusedSharedSliceCols == 0;
}

cudaError_t OneTokenFusedMaxActiveClusters(int h, int E, int* clusters) {
  if (E < 1 || E > kOneTokenMaxExperts || !FusedShapeOk(h, 256) || clusters == nullptr) return cudaErrorInvalidValue;
  // One kernel form (the occupancy is the same for every kPer and router form: the same registers
  // and shared memory).
  static std::atomic<size_t> raised{48 * 1024};
  const size_t smem = static_cast<size_t>(FusedLayout(h, E).total);
  if (const cudaError_t err = RaiseDynamicSmemLimit(OneTokenFusedKernel<16, false, false>, smem, raised); err != cudaSuccess) {
    return err;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kFusedCluster * 64);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute = ClusterAttribute();
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaOccupancyMaxActiveClusters(clusters, OneTokenFusedKernel<16, false, false>, &config);
}

namespace {

// LaunchOneTokenMoeFused's checks; *sh and *rt the forms to launch (empty where not given).
cudaError_t CheckFusedArgs(const OneTokenMoeArgs& a, const FusedSharedExpert* shared_expert, const FusedRouter* router,
                           FusedSharedExpert* sh, FusedRouter* rt) {
  if (router != nullptr) {
    *rt = *router;
    // The router rows are E, or E + 1 with the shared gate's row last (then shared_gate_logit must
    // be that row); x is the launch just before's output.
    const bool gate_ok = rt->rows == a.E || (rt->rows == a.E + 1 && a.shared_gate_logit == a.logits + a.E);
    if (rt->w == nullptr || rt->counters == nullptr || rt->logits != a.logits || !gate_ok || a.x_written_earlier ||
        a.h % 128 != 0 || rt->blocks < kFusedCluster || rt->blocks > kFusedRouterMaxBlocks ||
        rt->blocks % kFusedCluster != 0) {
      return cudaErrorInvalidValue;
    }
  }
  if (shared_expert != nullptr) {
    *sh = *shared_expert;
    if (!OneTokenFusedTakesShared(a.h, sh->inner) || sh->gate == nullptr || sh->up == nullptr ||
        sh->down == nullptr || a.shared != nullptr) {
      return cudaErrorInvalidValue;
    }
  }
  if (!OneTokenFusedFits(a.E, a.K, a.h, a.inner) || !a.int16_activations || !a.logit_route || a.logits == nullptr ||
      a.table == nullptr || a.x == nullptr || a.experts_out == nullptr || a.weights_out == nullptr ||
      a.error == nullptr || a.y == nullptr) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchOneTokenMoeFused(const OneTokenMoeArgs& a, const FusedSharedExpert* shared_expert,
                                   cudaStream_t stream, const FusedRouter* router) {
  FusedSharedExpert sh;
  FusedRouter rt;
  if (const cudaError_t err = CheckFusedArgs(a, shared_expert, router, &sh, &rt); err != cudaSuccess) return err;
  if (router == nullptr) return LaunchForExperts<false>(a, sh, rt, stream);
  switch (LeanFormFor(a, sh, rt)) {
    case 1:
      g_moe_lean_launches[1].fetch_add(1, std::memory_order_relaxed);
      return LaunchFused<16, true, false, 1>(a, sh, rt, stream);
    case 2:
      g_moe_lean_launches[2].fetch_add(1, std::memory_order_relaxed);
      return LaunchFused<16, true, false, 2>(a, sh, rt, stream);
    default:
      return LaunchForExperts<true>(a, sh, rt, stream);
  }
}

int MoeLean() { return static_cast<int>(g_moe_lean.value()); }
void SetMoeLean(int level) { g_moe_lean.set(level); }
uint64_t MoeLeanLaunches(int level) {
  return level >= 1 && level <= 2 ? g_moe_lean_launches[level].load(std::memory_order_relaxed) : 0;
}

int OneTokenFusedGridBlocks(const OneTokenMoeArgs& a, const FusedSharedExpert* shared_expert,
                            const FusedRouter* router) {
  return kFusedCluster * (a.K * a.inner / kFusedSliceCols +
                          (shared_expert != nullptr ? shared_expert->inner / kFusedSharedSliceCols : 0)) +
         (router != nullptr ? router->blocks : 0);
}

namespace {

// The kProbe instantiation with its stamps in `stamps`, or (nullptr) in the armed buffer.
cudaError_t LaunchProbedForm(const OneTokenMoeArgs& a, const FusedSharedExpert* shared_expert, cudaStream_t stream,
                             const FusedRouter* router, unsigned long long* stamps) {
  FusedSharedExpert sh;
  FusedRouter rt;
  if (const cudaError_t err = CheckFusedArgs(a, shared_expert, router, &sh, &rt); err != cudaSuccess) return err;
  if (!OneTokenFusedProbeTakes(a.E)) return cudaErrorNotSupported;  // one instantiation (kPer 16)
  if (router != nullptr) return LaunchFused<16, true, true>(a, sh, rt, stream, stamps);
  return LaunchFused<16, false, true>(a, sh, rt, stream, stamps);
}

}  // namespace

cudaError_t LaunchOneTokenMoeFusedProbed(const OneTokenMoeArgs& a, const FusedSharedExpert* shared_expert,
                                         cudaStream_t stream, const FusedRouter* router,
                                         unsigned long long* stamps) {
  if (stamps == nullptr) return cudaErrorInvalidValue;
  return LaunchProbedForm(a, shared_expert, stream, router, stamps);
}

cudaError_t LaunchOneTokenMoeFusedArmedProbe(const OneTokenMoeArgs& a, const FusedSharedExpert* shared_expert,
                                             cudaStream_t stream, const FusedRouter* router) {
  return LaunchProbedForm(a, shared_expert, stream, router, nullptr);
}

cudaError_t SetFusedMoeProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(g_fused_moe_probe, g_fused_moe_probe_count, stamps, capacity, stream);
}

}  // namespace tandem::cuda
