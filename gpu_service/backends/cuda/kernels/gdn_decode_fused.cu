// gdn_decode_fused.cuh's launches: the plans (cluster shape, dynamic shared memory, the kIn form's
// ring), the checks of their arguments, and the process switches that choose the GDN decode path.
// The kernel itself is in gdn_decode_fused_kernel.cuh.
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/gdn_decode_fused_kernel.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode_out_probe.h"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/step_probe.h"

namespace tandem::cuda {
namespace {

// The kernel's kLean instantiations where the arguments are theirs (GdnLean: TANDEM_GDN_LEAN, 0, 1
// or 2, 2 by default).
ProcessInteger g_gdn_lean{[] { return EnvInteger("TANDEM_GDN_LEAN", 2, 0, 2); }};
std::atomic<uint64_t> g_gdn_lean_launches[3] = {0, 0, 0};  // by level

// The kIn form's dynamic shared memory limit: half an SM's shared memory less a block's reserve and
// the kernel's static shared memory, so that two blocks fit an SM (0 when these cannot be read).
template <int kDk>
int InMaxDynamicSmem() {
  static const int bytes = [] {
    int dev = 0, per_sm = 0, reserved = 0;
    cudaFuncAttributes f{};
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&f, GdnDecodeFusedKernel<kDk, true, true, true>) != cudaSuccess) {
      return 0;
    }
    return per_sm / 2 - reserved - static_cast<int>(f.sharedSizeBytes);
  }();
  return bytes;
}

// The kernel's clusters: the value heads of one key head group, all their column blocks.
cudaLaunchAttribute ClusterOf(const GdnShape& d) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(d.nv / d.nk);
  attribute.val.clusterDim.y = static_cast<unsigned>(d.dv / kCols);
  attribute.val.clusterDim.z = 1;
  return attribute;
}

template <int kDk, bool kGated, bool kOut = false, bool kIn = false>
cudaError_t Launch(const GdnDecodeFusedArgs& a, int64_t n, const GdnShape& d, cudaStream_t stream,
                   const GdnInProduct& in = {}) {
  // The q/k norms' sums of squares as the LaunchGdnPrepare kernel of n tokens forms them.
  const bool qk_x_first = n < kGdnPrepareShortRunBelow;
  const int lean = kOut && !kIn ? GdnLean() : 0;  // read once: the attribute and the launch agree
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(d.nv), static_cast<unsigned>(d.dv / kCols), static_cast<unsigned>(n));
  config.blockDim = dim3(32, kWarps);
  config.dynamicSmemBytes = 0;
  if constexpr (kIn) {
    static const cudaError_t attr = cudaFuncSetAttribute(GdnDecodeFusedKernel<kDk, true, true, true>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, InMaxDynamicSmem<kDk>());
    if (attr != cudaSuccess) return attr;
    config.dynamicSmemBytes = static_cast<size_t>(in.smem.end);
  } else if constexpr (kOut) {
    static const cudaError_t attr =
        cudaFuncSetAttribute(GdnDecodeFusedKernel<kDk, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(OutSharedBytes(kMaxOutRowsPerBlock)));
    if (attr != cudaSuccess) return attr;
    static const cudaError_t probe_attr =
        cudaFuncSetAttribute(GdnDecodeFusedKernel<kDk, true, true, false, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(OutSharedBytes(kMaxOutRowsPerBlock)));
    if (a.out_probe && probe_attr != cudaSuccess) return probe_attr;
    static const cudaError_t lean_attr =
        cudaFuncSetAttribute(GdnDecodeFusedKernel<kDk, true, true, false, false, 1>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(OutSharedBytes(kMaxOutRowsPerBlock)));
    if (lean >= 1 && lean_attr != cudaSuccess) return lean_attr;
    if constexpr (kDk == kGdnLeanDk) {
      static const cudaError_t shapes_attr =
          cudaFuncSetAttribute(GdnDecodeFusedKernel<kDk, true, true, false, false, 2>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(OutSharedBytes(kMaxOutRowsPerBlock)));
      if (lean == 2 && shapes_attr != cudaSuccess) return shapes_attr;
    }
    config.dynamicSmemBytes = OutSharedBytes(a.out_rows / kOutClusterBlocks);
  }
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0] = ClusterOf(d);
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // as LaunchPdl (pdl.cuh)
  attribute[1].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  config.attrs = attribute;
  config.numAttrs = 2;
  // q's scale as LaunchGdnPrepare computes it (host rsqrtf), so the same bits.
  const float q_scale = rsqrtf(static_cast<float>(d.dk));
  if constexpr (kOut && !kIn) {
    if (a.out_probe) {  // the stamped instantiation (gdn_decode_out_probe.h)
      return cudaLaunchKernelEx(&config, GdnDecodeFusedKernel<kDk, kGated, true, false, true>, a, d.nk, d.nv, d.dv, d.kk,
                                q_scale, qk_x_first, !OldGdnEarlyState(), in);
    }
    if (lean >= 1 && a.out_one_barrier && a.rows_polled && a.out_bulk && qk_x_first && !OldGdnEarlyState()) {
      if constexpr (kDk == kGdnLeanDk) {
        if (lean == 2 && d.nk == kGdnLeanNk && d.nv == kGdnLeanNv && d.dv == kGdnLeanDv && d.kk == kGdnLeanKk) {
          g_gdn_lean_launches[2].fetch_add(1, std::memory_order_relaxed);
          return cudaLaunchKernelEx(&config, GdnDecodeFusedKernel<kDk, kGated, true, false, false, 2>, a, d.nk, d.nv,
                                    d.dv, d.kk, q_scale, qk_x_first, true, in);
        }
      }
      g_gdn_lean_launches[1].fetch_add(1, std::memory_order_relaxed);
      return cudaLaunchKernelEx(&config, GdnDecodeFusedKernel<kDk, kGated, true, false, false, 1>, a, d.nk, d.nv,
                                d.dv, d.kk, q_scale, qk_x_first, true, in);
    }
  }
  return cudaLaunchKernelEx(&config, GdnDecodeFusedKernel<kDk, kGated, kOut, kIn>, a, d.nk, d.nv, d.dv, d.kk, q_scale,
                            qk_x_first, !OldGdnEarlyState(), in);
}

}  // namespace

namespace {

// The launch's arguments with the row strides left 0 set to the packed ones.
GdnDecodeFusedArgs WithDefaultStrides(const GdnDecodeFusedArgs& args, const GdnShape& d) {
  GdnDecodeFusedArgs a = args;
  if (a.qkv_stride == 0) a.qkv_stride = d.c_dim();
  if (a.ba_stride == 0) a.ba_stride = 2 * static_cast<int64_t>(d.nv);
  if (a.z_stride == 0) a.z_stride = static_cast<int64_t>(d.nv) * d.dv;
  return a;
}

// Every input a launch reads is given, its rows at least their packed width apart (z and the norm's
// weights only with the gated norm).
bool InputsOk(const GdnDecodeFusedArgs& a, const GdnShape& d, bool gated_norm) {
  if (a.qkv == nullptr || a.ba == nullptr || a.taps == nullptr || a.ssm_a == nullptr || a.dt_bias == nullptr ||
      a.history == nullptr || a.state == nullptr || a.rows == nullptr || a.qkv_stride < d.c_dim() ||
      a.ba_stride < 2 * d.nv) {
    return false;
  }
  return !gated_norm || (a.z != nullptr && a.norm != nullptr && a.z_stride >= static_cast<int64_t>(d.nv) * d.dv);
}

}  // namespace

bool GdnDecodeFusedFits(const GdnShape& d) {
  if (d.dk != 64 && d.dk != 128) return false;
  if (d.dv != 32 && d.dv != 64 && d.dv != 128) return false;
  if (d.nk <= 0 || d.nv <= 0 || d.nv % d.nk != 0 || d.nv > kMaxNv) return false;
  if (d.kk < 1 || d.kk > kGdnMaxConvKernel) return false;
  return (d.nv / d.nk) * (d.dv / kCols) <= kMaxClusterBlocks;
}

cudaError_t LaunchGdnDecodeFused(const GdnDecodeFusedArgs& args, int64_t n, const GdnShape& d, bool gated_norm,
                                 cudaStream_t stream) {
  if (!GdnDecodeFusedFits(d)) return cudaErrorNotSupported;
  if (n <= 0) return cudaSuccess;
  const GdnDecodeFusedArgs a = WithDefaultStrides(args, d);
  if (n > 65535 || a.o == nullptr || !InputsOk(a, d, gated_norm)) return cudaErrorInvalidValue;
  if (d.dk == 128) {
    return gated_norm ? Launch<128, true>(a, n, d, stream) : Launch<128, false>(a, n, d, stream);
  }
  return gated_norm ? Launch<64, true>(a, n, d, stream) : Launch<64, false>(a, n, d, stream);
}

bool GdnDecodeOutFits(const GdnShape& d, const DeviceMatrix& out) {
  if (!GdnDecodeFusedFits(d) || (d.nv / d.nk) * d.dv != kOutCols) return false;
  if (out.cols != static_cast<int64_t>(d.nv) * d.dv) return false;
  if (out.rows <= 0 || out.rows % kOutClusterBlocks != 0 || out.rows / kOutClusterBlocks > kMaxOutRowsPerBlock) {
    return false;
  }
  return Q8_0x8RowsAligned(out);
}

cudaError_t LaunchGdnDecodeFusedOut(const GdnDecodeFusedArgs& args, const DeviceMatrix& out, float* out_y,
                                    const GdnShape& d, cudaStream_t stream, const void* out_by_columns,
                                    int64_t by_columns_rows) {
  if (!GdnDecodeOutFits(d, out)) return cudaErrorNotSupported;
  GdnDecodeFusedArgs a = WithDefaultStrides(args, d);
  if (by_columns_rows == 0) by_columns_rows = out.rows;
  if (out_y == nullptr || !InputsOk(a, d, /*gated_norm=*/true) ||
      reinterpret_cast<uintptr_t>(out_by_columns) % 16 != 0 || by_columns_rows < out.rows ||
      (by_columns_rows != out.rows && (out_by_columns == nullptr || by_columns_rows % kOutClusterBlocks != 0 ||
                                       by_columns_rows / kOutClusterBlocks > kMaxOutRowsPerBlock))) {
    return cudaErrorInvalidValue;
  }
  if (out_by_columns != nullptr) {
    a.out_w = static_cast<const uint8_t*>(out_by_columns);
    a.out_row_bytes = kOutSuperBytes;
    a.out_group_bytes = by_columns_rows * kOutSuperBytes;
    a.out_bulk = GdnOutBulk();
  } else {
    a.out_w = static_cast<const uint8_t*>(out.data);
    a.out_row_bytes = out.row_bytes;
    a.out_group_bytes = kOutSuperBytes;
  }
  a.out_rows = static_cast<int>(by_columns_rows);
  a.out_y = out_y;
  a.out_one_barrier = GdnOutOneBarrier();
  a.out_probe = ProbeDecodeStep();  // gdn_decode_out_probe.h
  return d.dk == 128 ? Launch<128, true, true>(a, 1, d, stream) : Launch<64, true, true>(a, 1, d, stream);
}

namespace {

// The kIn form's product and shared memory for these arguments; slots 0 where it does not fit.
GdnInProduct InPlan(const GdnDecodeFusedArgs& a, const GdnShape& d, const GdnDecodeIn& in) {
  GdnInProduct p;
  const DeviceMatrix& w = in.w;
  p.w = static_cast<const uint8_t*>(w.data);
  p.row_bytes = w.row_bytes;
  p.cols = static_cast<int>(w.cols);
  p.qkv_row0 = static_cast<int>(in.qkv_row0);
  p.ba_row0 = static_cast<int>(in.ba_row0);
  p.rows = in.rows;
  p.probe = in.probe;
  p.H = in.norm.H;
  p.y = in.norm.y;
  p.shared = in.norm.sh.shared;
  p.gate_logit = in.norm.sh.gate_logit;
  p.gamma = in.norm.gamma;
  p.eps = in.norm.eps;
  p.h_early = in.norm.h_written_earlier && !OldNormEarlyH();  // as the norm-in product's
  const norm_row::RegSplit split = norm_row::RegSplitFor(w.cols / 4);
  p.norm_vec = split.vec;
  p.norm_threads = split.threads;
  const int max_smem = d.dk == 128 ? InMaxDynamicSmem<128>() : InMaxDynamicSmem<64>();
  // Only the gathered outputs before the ring: ssm_out's rows take the ring's place after the product.
  const int base = static_cast<int>(OutSharedBytes(0));
  const int fixed = InSharedLayout(base, w.row_bytes, 0, p.cols).end;
  const int64_t slot_bytes = kInChunkRows * w.row_bytes;
  const int64_t slots = std::min<int64_t>(kInMaxSlots, (max_smem - fixed) / slot_bytes);
  p.slots = slots >= 2 ? static_cast<int>(slots) : 0;
  p.smem = InSharedLayout(base, w.row_bytes, p.slots, p.cols);
  // ssm_out's rows take the ring, the norm's area and x's int16 once the product is done.
  if (static_cast<int64_t>(a.out_rows / kOutClusterBlocks) * kOutSuperBytes > p.smem.xscale - p.smem.ring) p.slots = 0;
  return p;
}

}  // namespace

bool GdnDecodeLayerFits(const GdnShape& d, const DeviceMatrix& out, const DeviceMatrix& in_w, int64_t by_columns_rows) {
  if (!GdnDecodeOutFits(d, out) || !Q8_0x8RowsAligned(in_w) || in_w.cols > kInMaxCols) return false;
  if (in_w.rows != static_cast<int64_t>(d.nv) * d.dv + d.c_dim() + 2 * d.nv || in_w.rows > (int64_t{1} << 30)) {
    return false;
  }
  const norm_row::RegSplit split = norm_row::RegSplitFor(in_w.cols / 4);
  if (split.vec == 0 || split.threads > kThreads) return false;
  GdnDecodeFusedArgs a;
  a.out_rows = static_cast<int>(by_columns_rows == 0 ? out.rows : by_columns_rows);
  GdnDecodeIn in;
  in.w = in_w;
  return InPlan(a, d, in).slots > 0;
}

cudaError_t LaunchGdnDecodeLayer(const GdnDecodeFusedArgs& args, const DeviceMatrix& out, float* out_y,
                                 const GdnShape& d, const GdnDecodeIn& in, cudaStream_t stream,
                                 const void* out_by_columns, int64_t by_columns_rows) {
  if (by_columns_rows == 0) by_columns_rows = out.rows;
  if (!GdnDecodeLayerFits(d, out, in.w, by_columns_rows)) return cudaErrorNotSupported;
  const int64_t vw = static_cast<int64_t>(d.nv) * d.dv;
  if (in.qkv_row0 != vw || in.ba_row0 != vw + d.c_dim() || in.rows == nullptr || in.norm.H == nullptr ||
      in.norm.gamma == nullptr || (in.norm.sh.shared != nullptr && in.norm.y == nullptr) ||
      out_by_columns == nullptr || !GdnOutBulk()) {
    return cudaErrorInvalidValue;
  }
  // The fused kernel's inputs are the product's rows.
  GdnDecodeFusedArgs a = args;
  a.z = in.rows;
  a.qkv = in.rows + in.qkv_row0;
  a.ba = in.rows + in.ba_row0;
  a.z_stride = a.qkv_stride = a.ba_stride = in.w.rows;
  a = WithDefaultStrides(a, d);
  if (out_y == nullptr || !InputsOk(a, d, /*gated_norm=*/true) || reinterpret_cast<uintptr_t>(out_by_columns) % 16 != 0 ||
      by_columns_rows < out.rows || by_columns_rows % kOutClusterBlocks != 0 ||
      by_columns_rows / kOutClusterBlocks > kMaxOutRowsPerBlock) {
    return cudaErrorInvalidValue;
  }
  a.out_w = static_cast<const uint8_t*>(out_by_columns);
  a.out_row_bytes = kOutSuperBytes;
  a.out_group_bytes = by_columns_rows * kOutSuperBytes;
  a.out_bulk = true;
  a.out_rows = static_cast<int>(by_columns_rows);
  a.out_y = out_y;
  const GdnInProduct p = InPlan(a, d, in);
  return d.dk == 128 ? Launch<128, true, true, true>(a, 1, d, stream, p) : Launch<64, true, true, true>(a, 1, d, stream, p);
}

cudaError_t GdnDecodeOutMaxActiveClusters(const GdnShape& d, const DeviceMatrix& out, int64_t by_columns_rows,
                                          const DeviceMatrix* in_w, int* clusters) {
  if (by_columns_rows == 0) by_columns_rows = out.rows;
  if (clusters == nullptr || !GdnDecodeOutFits(d, out) || d.dk != 128 ||
      (in_w != nullptr && !GdnDecodeLayerFits(d, out, *in_w, by_columns_rows))) {
    return cudaErrorInvalidValue;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(d.nv), static_cast<unsigned>(d.dv / kCols), 1);
  config.blockDim = dim3(32, kWarps);
  cudaLaunchAttribute attribute = ClusterOf(d);
  config.attrs = &attribute;
  config.numAttrs = 1;
  GdnDecodeFusedArgs a;
  a.out_rows = static_cast<int>(by_columns_rows);
  if (in_w != nullptr) {
    GdnDecodeIn in;
    in.w = *in_w;
    config.dynamicSmemBytes = static_cast<size_t>(InPlan(a, d, in).smem.end);
    auto kernel = GdnDecodeFusedKernel<128, true, true, true>;
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   InMaxDynamicSmem<128>());
        e != cudaSuccess) {
      return e;
    }
    return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
  }
  config.dynamicSmemBytes = OutSharedBytes(a.out_rows / kOutClusterBlocks);
  auto kernel = GdnDecodeFusedKernel<128, true, true, false>;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(OutSharedBytes(kMaxOutRowsPerBlock)));
      e != cudaSuccess) {
    return e;
  }
  return cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
}

cudaError_t SetGdnOutProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream) {
  return ArmStampRows(g_gdn_out_probe, g_gdn_out_probe_count, stamps, capacity, stream);
}

namespace {
ProcessSwitch g_gdn_decode_layer_one{[] { return EnvSwitch("TANDEM_GDN_LAYER_ONE"); }};

// TANDEM_GDN_DECODE_FUSED: 0 .. 4 (anything else: 3).
ProcessInteger g_gdn_decode_fused{[] { return EnvInteger("TANDEM_GDN_DECODE_FUSED", 3, 0, 4); }};

ProcessSwitch g_old_gdn_early_state{[] { return EnvSwitch("TANDEM_OLD_GDN_EARLY_STATE"); }};
ProcessSwitch g_gdn_out_bulk{[] { return EnvSwitchDefaultOn("TANDEM_GDN_OUT_BULK"); }};
ProcessSwitch g_gdn_out_one_barrier{[] { return EnvSwitchDefaultOn("TANDEM_GDN_OUT_ONE_BARRIER"); }};
ProcessSwitch g_gdn_rows_polled{[] { return EnvSwitchDefaultOn("TANDEM_GDN_ROWS_POLLED"); }};
}  // namespace

int GdnLean() { return static_cast<int>(g_gdn_lean.value()); }
void SetGdnLean(int level) { g_gdn_lean.set(level); }
uint64_t GdnLeanLaunches(int level) {
  return level >= 1 && level <= 2 ? g_gdn_lean_launches[level].load(std::memory_order_relaxed) : 0;
}

bool GdnRowsPolled() { return g_gdn_rows_polled.on(); }
void SetGdnRowsPolled(bool on) { g_gdn_rows_polled.set(on); }

bool GdnOutOneBarrier() { return g_gdn_out_one_barrier.on(); }
void SetGdnOutOneBarrier(bool on) { g_gdn_out_one_barrier.set(on); }
bool GdnOutBulk() { return g_gdn_out_bulk.on(); }
void SetGdnOutBulk(bool on) { g_gdn_out_bulk.set(on); }
bool OldGdnEarlyState() { return g_old_gdn_early_state.on(); }
void SetOldGdnEarlyState(bool on) { g_old_gdn_early_state.set(on); }
bool GdnDecodeLayerOne() { return g_gdn_decode_layer_one.on(); }
void SetGdnDecodeLayerOne(bool on) { g_gdn_decode_layer_one.set(on); }
int GetGdnDecodeFused() { return static_cast<int>(g_gdn_decode_fused.value()); }
void SetGdnDecodeFused(int mode) { g_gdn_decode_fused.set(mode); }

}  // namespace tandem::cuda
