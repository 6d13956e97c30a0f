// Device pieces of the hd-256 wgmma prefill attention kernels (attention_tc_wgmma.cu: K and V
// staged as f32 and converted in the block; attention_kv16.cu: K and V converted once per call
// into f16 tiles and copied as they are): the shared-memory tile layouts, the Q conversion, the
// S = Q·K^T and O += P·V wgmma issues and P's register fragments. Both kernels run these same
// instructions on the same f16 operand bytes, so their outputs are bit-identical. Device code
// only; internal to the kernels folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_WGMMA_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_WGMMA_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/attention_tc.cuh"
#include "gpu_service/backends/cuda/kernels/attention_tc_common.cuh"
#include "gpu_service/backends/cuda/mma_f16.cuh"
#include "gpu_service/backends/cuda/wgmma_f16.cuh"

namespace tandem::cuda::attn_wg {

inline constexpr int kHd = 256, kKeys = attn_tc::kTileKeys, kThreads = 256, kWgRows = 64;
static_assert(kTcRows == 2 * kWgRows, "two warpgroups of 64 query rows");
static_assert(kKeys == 64 && kThreads == 4 * kKeys, "the staging mappings assume 64 keys and 256 threads");

// Q: f16, K-major 128-byte swizzle, 4 slabs of 64 head dims, each kTcRows rows x 128 B. K tile:
// the same layout, 4 slabs of 64 keys x 128 B. Vt tile: V transposed, [256 dims][64 keys], one
// slab of 256 rows x 128 B (row = dim, 16-byte chunk = key octet).
inline constexpr uint32_t kQSlab = kTcRows * 128, kKSlab = kKeys * 128;
inline constexpr uint32_t kQBytes = (kHd / 64) * kQSlab, kKBytes = (kHd / 64) * kKSlab, kVtBytes = kHd * 128;

// 4 f32 as f16 at shared byte offset `at` of `smem` (8 bytes).
__device__ __forceinline__ void StoreF16x4(uint8_t* smem, uint32_t at, float4 v) {
  *reinterpret_cast<uint2*>(smem + at) = make_uint2(PackF16x2(v.x, v.y), PackF16x2(v.z, v.w));
}

// Byte offset, in a K-major swizzled tile of `slab` bytes per 64 columns, of f16 columns 4c .. 4c + 3 of
// row r (8 bytes: half of a 16-byte chunk).
__device__ __forceinline__ uint32_t SwizzledQuad(int r, int c, uint32_t slab) {
  return (c >> 4) * slab + wgmma::SwizzledOffset(r, (c & 15) >> 1) + ((c & 1) << 3);
}

// The block's kTcRows query rows as f16 into the Q slabs at smem + q_off (zeros past the item's
// tokens).
__device__ __forceinline__ void LoadQ(uint8_t* smem, uint32_t q_off, const float* q, int32_t first, int32_t count,
                                      int groups, int nh, int kvhead, int tid) {
#pragma unroll 8
  for (int e = tid; e < kTcRows * (kHd / 4); e += kThreads) {
    const int r = e / (kHd / 4), c = e % (kHd / 4), tok = r / groups;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tok < count) {
      x = *reinterpret_cast<const float4*>(q + attn_tc::QueryRow(first, tok, r, groups, nh, kvhead) * kHd + 4 * c);
    }
    StoreF16x4(smem, q_off + SwizzledQuad(r, c, kQSlab), x);
  }
}

// Issues S = Q·K^T for the warpgroup's 64 rows (q_wg: its rows of the Q slabs) against the K tile
// at shared address k_tile: 16 wgmma m64n64k16 into s (zeroed by the caller), one commit group.
__device__ __forceinline__ void IssueScores(float (&s)[kKeys / 2], uint32_t q_wg, uint32_t k_tile) {
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < kHd / 16; ++kk) {
    const uint32_t k_off = 32 * (kk & 3);  // k16 slice kk % 4 within slab kk / 4 (64 dims)
    wgmma::WgmmaN64(s, wgmma::SwizzledDesc(q_wg + (kk >> 2) * kQSlab + k_off),
                    wgmma::SwizzledDesc(k_tile + (kk >> 2) * kKSlab + k_off), kk > 0);
  }
  wgmma::Commit();
}

// P as the register A fragments of its 4 k16 slices (wgmma_f16.cuh, WgmmaRegA).
__device__ __forceinline__ void PackP(const float (&s)[kKeys / 2], uint32_t (&a)[kKeys / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    a[kk][0] = PackF16x2(s[8 * kk], s[8 * kk + 1]);
    a[kk][1] = PackF16x2(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = PackF16x2(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = PackF16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// Issues O += P·V from the Vt tile at shared address vt_tile: 4 wgmma m64n256k16, one commit group.
__device__ __forceinline__ void IssuePv(float (&acc)[kHd / 2], uint32_t (&a)[kKeys / 16][4], uint32_t vt_tile) {
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    wgmma::WgmmaRegA<kHd>::Run(acc, a[kk], wgmma::SwizzledDesc(vt_tile + 32 * kk), 1);
  }
  wgmma::Commit();
}

// Uses the register A fragments after the wgmma wait: the compiler keeps them (and gives their
// registers to nothing else) until the asynchronous wgmmas that read them have completed.
__device__ __forceinline__ void KeepLive(uint32_t (&a)[kKeys / 16][4]) {
#pragma unroll
  for (int i = 0; i < kKeys / 16; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
  }
}

// The dynamic shared memory's start rounded up to 1024 bytes, where the 128-byte swizzle's pattern
// starts over (the launches ask for 1024 bytes of slack).
__device__ __forceinline__ uint8_t* AlignedSmem(uint8_t* raw) {
  return raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(raw)) & 1023)) & 1023);
}

// The position of each of the block's kTcRows query rows (row r: token r / groups of the item, -1
// past its count), for the causal mask.
__device__ __forceinline__ void LoadRowPositions(int32_t* row_pos, int tid, int groups, int32_t count,
                                                 const int32_t* token_pos, int32_t first) {
  if (tid < kTcRows) row_pos[tid] = tid / groups < count ? token_pos[first + tid / groups] : -1;
}

}  // namespace tandem::cuda::attn_wg

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_TC_WGMMA_CUH_
