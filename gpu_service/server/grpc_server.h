// The gRPC server around the Generation service: listening port, the standard health service
// (grpc.health.v1), server reflection, keepalive and message size limits.
//
// Reflection: Debian 12's gRPC 1.51 ships only grpc.reflection.v1alpha (libgrpc++_reflection); v1
// arrived in gRPC 1.57. The server registers both: Debian's v1alpha plugin and Tandem's own v1
// service (reflection_v1.h), so grpcurl and ghz work whichever they ask for first.
//
// Health: NOT_SERVING until SetServing(true) (the service calls it once the model and workers are
// ready), for the overall status ("") and for "tandem.v1.Generation".
#ifndef TANDEM_GPU_SERVICE_SERVER_GRPC_SERVER_H_
#define TANDEM_GPU_SERVICE_SERVER_GRPC_SERVER_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"

namespace tandem {

struct GrpcServerOptions {
  std::string listen = "127.0.0.1:50051";  // port 0: a free port (see port())
  int max_message_bytes = 64 << 20;        // receive and send
  int keepalive_time_ms = 30000;           // server pings an idle connection this often
  int keepalive_timeout_ms = 10000;        // and drops it when a ping is not answered in time
  int min_client_ping_interval_ms = 10000; // clients may ping this often without data
};

class GrpcServer {
 public:
  // Builds and starts the server with `service` registered (not owned; must outlive the server).
  // Errors name --listen.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           grpc::Service* service);
  ~GrpcServer();

  int port() const { return port_; }
  // Sets the health status of "" and "tandem.v1.Generation".
  void SetServing(bool serving);
  // Stops accepting calls; calls still running after `deadline` are cancelled. Waits for all.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}
  std::mutex mu_;
  std::unique_ptr<grpc::Server> server_;
  int port_;
  bool shut_down_ = false;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_GRPC_SERVER_H_
