// A start-up check that a listening address is free, made before the model loads: the gRPC and
// metrics servers bind only once the model is loaded (minutes for an 80B file), and a port already
// taken should fail the start at once, naming its flag. The servers' own binds still decide (the
// port may be taken between the check and the bind).
#ifndef TANDEM_GPU_SERVICE_SERVER_LISTEN_CHECK_H_
#define TANDEM_GPU_SERVICE_SERVER_LISTEN_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace tandem {

// `listen` is HOST:PORT ("127.0.0.1:50051", "[::]:50051", "localhost:0"). OK when the port is 0
// (any free port), when the host is empty or the address is not of that form (left to the server,
// which knows its own forms, e.g. gRPC's "unix:PATH"), when a socket binds one of the addresses
// the host resolves to, when no socket can be made to probe with, or when a wildcard address fails
// for another reason than being in use (the server may bind it through the other address family);
// else FailedPrecondition (in use) or InvalidArgument (unknown host, an address not on this
// machine), starting with `flag`.
absl::Status CheckListenAddressFree(const std::string& flag, const std::string& listen);

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_LISTEN_CHECK_H_
