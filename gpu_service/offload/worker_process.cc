#include "gpu_service/offload/worker_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace tandem {
namespace {

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(
    const std::string& path, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, path.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("spawning worker ", path, ": ", std::strerror(rc)));
  }
  return std::unique_ptr<WorkerProcess>(new WorkerProcess(pid));
}

WorkerProcess::~WorkerProcess() { Terminate(); }

bool WorkerProcess::HasExited() {
  if (reaped_) return true;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_description_ = DescribeWaitStatus(status);
    return true;
  }
  if (r < 0 && errno == ECHILD) {  // reaped elsewhere (e.g. SIGCHLD ignored)
    reaped_ = true;
    exit_description_ = "exited (status unknown)";
    return true;
  }
  return false;
}

void WorkerProcess::Terminate(absl::Duration grace) {
  if (HasExited()) return;
  kill(pid_, SIGTERM);
  const absl::Time give_up = absl::Now() + grace;
  while (absl::Now() < give_up) {
    if (HasExited()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  exit_description_ = DescribeWaitStatus(status);
}

}  // namespace tandem
