#include "gpu_service/server/listen_check.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
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
  // One address that binds is enough.
  const BoundSocket probe = BindFirst(*addresses);
  if (probe.fd.get() >= 0) return absl::OkStatus();
  if (probe.bind_error == EADDRINUSE) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": ", listen, " is in use (another service listens there?)"));
  }
  // No socket to probe with: the server decides.
  if (probe.bind_error == 0) return absl::OkStatus();
  // A wildcard the probe's family cannot bind (IPv6 switched off, for "[::]") may still be served
  // through the other family: only the server can tell.
  const auto wildcard = [](const SocketAddress& a) { return a.wildcard(); };
  if (std::any_of(addresses->begin(), addresses->end(), wildcard)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": cannot bind ", listen, ": ", std::strerror(probe.bind_error)));
}

}  // namespace tandem
