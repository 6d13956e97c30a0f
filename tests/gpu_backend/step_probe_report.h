// gpu_backend_bench --probe-step: where the decode step's kernels spend their time inside a real
// step. First the GDN layers' input product (the stacked [z; qkv; ba] norm-in product, 27 MB at 80B
// shapes): the backend launches its stamped instantiation (step_probe.h, cuda::SetProbeDecodeStep,
// set before the decode graphs are captured); this arms the stamps, runs one step and prints, per
// phase, the median over the step's GDN layers of the median and last block's stamp, in us after
// the layer's earliest PDL wait return (when the MoE kernel before it had completed); then the
// entry and exit of the blocks that walk two row groups against those that walk one, the earliest
// entry, how many blocks were resident more than 5 us before the wait, and how the launch sat on
// the SMs (SMs used, most blocks on one SM). Then the fused GDN kernels of the same step
// (gdn_decode_out_probe.h): their phases against each layer's product, and when their clusters
// became resident. Then every layer's fused one-token MoE kernel (expert_decode_fused_probe.h's
// armed buffer): its routed and shared-expert blocks' phases after the launch's first wait return;
// and every attention layer's split attention (attention_probe.h's armed buffer) and output product
// by columns (dense_colsplit_probe.h's): their blocks' phases.
#ifndef TANDEM_TESTS_GPU_BACKEND_STEP_PROBE_REPORT_H_
#define TANDEM_TESTS_GPU_BACKEND_STEP_PROBE_REPORT_H_

#include <functional>

#include "absl/status/status.h"

namespace tandem {

// step: one decode step (batch 1). Prints the report to stdout; an error if the stamps could not be
// set or read or the step failed.
absl::Status ReportDecodeStepProbe(const std::function<absl::Status()>& step);

}  // namespace tandem

#endif  // TANDEM_TESTS_GPU_BACKEND_STEP_PROBE_REPORT_H_
