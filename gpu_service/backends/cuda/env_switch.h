// On/off A/B switches and numeric settings for benchmarks, read from the environment (host code only).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_

#include <cstdlib>
#include <cstring>

namespace tandem::cuda {

// Whether the environment variable `name` is set to anything but "" or "0" (so VAR=1 turns a
// switch on and VAR=0 leaves it off). Callers read it once and keep the answer in a static: the
// switches choose a code path for the whole process.
inline bool EnvSwitch(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// A switch that is on unless the environment variable `name` is set to "" or "0" (VAR=0 turns it
// off): the A/B switches whose new path became the default.
inline bool EnvSwitchDefaultOn(const char* name) { return std::getenv(name) == nullptr || EnvSwitch(name); }

// The environment variable `name` as a base-10 integer in [min, max], or `fallback` where it is
// unset, empty, not wholly an integer, or out of that range. Read once by callers, as the switches.
inline long long EnvInteger(const char* name, long long fallback, long long min, long long max) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return end != v && *end == '\0' && n >= min && n <= max ? n : fallback;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_
