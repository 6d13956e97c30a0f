// A worker process the service spawned, owned by RAII: destroying it terminates (SIGTERM, then
// SIGKILL after a grace period) and reaps the child.
#ifndef TANDEM_GPU_SERVICE_OFFLOAD_WORKER_PROCESS_H_
#define TANDEM_GPU_SERVICE_OFFLOAD_WORKER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

class WorkerProcess {
 public:
  // Starts `path` with argv = {path, args...} (posix_spawn: fork/exec without copying the
  // service's page tables, and safe in a multi-threaded process).
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Spawn(const std::string& path,
                                                              const std::vector<std::string>& args);

  ~WorkerProcess();  // Terminate(grace) unless already reaped
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Non-blocking (waitpid WNOHANG): true once the child has exited; it is then reaped and
  // ExitDescription() says how ("exit code 3", "signal 9").
  bool HasExited();
  const std::string& ExitDescription() const { return exit_description_; }

  // SIGTERM, wait up to `grace`, then SIGKILL; always reaps. Idempotent.
  void Terminate(absl::Duration grace = absl::Milliseconds(500));

 private:
  explicit WorkerProcess(pid_t pid) : pid_(pid) {}

  pid_t pid_;
  bool reaped_ = false;
  std::string exit_description_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_OFFLOAD_WORKER_PROCESS_H_
