#!/usr/bin/python3
"""A small client of tandem.v1.Generation (Debian's python3-grpcio and python3-protobuf).

Message classes come from `protoc --python_out` (scripts/run.sh and scripts/loadtest.sh generate
them into BUILD_DIR/python); the calls go through grpc's generic unary / unary-stream methods, so
no grpc_tools is needed.

  tandem_client.py --pb2 DIR stream  --target 127.0.0.1:50051 --prompt TEXT [-n 32]
  tandem_client.py --pb2 DIR health  --target 127.0.0.1:50051 [--wait SECONDS]
"""
import argparse
import sys
import time


def load(pb2_dir):
    sys.path.insert(0, pb2_dir)
    import grpc  # noqa: F401  (imported here so --help works without it)
    from tandem.v1 import generation_pb2
    return generation_pb2


def stream_call(channel, pb):
    return channel.unary_stream("/tandem.v1.Generation/GenerateStream",
                                request_serializer=pb.GenerateStreamRequest.SerializeToString,
                                response_deserializer=pb.GenerationChunk.FromString)


def health_status(channel, timeout):
    """grpc.health.v1.Health/Check for the whole server: 1 SERVING, 2 NOT_SERVING."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda _: b"",
                                response_deserializer=lambda b: b)
    wire = check(None, timeout=timeout)
    # HealthCheckResponse{status = N}: tag 0x08 then a one-byte varint (0 is the empty message).
    return wire[1] if len(wire) == 2 and wire[0] == 0x08 else 0


def wait_for_serving(target, seconds):
    import grpc
    deadline = time.monotonic() + seconds
    with grpc.insecure_channel(target) as channel:
        while time.monotonic() < deadline:
            try:
                if health_status(channel, 2) == 1:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


def demo_stream(pb, target, prompt, n):
    """Streams one greedy generation, printing the text as it arrives."""
    import grpc
    with grpc.insecure_channel(target) as channel:
        req = pb.GenerateStreamRequest()
        req.input.text = prompt
        req.params.stopping.max_new_tokens = n
        start = time.monotonic()
        first = None
        tokens = 0
        sys.stdout.write(prompt)
        sys.stdout.flush()
        last = None
        for chunk in stream_call(channel, pb)(req, timeout=120):
            if chunk.generated_token_count and first is None:
                first = time.monotonic() - start
            tokens = chunk.generated_token_count
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
        total = time.monotonic() - start
        reason = pb.StopReason.Name(last.stop_reason) if last is not None else "none"
        sys.stdout.write("\n")
        print(f"[{tokens} tokens, stop {reason}, first token {1000 * (first or 0):.0f} ms, "
              f"total {1000 * total:.0f} ms]")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pb2", required=True, help="directory holding tandem/v1/generation_pb2.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stream")
    s.add_argument("--target", default="127.0.0.1:50051")
    s.add_argument("--prompt", default="Tandem serves experts in tandem:")
    s.add_argument("-n", type=int, default=32)
    h = sub.add_parser("health")
    h.add_argument("--target", default="127.0.0.1:50051")
    h.add_argument("--wait", type=float, default=0)
    args = ap.parse_args()
    pb = load(args.pb2)
    if args.cmd == "stream":
        demo_stream(pb, args.target, args.prompt, args.n)
    elif args.cmd == "health":
        if not wait_for_serving(args.target, max(args.wait, 0.1)):
            print("not SERVING", file=sys.stderr)
            return 1
        print("SERVING")
    return 0


if __name__ == "__main__":
    sys.exit(main())
