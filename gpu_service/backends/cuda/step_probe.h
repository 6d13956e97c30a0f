// The decode step's in-step probe switch (gpu_backend_bench --probe-step). While it is on, the CUDA
// backend launches the stamped instantiations of the kernels it probes, each writing %globaltimer
// stamps of its phases into its own armed buffer:
//   the GDN layers' norm-in input products (LaunchDenseMatVecNormInProbed, dense_matvec_probe.h) and
//   their fused kernels with the output product inside (gdn_decode_out_probe.h);
//   every layer's fused one-token MoE kernel (LaunchOneTokenMoeFusedArmedProbe,
//   moe/expert_decode_fused_probe.h);
//   attention's split attention (attention_probe.h) and its output product by columns
//   (dense_colsplit_probe.h).
// A process-wide setting for benchmarks: off unless set, and read when a launch is enqueued, so it
// must be set before the decode graphs are captured. tests/gpu_backend/step_probe_report.h
// arms the buffers and prints the phases.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_STEP_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_STEP_PROBE_H_

namespace tandem::cuda {

bool ProbeDecodeStep();
void SetProbeDecodeStep(bool on);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_STEP_PROBE_H_
