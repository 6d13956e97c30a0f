#include "gpu_service/server/listen_check.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "gpu_service/net/listen_address.h"

namespace tandem {

absl::Status CheckListenAddressFree(const std::string& flag, const std::string& listen) {
  const std::optional<HostPort> host_port = ParseHostPort(listen);
  // Not HOST:PORT, any free port, or no host: the server's own forms and rules decide.
  if (!host_port.has_value() || host_port->port == 0 || host_port->host.empty()) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<SocketAddress>> addresses = ResolveHostPort(flag, *host_port);
  if (!addresses.ok()) return addresses.status();
  // Each address is bound as the servers bind it (SO_REUSEADDR, so that a port in TIME_WAIT from
  // an earlier run is free, as it is to them); one that binds is enough.
  int last_error = 0;
  bool any_wildcard = false;
  for (const SocketAddress& address : *addresses) {
    any_wildcard |= address.wildcard;
    const UniqueFd probe(socket(address.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.get() < 0) {
      last_error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(probe.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(probe.get(), address.get(), address.length) == 0) return absl::OkStatus();
    last_error = errno;
    if (last_error == EADDRINUSE) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": ", listen, " is in use (another service listens there?)"));
    }
  }
  // A wildcard the probe's family cannot bind (IPv6 switched off, for "[::]") may still be served
  // through the other family: only the server can tell.
  if (any_wildcard) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": cannot bind ", listen, ": ", std::strerror(last_error)));
}

}  // namespace tandem
