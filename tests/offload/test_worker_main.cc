// A host worker for the channel tests: serves a channel with FakeExpertRowComputer.
// Exit codes: 0 served until stopped, 3 attach refused, 4 serving ended with an error.
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "host_expert_worker/channel/channel_server.h"
#include "tests/offload/fake_expert_row_computer.h"

ABSL_FLAG(std::string, channel, "", "shared-memory segment name made by the service");
ABSL_FLAG(uint32_t, layers, 4, "layer count of the fake model");
ABSL_FLAG(uint32_t, experts, 8, "expert count of the fake model");
ABSL_FLAG(uint32_t, hidden, 16, "hidden size of the fake model");
ABSL_FLAG(int32_t, expert_begin, 0, "first expert held");
ABSL_FLAG(int32_t, expert_end, -1, "one past the last expert held (-1: all)");
ABSL_FLAG(uint32_t, fingerprint_salt, 0, "non-zero: pretend to hold a different model");
ABSL_FLAG(int32_t, die_on_layer, -1, "SIGKILL itself while computing a request for this layer");
ABSL_FLAG(int64_t, spin_us, 2000, "spin this long for the next request before sleeping");

namespace tandem {
namespace {

class DyingComputer : public FakeExpertRowComputer {
 public:
  DyingComputer(const ExpertModelShape& shape, int32_t die_on_layer)
      : FakeExpertRowComputer(shape), die_on_layer_(die_on_layer) {}
  absl::Status Compute(const ExpertBatch& batch, float* outputs) override {
    if (static_cast<int32_t>(batch.layer) == die_on_layer_) raise(SIGKILL);
    return FakeExpertRowComputer::Compute(batch, outputs);
  }

 private:
  int32_t die_on_layer_;
};

int Run() {
  ExpertModelShape shape;
  shape.layer_count = absl::GetFlag(FLAGS_layers);
  shape.expert_count = absl::GetFlag(FLAGS_experts);
  shape.hidden_size = absl::GetFlag(FLAGS_hidden);
  shape.fingerprint = FakeModelFingerprint(shape.layer_count, shape.expert_count,
                                           shape.hidden_size, absl::GetFlag(FLAGS_fingerprint_salt));
  shape.expert_begin = static_cast<uint32_t>(absl::GetFlag(FLAGS_expert_begin));
  const int32_t end = absl::GetFlag(FLAGS_expert_end);
  shape.expert_end = end < 0 ? shape.expert_count : static_cast<uint32_t>(end);
  DyingComputer computer(shape, absl::GetFlag(FLAGS_die_on_layer));

  ChannelServerOptions options;
  options.wait.spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
  absl::StatusOr<std::unique_ptr<ChannelServer>> server =
      ChannelServer::Attach(absl::GetFlag(FLAGS_channel), &computer, options);
  if (!server.ok()) {
    std::fprintf(stderr, "test worker: %s\n", std::string(server.status().message()).c_str());
    return 3;
  }
  absl::Status served = (*server)->Serve();
  if (!served.ok()) {
    std::fprintf(stderr, "test worker: %s\n", std::string(served.message()).c_str());
    return 4;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
