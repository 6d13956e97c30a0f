// HOST:PORT parsing and resolution (gpu_service/net) and the metrics server that binds through it:
// an address the start-up check passes must be one the metrics server can listen on.
#include "gpu_service/net/listen_address.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "gpu_service/metrics/metrics_http_server.h"
#include "gpu_service/server/listen_check.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ParseHostPortTest, TakesHostsPortsAndBracketedIpv6) {
  std::optional<HostPort> a = ParseHostPort("127.0.0.1:50051");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  std::optional<HostPort> b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  std::optional<HostPort> c = ParseHostPort(":9090");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->host, "");
  EXPECT_EQ(ParseHostPort("localhost:65535")->port, 65535);
}

TEST(ParseHostPortTest, RefusesWhatIsNotHostPort) {
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1",
                          "127.0.0.1:+80", "127.0.0.1: 80", "127.0.0.1:80x", "::1:80",
                          "unix:/tmp/x", "unix:a:1", "h:123456"}) {
    EXPECT_FALSE(ParseHostPort(bad).has_value()) << bad;
  }
}

TEST(ResolveHostPortTest, ResolvesNumericAndNamedHostsAndNamesTheFlag) {
  absl::StatusOr<std::vector<SocketAddress>> v4 = ResolveHostPort("--x", {"127.0.0.1", 80});
  ASSERT_TRUE(v4.ok()) << v4.status();
  ASSERT_EQ(v4->size(), 1u);
  EXPECT_EQ(v4->front().family(), AF_INET);
  EXPECT_FALSE(v4->front().wildcard());
  EXPECT_EQ(ntohs(reinterpret_cast<const sockaddr_in*>(v4->front().get())->sin_port), 80);
  absl::StatusOr<std::vector<SocketAddress>> any = ResolveHostPort("--x", {"0.0.0.0", 1});
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_TRUE(any->front().wildcard());
  absl::StatusOr<std::vector<SocketAddress>> v6 = ResolveHostPort("--x", {"::1", 2});
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->front().family(), AF_INET6);
  absl::StatusOr<std::vector<SocketAddress>> local = ResolveHostPort("--x", {"localhost", 3});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->empty());
  absl::StatusOr<std::vector<SocketAddress>> bad = ResolveHostPort("--x", {"no-such-host.invalid", 1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().rfind("--x: ", 0), 0u) << bad.status();
}

// GET `path` from 127.0.0.1 or ::1 at `port`; the whole answer.
std::string HttpGet(int family, int port, const std::string& path) {
  UniqueFd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return "";
  sockaddr_storage addr{};
  socklen_t length = 0;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    length = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    length = sizeof *a;
  }
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), length) != 0) return "";
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  if (write(fd.get(), request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    return "";
  }
  std::string answer;
  char buf[512];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0) answer.append(buf, static_cast<size_t>(n));
  return answer;
}

bool Ipv6LoopbackWorks() {
  UniqueFd fd(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  return bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}

TEST(MetricsHttpServerTest, ServesOnIpv4AndRefusesATakenPortOrABadAddress) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> local =
      MetricsHttpServer::Start("localhost:0", [] { return std::string(); });
  EXPECT_TRUE(local.ok()) << local.status();

  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string("tandem_up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  const std::string answer = HttpGet(AF_INET, port, "/metrics");
  EXPECT_EQ(answer.rfind("HTTP/1.0 200", 0), 0u) << answer;
  EXPECT_NE(answer.find("tandem_up 1\n"), std::string::npos) << answer;
  EXPECT_EQ(HttpGet(AF_INET, port, "/other").rfind("HTTP/1.0 404", 0), 0u);

  const std::string taken = absl::StrCat("127.0.0.1:", port);
  EXPECT_EQ(CheckListenAddressFree("--metrics-listen", taken).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(taken, [] { return std::string(); });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  for (const char* bad : {"127.0.0.1", "::1:80", "no-such-host.invalid:0"}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> s =
        MetricsHttpServer::Start(bad, [] { return std::string(); });
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.status().message().rfind("--metrics-listen: ", 0), 0u) << s.status();
  }
}

// "[::1]:PORT" passed the start-up check but the metrics server had parsed IPv4 only, so the
// service failed after loading its model.
TEST(MetricsHttpServerTest, ServesOnIpv6WhereTheMachineHasIt) {
  if (!Ipv6LoopbackWorks()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("[::1]:0", [] { return std::string("tandem_up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string answer = HttpGet(AF_INET6, (*server)->port(), "/metrics");
  EXPECT_NE(answer.find("tandem_up 1\n"), std::string::npos) << answer;
}

}  // namespace
}  // namespace tandem
