// HOST:PORT listening addresses ("127.0.0.1:50051", "[::]:9090", "localhost:0", ":8080"), parsed
// and resolved one way for the start-up check and the metrics server's own socket, so that an
// address the check passes is one the metrics server can bind (it had parsed IPv4 only).
#ifndef TANDEM_GPU_SERVICE_NET_LISTEN_ADDRESS_H_
#define TANDEM_GPU_SERVICE_NET_LISTEN_ADDRESS_H_

#include <sys/socket.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"

namespace tandem {

struct HostPort {
  std::string host;  // IPv6 brackets removed; empty: every address
  int port = 0;      // 0..65535; 0: any free port
};

// nullopt when `listen` is not HOST:PORT with a decimal port in 0..65535 (e.g. gRPC's "unix:PATH").
std::optional<HostPort> ParseHostPort(absl::string_view listen);

// An address getaddrinfo gives for binding (AI_PASSIVE), as a socket is bound to it.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
  bool wildcard() const;  // 0.0.0.0 or ::
};

// Every address the host resolves to, in getaddrinfo's order ("localhost" may give ::1 before
// 127.0.0.1, and a machine without IPv6 cannot bind the first); InvalidArgument starting with
// `flag` when the host does not resolve.
absl::StatusOr<std::vector<SocketAddress>> ResolveHostPort(absl::string_view flag,
                                                           const HostPort& host_port);

// A socket bound to the first of `addresses` that binds, as the servers bind (SO_REUSEADDR, so that
// a port in TIME_WAIT from an earlier run is free). Without one: bind_error is the last bind's
// errno (EADDRINUSE ends the search: the port is taken), 0 when no socket could be made for any
// address, whose errno is then socket_error.
struct BoundSocket {
  UniqueFd fd;
  int bind_error = 0;
  int socket_error = 0;
};
BoundSocket BindFirst(const std::vector<SocketAddress>& addresses);

// The port a bound socket listens on (its getsockname), or -1.
int BoundPort(int fd);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_NET_LISTEN_ADDRESS_H_
