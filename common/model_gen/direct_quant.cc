#include "common/model_gen/direct_quant.h"

#include <cmath>
#include <cstring>

#include "common/weights/block_layouts.h"
#include "common/weights/half.h"

namespace tandem {
namespace {

// Fills n bytes with random bits.
void RandomBytes(GenRandom& rng, uint8_t* dst, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(dst + i, &r, 8);
  }
  if (i < n) {
    const uint64_t r = rng.Next();
    std::memcpy(dst + i, &r, n - i);
  }
}

// Mean of x² over the integers a..b (a uniform draw).
double MeanSquare(int a, int b) {
  double sum = 0;
  for (int x = a; x <= b; ++x) sum += static_cast<double>(x) * x;
  return sum / (b - a + 1);
}

// The f16 super-block scale for `std`, given E[sc²] and E[(q − centre)²] of the block's draws.
// When `exact_multiple` is set the low four mantissa bits are cleared, so that centre·d (the
// min, for the types that centre with dmin) is exactly representable in f16 and the mean is 0.
uint16_t BlockScale(float std, double mean_sq_scale, double mean_sq_level, bool exact_multiple) {
  const double d = std / std::sqrt(mean_sq_scale * mean_sq_level);
  uint16_t d16 = Fp32ToFp16(static_cast<float>(d));
  if (exact_multiple) d16 &= static_cast<uint16_t>(~0xFu);
  if ((d16 & 0x7FFFu) == 0) d16 = 0x10;  // never a zero scale
  return d16;
}

uint16_t MinFor(uint16_t d16, float centre) {
  return Fp32ToFp16(Fp16ToFp32(d16) * centre);
}

// Q8_0: qs uniform in [−127, 127] (a drawn −128 becomes 0, keeping the mean exactly 0).
void FillQ8_0(int64_t n, float std, GenRandom& rng, uint8_t* dst) {
  const uint16_t d = BlockScale(std, 1.0, MeanSquare(-127, 127) * 255.0 / 256.0, false);
  for (int64_t b = 0; b < n; ++b) {
    BlockQ8_0 block;
    block.d = d;
    RandomBytes(rng, reinterpret_cast<uint8_t*>(block.qs), kLegacyBlockElems);
    for (int8_t& q : block.qs) {
      if (q == -128) q = 0;
    }
    std::memcpy(dst + b * sizeof(block), &block, sizeof(block));
  }
}

// Q4_0: x = d·(q − 8); a drawn q = 0 becomes 8, so q − 8 is symmetric in [−7, 7].
void FillQ4_0(int64_t n, float std, GenRandom& rng, uint8_t* dst) {
  const uint16_t d = BlockScale(std, 1.0, MeanSquare(-7, 7) * 15.0 / 16.0, false);
  for (int64_t b = 0; b < n; ++b) {
    BlockQ4_0 block;
    block.d = d;
    RandomBytes(rng, block.qs, sizeof(block.qs));
    for (uint8_t& q : block.qs) {
      uint8_t lo = q & 0xF, hi = q >> 4;
      if (lo == 0) lo = 8;
      if (hi == 0) hi = 8;
      q = static_cast<uint8_t>(lo | (hi << 4));
    }
    std::memcpy(dst + b * sizeof(block), &block, sizeof(block));
  }
}

// Q4_K / Q5_K: sub-block scales sc uniform in [32, 63], min m = sc and dmin = centre·d, so each
// value is d·sc·(q − centre) with q uniform: mean 0.
template <typename Block, int kBits>
void FillQ45_K(int64_t n, float std, GenRandom& rng, uint8_t* dst) {
  constexpr int kLevels = 1 << kBits;
  const float centre = (kLevels - 1) / 2.0f;
  const double level_var = (static_cast<double>(kLevels) * kLevels - 1) / 12.0;
  const uint16_t d = BlockScale(std, MeanSquare(32, 63), level_var, true);
  const uint16_t dmin = MinFor(d, centre);
  for (int64_t b = 0; b < n; ++b) {
    Block block;
    block.d = d;
    block.dmin = dmin;
    uint8_t sc[8];
    const uint64_t r = rng.Next();
    for (int j = 0; j < 8; ++j) sc[j] = static_cast<uint8_t>(32 + ((r >> (5 * j)) & 31));
    PackKScalesMins(sc, sc, block.scales);
    RandomBytes(rng, block.qs, sizeof(block.qs));
    if constexpr (kBits == 5) RandomBytes(rng, block.qh, sizeof(block.qh));
    std::memcpy(dst + b * sizeof(block), &block, sizeof(block));
  }
}

// Q2_K: scale nibbles uniform in [8, 15], min nibble = scale and dmin = 1.5·d: mean 0.
void FillQ2_K(int64_t n, float std, GenRandom& rng, uint8_t* dst) {
  const uint16_t d = BlockScale(std, MeanSquare(8, 15), 15.0 / 12.0, true);
  const uint16_t dmin = MinFor(d, 1.5f);
  for (int64_t b = 0; b < n; ++b) {
    BlockQ2_K block;
    block.d = d;
    block.dmin = dmin;
    const uint64_t r = rng.Next();
    for (int j = 0; j < 16; ++j) {
      const uint8_t sc = static_cast<uint8_t>(8 + ((r >> (3 * j)) & 7));
      block.scales[j] = static_cast<uint8_t>(sc | (sc << 4));
    }
    RandomBytes(rng, block.qs, sizeof(block.qs));
    std::memcpy(dst + b * sizeof(block), &block, sizeof(block));
  }
}

// Q3_K: signed sub-block scales of magnitude [16, 31] with a random sign. Levels q − 4 have mean
// −1/2, so each sub-block's mean is ±sc/2·d; the random signs cancel it across a row.
void FillQ3_K(int64_t n, float std, GenRandom& rng, uint8_t* dst) {
  const uint16_t d = BlockScale(std, MeanSquare(16, 31), 63.0 / 12.0 + 0.25, false);
  for (int64_t b = 0; b < n; ++b) {
    BlockQ3_K block;
    block.d = d;
    uint8_t biased[16];
    const uint64_t r0 = rng.Next(), r1 = rng.Next();
    for (int j = 0; j < 16; ++j) {
      const uint64_t bits = (j < 8 ? r0 >> (5 * j) : r1 >> (5 * (j - 8))) & 31;
      const int magnitude = 16 + static_cast<int>(bits & 15);
      const int sc = (bits & 16) ? -magnitude : magnitude;
      biased[j] = static_cast<uint8_t>(sc + 32);
    }
    PackQ3KScales(biased, block.scales);
    RandomBytes(rng, block.hmask, sizeof(block.hmask));
    RandomBytes(rng, block.qs, sizeof(block.qs));
    std::memcpy(dst + b * sizeof(block), &block, sizeof(block));
  }
}

// Q6_K: int8 sub-block scales of magnitude [64, 127] with a random sign (as Q3_K).
void FillQ6_K(int64_t n, float std, GenRandom& rng, uint8_t* dst) {
  const uint16_t d = BlockScale(std, MeanSquare(64, 127), 4095.0 / 12.0 + 0.25, false);
  for (int64_t b = 0; b < n; ++b) {
    BlockQ6_K block;
    block.d = d;
    const uint64_t r0 = rng.Next(), r1 = rng.Next();
    for (int j = 0; j < 16; ++j) {
      const uint64_t bits = (j < 8 ? r0 >> (7 * j) : r1 >> (7 * (j - 8))) & 127;
      const int magnitude = 64 + static_cast<int>(bits & 63);
      block.scales[j] = static_cast<int8_t>((bits & 64) ? -magnitude : magnitude);
    }
    RandomBytes(rng, block.ql, sizeof(block.ql));
    RandomBytes(rng, block.qh, sizeof(block.qh));
    std::memcpy(dst + b * sizeof(block), &block, sizeof(block));
  }
}

}  // namespace

bool HasDirectQuant(WeightType type) {
  switch (type) {
    case WeightType::kQ4_0:
    case WeightType::kQ8_0:
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void FillDirectQuantBlocks(WeightType type, int64_t n_blocks, float std, GenRandom& rng,
                           uint8_t* dst) {
  switch (type) {
    case WeightType::kQ4_0: return FillQ4_0(n_blocks, std, rng, dst);
    case WeightType::kQ8_0: return FillQ8_0(n_blocks, std, rng, dst);
    case WeightType::kQ2_K: return FillQ2_K(n_blocks, std, rng, dst);
    case WeightType::kQ3_K: return FillQ3_K(n_blocks, std, rng, dst);
    case WeightType::kQ4_K: return FillQ45_K<BlockQ4_K, 4>(n_blocks, std, rng, dst);
    case WeightType::kQ5_K: return FillQ45_K<BlockQ5_K, 5>(n_blocks, std, rng, dst);
    case WeightType::kQ6_K: return FillQ6_K(n_blocks, std, rng, dst);
    default: return;
  }
}

}  // namespace tandem
