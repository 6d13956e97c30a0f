// ggml's reference scale searches. The arithmetic mirrors ggml-quants.c expression by expression
// (same f32 operations in the same order); the library is built with -ffp-contract=off so that no
// multiply-add is fused differently.
#include "common/weights/k_quant_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tandem::kquant {

int NearestInt(float value) {
  const float shifted = value + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007FFFFF) - 0x00400000;
}

namespace {

// The largest-magnitude element (first one on ties) and its magnitude.
void LargestMagnitude(int n, const float* x, float* value, float* magnitude) {
  *value = 0;
  *magnitude = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > *magnitude) {
      *magnitude = ax;
      *value = x[i];
    }
  }
}

int ClampLevel(int level, int lo, int hi) { return std::max(lo, std::min(hi, level)); }

}  // namespace

float MakeSymmetricQuants(int n, int nmax, const float* x, int8_t* levels) {
  float max;
  float amax;
  LargestMagnitude(n, x, &max, &amax);
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = ClampLevel(NearestInt(iscale * x[i]), -nmax, nmax - 1);
    levels[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = 0;
    suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = ClampLevel(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        levels[i] = static_cast<int8_t>(nmax + ClampLevel(NearestInt(iscale * x[i]), -nmax, nmax - 1));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float MakeQ3Quants(int n, int nmax, const float* x, int8_t* levels) {
  float max;
  float amax;
  LargestMagnitude(n, x, &max, &amax);
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = ClampLevel(NearestInt(iscale * x[i]), -nmax, nmax - 1);
    levels[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int round = 0; round < 5; ++round) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * levels[i];
      if (slx > 0) {
        float sl2 = suml2 - w * levels[i] * levels[i];
        const int new_l = ClampLevel(NearestInt(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != levels[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          // Keep the change if it raises sumlx^2 / suml2, i.e. lowers the weighted error.
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            levels[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++changed;
          }
        }
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) levels[i] = static_cast<int8_t>(levels[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

float MakeAsymmetricQuants(int n, int nmax, const float* x, const float* weights, uint8_t* levels, float* min_out,
                           uint8_t* scratch, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(levels, levels + n, uint8_t{0});
    *min_out = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    levels[i] = static_cast<uint8_t>(ClampLevel(l, 0, nmax));
    float diff = scale * levels[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *min_out = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0;
    float sum_l2 = 0;
    float sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = ClampLevel(NearestInt(iscale * (x[i] - min)), 0, nmax);
      scratch[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    // Weighted least squares for x ~ this_scale * l + this_min over the trial levels.
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * scratch[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        error += weights[i] * diff;
      }
      if (error < best_error) {
        std::copy(scratch, scratch + n, levels);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *min_out = -min;
  return scale;
}

}  // namespace tandem::kquant
