#include "gpu_service/server/listen_check.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace tandem {
namespace {

// getaddrinfo's list, freed on every path.
struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

// Whether the address is "any address" of its family (0.0.0.0 or ::).
bool IsWildcard(const addrinfo& a) {
  if (a.ai_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a.ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (a.ai_family == AF_INET6) {
    const in6_addr& addr = reinterpret_cast<const sockaddr_in6*>(a.ai_addr)->sin6_addr;
    return std::memcmp(&addr, &in6addr_any, sizeof addr) == 0;
  }
  return false;
}

}  // namespace

absl::Status CheckListenAddressFree(const std::string& flag, const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return absl::OkStatus();
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::OkStatus();
  }
  if (port_number == 0) return absl::OkStatus();
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  AddrInfoList list;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                                 &list.head);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  // The first address the host resolves to, as the servers bind it (SO_REUSEADDR, so that a port
  // in TIME_WAIT from an earlier run is free, as it is to them).
  const addrinfo* a = list.head;
  const UniqueFd probe(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
  if (probe.get() < 0) return absl::OkStatus();  // no socket to probe with: the server decides
  const int one = 1;
  setsockopt(probe.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(probe.get(), a->ai_addr, a->ai_addrlen) == 0) return absl::OkStatus();
  const int err = errno;
  if (err == EADDRINUSE) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, ": ", listen, " is in use (another service listens there?)"));
  }
  // A wildcard the probe's family cannot bind (IPv6 switched off, for "[::]") may still be served
  // through the other family: only the server can tell.
  if (IsWildcard(*a)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": cannot bind ", listen, ": ", std::strerror(err)));
}

}  // namespace tandem
