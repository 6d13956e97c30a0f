#include "gpu_service/metrics/metrics_http_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"
#include "gpu_service/net/listen_address.h"

namespace tandem {
namespace {

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render) {
  constexpr absl::string_view kFlag = "--metrics-listen";
  const std::optional<HostPort> host_port = ParseHostPort(listen);
  if (!host_port.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFlag, ": '", listen, "' is not HOST:PORT (an IPv6 address in brackets: [::1]:9090)"));
  }
  absl::StatusOr<std::vector<SocketAddress>> addresses = ResolveHostPort(kFlag, *host_port);
  if (!addresses.ok()) return addresses.status();
  // The first address that binds ("localhost" may resolve to ::1 first on a machine without IPv6).
  auto cannot_listen = [&](int error) {
    return absl::UnavailableError(
        absl::StrCat(kFlag, ": cannot listen on ", listen, ": ", std::strerror(error)));
  };
  BoundSocket bound = BindFirst(*addresses);
  if (bound.fd.get() < 0) {
    return cannot_listen(bound.bind_error != 0 ? bound.bind_error : bound.socket_error);
  }
  if (::listen(bound.fd.get(), 16) != 0) return cannot_listen(errno);
  UniqueFd sock = std::move(bound.fd);
  const int port = BoundPort(sock.get());
  UniqueFd wake(eventfd(0, EFD_CLOEXEC));
  if (wake.get() < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(sock), std::move(wake), port, std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(UniqueFd listen_fd, UniqueFd wake_fd, int port,
                                     std::function<std::string()> render)
    : listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      port_(port),
      render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof one) < 0) {
    // The eventfd cannot be full after one write; nothing else to do.
  }
  thread_.join();
}

void MetricsHttpServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      const int conn = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      UniqueFd closer(conn);
      HandleConnection(conn);
    }
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  // Read the request head (up to the blank line, 8 KiB at most, 2 s).
  std::string head;
  char buf[1024];
  while (head.find("\r\n\r\n") == std::string::npos && head.find("\n\n") == std::string::npos &&
         head.size() < 8192) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  std::string status = "200 OK", body, type = "text/plain; version=0.0.4; charset=utf-8";
  if (parts.size() < 2) {
    status = "400 Bad Request";
    body = "bad request\n";
  } else if (parts[0] != "GET" && parts[0] != "HEAD") {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else if (parts[1] != "/metrics" && parts[1].rfind("/metrics?", 0) != 0) {
    status = "404 Not Found";
    body = "see /metrics\n";
  } else {
    body = render_();
  }
  std::string response = absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                                      "\r\nContent-Length: ", body.size(),
                                      "\r\nConnection: close\r\n\r\n");
  if (parts.empty() || parts[0] != "HEAD") response += body;
  WriteAll(fd, response);
}

}  // namespace tandem
