#include "gpu_service/metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/unique_fd.h"

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
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen: '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen: '", host, "' is not an IPv4 address"));
  }
  const int raw = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  UniqueFd sock(raw);
  if (raw < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(raw, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(raw, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(raw, 16) != 0) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen: cannot listen on ", listen, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof addr;
  getsockname(raw, reinterpret_cast<sockaddr*>(&addr), &len);
  const int wake_fd = eventfd(0, EFD_CLOEXEC);
  if (wake_fd < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(sock.release(), wake_fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, int port,
                                     std::function<std::string()> render)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) < 0) {
    // The eventfd cannot be full after one write; nothing else to do.
  }
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void MetricsHttpServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
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
