// A minimal HTTP/1.0 server for Prometheus scrapes: GET /metrics answers 200 with the registry's
// text; any other path 404, any other method 405. One connection at a time on its own thread
// (a scrape every few seconds needs no more); a client that sends nothing is dropped after 2 s.
// The socket and the thread are owned: the destructor closes the one and joins the other.
#ifndef TANDEM_GPU_SERVICE_METRICS_METRICS_HTTP_SERVER_H_
#define TANDEM_GPU_SERVICE_METRICS_METRICS_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tandem {

class MetricsHttpServer {
 public:
  // Listens on HOST:PORT (an IPv4 or bracketed IPv6 address, a host name, or an empty host for
  // every address; port 0 picks a free one) and serves render() at /metrics. Errors name
  // --metrics-listen.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(UniqueFd listen_fd, UniqueFd wake_fd, int port,
                    std::function<std::string()> render);
  void Serve();
  void HandleConnection(int fd);

  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // an eventfd: written by the destructor to end Serve()
  int port_;
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_METRICS_METRICS_HTTP_SERVER_H_
