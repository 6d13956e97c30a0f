// On/off A/B switches for benchmarks, read from the environment (host code only).
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

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_ENV_SWITCH_H_
