#include "gpu_service/net/listen_address.h"

#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// getaddrinfo's list, freed on every path.
struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

}  // namespace

bool SocketAddress::wildcard() const {
  if (family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (family() == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
    return std::memcmp(&a, &in6addr_any, sizeof a) == 0;
  }
  return false;
}

std::optional<HostPort> ParseHostPort(absl::string_view listen) {
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos) return std::nullopt;
  const absl::string_view port = listen.substr(colon + 1);
  HostPort out;
  // SimpleAtoi takes a sign and spaces; a port is digits only.
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port, &out.port) || out.port > 65535) {
    return std::nullopt;
  }
  absl::string_view host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return std::nullopt;  // an IPv6 address needs its brackets ("[::1]:80"), or "unix:a:1"
  }
  out.host = std::string(host);
  return out;
}

absl::StatusOr<std::vector<SocketAddress>> ResolveHostPort(absl::string_view flag,
                                                           const HostPort& host_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  AddrInfoList list;
  const std::string port = std::to_string(host_port.port);
  if (const int rc = getaddrinfo(host_port.host.empty() ? nullptr : host_port.host.c_str(),
                                 port.c_str(), &hints, &list.head);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot resolve '", host_port.host, "': ", gai_strerror(rc)));
  }
  std::vector<SocketAddress> out;
  for (const addrinfo* a = list.head; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress& address = out.emplace_back();
    std::memcpy(&address.storage, a->ai_addr, a->ai_addrlen);
    address.length = a->ai_addrlen;
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", host_port.host, "' resolves to no address"));
  }
  return out;
}

BoundSocket BindFirst(const std::vector<SocketAddress>& addresses) {
  BoundSocket out;
  for (const SocketAddress& address : addresses) {
    UniqueFd fd(socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      out.socket_error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd.get(), address.get(), address.length) == 0) {
      out.fd = std::move(fd);
      return out;
    }
    out.bind_error = errno;
    if (out.bind_error == EADDRINUSE) break;
  }
  return out;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return -1;
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

}  // namespace tandem
