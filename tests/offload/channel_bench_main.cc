// Prints RunChannelBench's numbers with the test worker (a fake expert computer). Not a test.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"

#include "gpu_service/offload/channel_bench.h"
#include "tests/offload/fake_expert_row_computer.h"

ABSL_FLAG(std::string, worker_path, TANDEM_BINARY_DIR "/tests/offload/tandem_offload_test_worker",
          "the test worker executable to spawn");
ABSL_FLAG(int64_t, client_spin_us, 1000, "client: spin this long for a reply before sleeping");
ABSL_FLAG(int64_t, client_sleep_slice_us, 2000, "client: longest single sleep");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tandem::ChannelBenchOptions options;
  options.client_wait.spin = absl::Microseconds(absl::GetFlag(FLAGS_client_spin_us));
  options.client_wait.sleep_slice = absl::Microseconds(absl::GetFlag(FLAGS_client_sleep_slice_us));
  options.worker_path = absl::GetFlag(FLAGS_worker_path);
  options.layer_count = 1;
  options.expert_count = 16;
  options.hidden_size = 2048;
  options.worker_args = {"--layers=1", "--experts=16", "--hidden=2048"};
  options.model_fingerprint = tandem::FakeModelFingerprint(1, 16, 2048);
  absl::StatusOr<tandem::ChannelBenchResult> r = tandem::RunChannelBench(options);
  if (!r.ok()) {
    std::fprintf(stderr, "bench failed: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  auto print = [](const char* what, const tandem::LatencySummary& s) {
    std::printf("%-34s n=%6d  p50 %8.2f us  p99 %8.2f us  max %9.2f us  worker %7.2f us\n", what,
                s.samples, s.p50_us, s.p99_us, s.max_us, s.mean_worker_compute_us);
  };
  print("empty request, worker spinning", r->empty_spinning);
  print("10 pairs h=2048, worker spinning", r->decode_spinning);
  print("empty request, worker asleep", r->wake_from_sleep);
  return 0;
}
