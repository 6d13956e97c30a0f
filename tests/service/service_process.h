// Test helpers for the integration tests: a tandem-gpu-service child process (RAII: killed and
// reaped on destruction), the shared tiny model, the health check over a generic gRPC call, and
// a /metrics scrape.
#ifndef TANDEM_TESTS_SERVICE_SERVICE_PROCESS_H_
#define TANDEM_TESTS_SERVICE_SERVICE_PROCESS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include "common/model_gen/model_generator.h"
#include "common/model_gen/model_spec.h"
#include "gtest/gtest.h"

namespace tandem {

// The build tree: where the service binary is (gpu_service/tandem-gpu-service) and the test model
// goes (tests/service/). $TANDEM_TEST_BINARY_DIR overrides the compiled-in one, for binaries carried
// to another machine (scripts/device/run_all.sh).
inline std::string BinaryDir() {
  const char* dir = std::getenv("TANDEM_TEST_BINARY_DIR");
  return dir != nullptr && *dir != '\0' ? dir : TANDEM_BINARY_DIR;
}

// The `tiny` preset, generated once into the build tree and shared by every test process.
inline std::string TinyModelPath() {
  const std::filesystem::path path = std::filesystem::path(BinaryDir()) / "tests" / "service" / "tiny.gguf";
  if (std::filesystem::exists(path)) return path.string();
  absl::StatusOr<GenModelSpec> spec = PresetSpec("tiny");
  EXPECT_TRUE(spec.ok());
  // Written under a unique name and renamed, so concurrent test processes never see half a file.
  const std::string tmp = path.string() + "." + std::to_string(getpid());
  absl::Status s = GenerateModel(*spec, tmp);
  EXPECT_TRUE(s.ok()) << s;
  std::filesystem::rename(tmp, path);
  return path.string();
}

// The backend the service under test runs: $TANDEM_TEST_BACKEND (cpu, cuda or auto), default cpu.
inline std::string TestBackend() {
  const char* backend = std::getenv("TANDEM_TEST_BACKEND");
  return backend != nullptr && *backend != '\0' ? backend : "cpu";
}

// Forks and execs tandem-gpu-service with `args` (no defaults added), its stderr into `log`; the
// child is killed if the test process dies. Returns the child's pid.
inline pid_t SpawnService(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv_strings = {BinaryDir() + "/gpu_service/tandem-gpu-service"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

class ServiceProcess {
 public:
  // Starts the service on free loopback ports with `extra` flags and waits for its ready file.
  explicit ServiceProcess(std::vector<std::string> extra = {}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem-service-test-" + std::to_string(getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    const std::string ready = (dir_ / "ready").string();
    std::vector<std::string> args = {
        "--model=" + TinyModelPath(), "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
        "--ready-file=" + ready, "--threads=2", "--backend=" + TestBackend()};
    // Exact mode: the tests compare against the CPU reference's behaviour.
    if (TestBackend() == "cuda") args.push_back("--cuda-mode=exact");
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = SpawnService(args, (dir_ / "service.log").string());
    // Wait for the ready file (the model loads in well under a second; 60 s allows a loaded CI).
    for (int i = 0; i < 6000 && !std::filesystem::exists(ready); ++i) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "the service exited at start-up; log:\n" << Log();
        // A channel to a closed port: the test's calls then fail (UNAVAILABLE) instead of
        // crashing on a null channel.
        channel_ = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream in(ready);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("grpc_port=", 0) == 0) grpc_port_ = std::stoi(line.substr(10));
      if (line.rfind("metrics_port=", 0) == 0) metrics_port_ = std::stoi(line.substr(13));
    }
    EXPECT_GT(grpc_port_, 0) << Log();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port_),
                                   grpc::InsecureChannelCredentials());
  }

  ~ServiceProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }

  // No-ops once the process is gone (kill(-1, ...) would signal every process of this user).
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Waits for the process to exit; returns its exit status (or -1 on a signal).
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string Log() const {
    std::ifstream in(dir_ / "service.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // grpc.health.v1.Health/Check for the overall status: 1 SERVING, 2 NOT_SERVING, -1 on error.
  int Health() const {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer request, response;  // HealthCheckRequest{service: ""} is empty on the wire
    grpc::Slice empty;
    request = grpc::ByteBuffer(&empty, 1);
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) { done.set_value(s); });
    grpc::Status s = done.get_future().get();
    if (!s.ok()) return -1;
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    std::string wire;
    for (const auto& sl : slices) wire.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    // HealthCheckResponse{status = 1}: tag 0x08, varint value.
    if (wire.size() == 2 && wire[0] == 0x08) return wire[1];
    return wire.empty() ? 0 : -1;
  }

  // The bytes of grpc.reflection.v1alpha's answer to list_services (the names appear verbatim).
  std::string ReflectionListServices() const {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    auto call = stub.PrepareCall(
        &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
    auto step = [&](int tag) {
      void* got = nullptr;
      bool ok = false;
      return cq.Next(&got, &ok) && ok && got == reinterpret_cast<void*>(tag);
    };
    std::string out;
    call->StartCall(reinterpret_cast<void*>(1));
    if (!step(1)) return out;
    const std::string request("\x3a\x01*", 3);  // ServerReflectionRequest{list_services: "*"}
    grpc::Slice slice(request);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    if (!step(2)) return out;
    call->WritesDone(reinterpret_cast<void*>(3));
    if (!step(3)) return out;
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(4));
    if (step(4)) {
      std::vector<grpc::Slice> slices;
      (void)response.Dump(&slices);
      for (const auto& sl : slices) out.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    step(5);
    return out;
  }

  // The /metrics text.
  std::string Metrics() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(metrics_port_));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
      (void)!write(fd, req.data(), req.size());
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return out;
  }

  // The value of one series ("name" or "name{labels}") in the metrics text; -1 when absent.
  double Metric(const std::string& series) const {
    std::istringstream in(Metrics());
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
    }
    return -1;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  pid_t pid_ = -1;
  int grpc_port_ = 0, metrics_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
};

// The exit of a service run that is expected to fail at start-up.
struct StartUpExit {
  int code = -1;    // the exit status; -1 for a signal, or when it was still running after 60 s
  std::string log;  // its stderr
};

// Runs tandem-gpu-service with exactly `args` (no defaults added) and waits for it to exit (60 s at
// most; then it is killed and `code` is -1).
inline StartUpExit RunServiceUntilExit(const std::vector<std::string>& args) {
  static int counter = 0;
  const std::filesystem::path log = std::filesystem::temp_directory_path() /
      ("tandem-service-startup-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  const pid_t pid = SpawnService(args, log.string());
  StartUpExit out;
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 6000 && !exited; ++i) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else if (WIFEXITED(status)) {
    out.code = WEXITSTATUS(status);
  }
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  out.log = ss.str();
  std::error_code ec;
  std::filesystem::remove(log, ec);
  return out;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_SERVICE_SERVICE_PROCESS_H_
