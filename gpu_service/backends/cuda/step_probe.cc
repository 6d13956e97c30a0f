#include "gpu_service/backends/cuda/step_probe.h"

#include <atomic>

namespace tandem::cuda {
namespace {
std::atomic<bool> g_probe_decode_step{false};
}  // namespace

bool ProbeDecodeStep() { return g_probe_decode_step.load(std::memory_order_relaxed); }
void SetProbeDecodeStep(bool on) { g_probe_decode_step.store(on, std::memory_order_relaxed); }

}  // namespace tandem::cuda
