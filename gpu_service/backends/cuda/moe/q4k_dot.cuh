// Q4_K super-block dot products shared by the tile kernels of the decode path (expert_decode_q4k.cu)
// and the one-token MoE kernels (expert_decode_one.cu), so that both compute bit-identical rows.
// Geometry and decode described in expert_decode_q4k.cuh. Device code only (include from .cu files).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_Q4K_DOT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_Q4K_DOT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/dequant.cuh"
#include "gpu_service/backends/cuda/dp2a.cuh"

namespace tandem::cuda::q4k {

constexpr int kSbBytes = 144;       // Q4_K super-block: f16 d, f16 dmin, 12 scale bytes, 128 qs bytes
constexpr int kXSbStride = 260;     // floats per 256 activations in shared memory (4 of padding)

__device__ __forceinline__ void CpAsync16(void* smem, const void* global) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global) : "memory");
}

// Σ of the 32 activations of sub-block k % 8 of super-block k / 8 in a row staged in shared memory
// with kXSbStride floats a super-block: the Σx the dot product's min term takes.
__device__ __forceinline__ float StagedSubBlockSum(const float* xs, int k) {
  const float4* p = reinterpret_cast<const float4*>(xs + (k >> 3) * kXSbStride + (k & 7) * 32);
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const float4 v = p[c];
    s += (v.x + v.y) + (v.z + v.w);
  }
  return s;
}

__device__ __forceinline__ float SiluQ4K(float g) { return g * (1.0f / (1.0f + expf(-g))); }

// Byte b of `word` (< 256) as an exact float: 2^23 + byte by a permute, minus 2^23.
__device__ __forceinline__ float ByteAsFloat(uint32_t word, int b) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540 + b)) - 8388608.0f;
}

// Byte b of `shifted` holds a nibble q in its bits 3..6: returns 0.5 + q / 32 (the byte lands in
// bits 16..23 of 0x3F000000, so q fills mantissa bits 19..22 and the exponent stays 2^-1).
__device__ __forceinline__ float NibbleValue(uint32_t shifted, int b) {
  return __uint_as_float(__byte_perm(shifted, 0x3F000000u, 0x7044 | (b << 8)));
}

// A Q4_K super-block's 16-byte head: f16 d and dmin, and the 8 six-bit scales and 8 mins of ggml's
// get_scale_min_k4 packed four to a word (sub-blocks 0..3 and 4..7).
struct Q4KHead {
  float d, dmin;
  uint32_t sc_lo, m_lo, sc_hi, m_hi;
};
__device__ __forceinline__ Q4KHead LoadQ4KHead(const uint8_t* sb) {
  const uint4 head = *reinterpret_cast<const uint4*>(sb);
  Q4KHead h;
  h.d = HalfBits(static_cast<uint16_t>(head.x & 0xFFFF));
  h.dmin = HalfBits(static_cast<uint16_t>(head.x >> 16));
  h.sc_lo = head.y & 0x3F3F3F3Fu;
  h.m_lo = head.z & 0x3F3F3F3Fu;
  h.sc_hi = (head.w & 0x0F0F0F0Fu) | ((head.y >> 2) & 0x30303030u);
  h.m_hi = ((head.w >> 4) & 0x0F0F0F0Fu) | ((head.z >> 2) & 0x30303030u);
  return h;
}
// Sub-block j's scale and min as exact floats.
__device__ __forceinline__ float SubScale(const Q4KHead& h, int j) { return ByteAsFloat(j < 4 ? h.sc_lo : h.sc_hi, j & 3); }
__device__ __forceinline__ float SubMin(const Q4KHead& h, int j) { return ByteAsFloat(j < 4 ? h.m_lo : h.m_hi, j & 3); }

// qs bytes 32g .. 32g + 31 of a super-block as eight words: low nibbles are elements 64g + i
// (sub-block 2g), high nibbles elements 64g + 32 + i (sub-block 2g + 1).
__device__ __forceinline__ void LoadQ4KQs(const uint8_t* sb, int g, uint32_t (&q)[8]) {
  const uint4 a = *reinterpret_cast<const uint4*>(sb + 16 + 32 * g);
  const uint4 b = *reinterpret_cast<const uint4*>(sb + 32 + 32 * g);
  q[0] = a.x; q[1] = a.y; q[2] = a.z; q[3] = a.w;
  q[4] = b.x; q[5] = b.y; q[6] = b.z; q[7] = b.w;
}

// Accumulates one super-block of kMats matrices (the lane's rows) against kR activation rows:
// acc[m][r] += Σ_i w_m[i]·x_r[i] over its 256 elements. wsb[m]: the super-block in shared memory;
// xsb: activation row 0's 256 elements (row r at + r·xstride); sx: its 8 sub-block sums (row r
// at + r·sxstride). Rows r >= nr are skipped (nr uniform over the warp).
template <int kR, int kMats>
__device__ __forceinline__ void DotSuperBlock(const uint8_t* const (&wsb)[kMats], const float* xsb, int xstride,
                                              const float* sx, int sxstride, int nr, float (&acc)[kMats][kR]) {
  // Per matrix: its head, d·32 and d·16.
  Q4KHead hd[kMats];
  float d32[kMats], d16[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    hd[m] = LoadQ4KHead(wsb[m]);
    d32[m] = 32.0f * hd[m].d;
    d16[m] = 16.0f * hd[m].d;
  }
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    uint32_t q[kMats][8];
#pragma unroll
    for (int m = 0; m < kMats; ++m) LoadQ4KQs(wsb[m], g, q[m]);
    float s_lo[kMats][kR], s_hi[kMats][kR];
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int r = 0; r < kR; ++r) s_lo[m][r] = s_hi[m][r] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float vl[kMats][4], vh[kMats][4];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        const uint32_t lo3 = (q[m][k] << 3) & 0x78787878u;
        const uint32_t hi3 = (q[m][k] >> 1) & 0x78787878u;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          vl[m][b] = NibbleValue(lo3, b);
          vh[m][b] = NibbleValue(hi3, b);
        }
      }
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r < nr) {
          const float4 xl = *reinterpret_cast<const float4*>(xsb + r * xstride + 64 * g + 4 * k);
          const float4 xh = *reinterpret_cast<const float4*>(xsb + r * xstride + 64 * g + 32 + 4 * k);
#pragma unroll
          for (int m = 0; m < kMats; ++m) {
            s_lo[m][r] = fmaf(vl[m][0], xl.x, s_lo[m][r]);
            s_lo[m][r] = fmaf(vl[m][1], xl.y, s_lo[m][r]);
            s_lo[m][r] = fmaf(vl[m][2], xl.z, s_lo[m][r]);
            s_lo[m][r] = fmaf(vl[m][3], xl.w, s_lo[m][r]);
            s_hi[m][r] = fmaf(vh[m][0], xh.x, s_hi[m][r]);
            s_hi[m][r] = fmaf(vh[m][1], xh.y, s_hi[m][r]);
            s_hi[m][r] = fmaf(vh[m][2], xh.z, s_hi[m][r]);
            s_hi[m][r] = fmaf(vh[m][3], xh.w, s_hi[m][r]);
          }
        }
      }
    }
    // Sub-block j: Σ w·x = d·sc·Σ q·x − dmin·m·Σx = 32·d·sc·Σ v·x − (16·d·sc + dmin·m)·Σx.
    const int j0 = 2 * g, j1 = 2 * g + 1;
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      const float sc0 = SubScale(hd[m], j0), mn0 = SubMin(hd[m], j0);
      const float sc1 = SubScale(hd[m], j1), mn1 = SubMin(hd[m], j1);
      const float c1_lo = d32[m] * sc0, c2_lo = fmaf(d16[m], sc0, hd[m].dmin * mn0);
      const float c1_hi = d32[m] * sc1, c2_hi = fmaf(d16[m], sc1, hd[m].dmin * mn1);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r < nr) {
          const float2 sums = *reinterpret_cast<const float2*>(sx + r * sxstride + j0);
          float a = acc[m][r];
          a = fmaf(c1_lo, s_lo[m][r], a);
          a = fmaf(-c2_lo, sums.x, a);
          a = fmaf(c1_hi, s_hi[m][r], a);
          a = fmaf(-c2_hi, sums.y, a);
          acc[m][r] = a;
        }
      }
    }
  }
}

// --- int16 activations (the fast mode's one-token kernels, expert_decode_one.cu) ---
//
// Activations quantized per 256 (one super-block of the row): x ≈ scale·q with q = rint(x / scale)
// in [-32767, 32767], scale = max|x| / 32767, so an element's error is at most max|x| / 65534
// (about 1.5e-5 of the block's largest value; the dot products' relative error is ~1e-5 on
// random data, far inside the fast mode's bounds). The 4-bit weights times int16 activations are
// dp2a instructions (two products a cycle-slot, exact int32 sums): about 0.9 instructions per
// weight against ~2.5 for the f32 decode above, whose byte-to-float permutes and FMAs made the
// one-token kernels issue-bound (moe/PERF_NOTES.md, the one-token probe).

// dp2a.cuh's products, by their names here as before.
using ::tandem::cuda::Dp2aHi;
using ::tandem::cuda::Dp2aLo;

// Two activations as one word of int16 (a in the low half) at inverse scale inv.
__device__ __forceinline__ uint32_t PackI16(float a, float b, float inv) {
  const uint32_t qa = static_cast<uint16_t>(static_cast<int16_t>(__float2int_rn(a * inv)));
  const uint32_t qb = static_cast<uint16_t>(static_cast<int16_t>(__float2int_rn(b * inv)));
  return qa | (qb << 16);
}

// Eight activations (u then v) as four words of int16 at inverse scale inv.
__device__ __forceinline__ uint4 PackI16x8(float4 u, float4 v, float inv) {
  return make_uint4(PackI16(u.x, u.y, inv), PackI16(u.z, u.w, inv), PackI16(v.x, v.y, inv), PackI16(v.z, v.w, inv));
}

// max |v.i| (fmaxf is exact: any grouping gives the same value).
__device__ __forceinline__ float MaxAbs4(float4 v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// The per-256 scale of max|x| = mx and its inverse (both 0 for an all-zero block).
__device__ __forceinline__ float I16Scale(float mx) { return mx / 32767.0f; }
__device__ __forceinline__ float I16Inverse(float mx) { return mx > 0.0f ? 32767.0f / mx : 0.0f; }

// acc[m][0] += Σ_i w_m[i]·x[i] over one super-block with x (one activation row, DotSuperBlock's
// acc layout at kR = 1) as int16: xq its 256 quantized values (16-byte aligned), xscale their
// scale, sx its 8 f32 sub-block sums (the min term's Σx).
// Σ w·x = d·sc·Σ q·x − dmin·m·Σx per sub-block, Σ q·x = xscale · Σ q·xq (int32, exact).
template <int kMats>
__device__ __forceinline__ void DotSuperBlockI16(const uint8_t* const (&wsb)[kMats], const int16_t* xq, float xscale,
                                                 const float* sx, float (&acc)[kMats][1]) {
  Q4KHead hd[kMats];
  float dx[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    hd[m] = LoadQ4KHead(wsb[m]);
    dx[m] = hd[m].d * xscale;
  }
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    // Word k of qs bytes 32g .. 32g + 31: low nibbles are elements 64g + 4k .. + 3, high nibbles
    // elements 64g + 32 + 4k .. + 3; activation word w of a half holds elements 2w and 2w + 1.
    uint32_t q[kMats][8];
#pragma unroll
    for (int m = 0; m < kMats; ++m) LoadQ4KQs(wsb[m], g, q[m]);
    uint32_t xl[16], xh[16];
    const uint4* xp = reinterpret_cast<const uint4*>(xq + 64 * g);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 l = xp[i], h = xp[4 + i];
      xl[4 * i] = l.x; xl[4 * i + 1] = l.y; xl[4 * i + 2] = l.z; xl[4 * i + 3] = l.w;
      xh[4 * i] = h.x; xh[4 * i + 1] = h.y; xh[4 * i + 2] = h.z; xh[4 * i + 3] = h.w;
    }
    int s_lo[kMats], s_hi[kMats];
#pragma unroll
    for (int m = 0; m < kMats; ++m) s_lo[m] = s_hi[m] = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        const uint32_t lo = q[m][k] & 0x0F0F0F0Fu;
        const uint32_t hi = (q[m][k] >> 4) & 0x0F0F0F0Fu;
        s_lo[m] = Dp2aLo(xl[2 * k], lo, s_lo[m]);
        s_lo[m] = Dp2aHi(xl[2 * k + 1], lo, s_lo[m]);
        s_hi[m] = Dp2aLo(xh[2 * k], hi, s_hi[m]);
        s_hi[m] = Dp2aHi(xh[2 * k + 1], hi, s_hi[m]);
      }
    }
    const int j0 = 2 * g, j1 = 2 * g + 1;
    const float2 sums = *reinterpret_cast<const float2*>(sx + j0);
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
      const float sc0 = SubScale(hd[m], j0), mn0 = SubMin(hd[m], j0);
      const float sc1 = SubScale(hd[m], j1), mn1 = SubMin(hd[m], j1);
      float a = acc[m][0];
      a = fmaf(dx[m] * sc0, static_cast<float>(s_lo[m]), a);
      a = fmaf(-hd[m].dmin * mn0, sums.x, a);
      a = fmaf(dx[m] * sc1, static_cast<float>(s_hi[m]), a);
      a = fmaf(-hd[m].dmin * mn1, sums.y, a);
      acc[m][0] = a;
    }
  }
}

}  // namespace tandem::cuda::q4k

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_Q4K_DOT_CUH_
