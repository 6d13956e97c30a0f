#!/usr/bin/python3
"""Load test of tandem.v1.Generation over loopback (python3-grpcio; see scripts/loadtest.sh).

Sweep: for each concurrency C, C client threads send greedy GenerateStream requests back to back
until --requests requests have been sent or --seconds have passed (whichever first), then the
level's figures are printed: requests/s, generated tokens/s, time to first token and inter-token
latency p50/p99, and the calls by final gRPC status.

Soak (--soak MINUTES): concurrency 16 for that long; every request must end with a response or an
explicit gRPC error (a call that ends any other way is counted as lost), and the service's RSS
(and its workers') is sampled from /proc every 10 s.

Inter-token latency is measured per token: a chunk carrying k tokens after a gap g counts k gaps
of g/k (the service merges tokens into one message while the previous write is in flight).
"""
import argparse
import collections
import os
import sys
import threading
import time


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


class Level:
    def __init__(self):
        self.lock = threading.Lock()
        self.ttft = []
        self.itl = []
        self.tokens = 0
        self.statuses = collections.Counter()
        self.sent = 0
        self.lost = 0


def run_client(stub, pb, grpc, level, prompts, max_new_tokens, stop_at, max_requests, timeout):
    import itertools
    for i in itertools.count():
        with level.lock:
            if level.sent >= max_requests or time.monotonic() >= stop_at:
                return
            level.sent += 1
            n = level.sent
        req = pb.GenerateStreamRequest()
        req.input.text = prompts[n % len(prompts)]
        req.params.stopping.max_new_tokens = max_new_tokens
        req.params.stopping.ignore_eos = True
        start = time.monotonic()
        last = None
        ttft = None
        gaps = []
        tokens = 0
        try:
            for chunk in stub(req, timeout=timeout):
                now = time.monotonic()
                k = chunk.generated_token_count - tokens
                if k > 0:
                    if ttft is None:
                        ttft = now - start
                        if k > 1:
                            gaps.extend([0.0] * (k - 1))
                    else:
                        gaps.extend([(now - last) / k] * k)
                    tokens = chunk.generated_token_count
                    last = now
            status = "OK"
        except grpc.RpcError as e:
            status = e.code().name
        except Exception as e:  # noqa: BLE001  anything that is not a gRPC status is a lost call
            status = "LOST(" + type(e).__name__ + ")"
        with level.lock:
            level.statuses[status] += 1
            if status.startswith("LOST"):
                level.lost += 1
            level.tokens += tokens
            if ttft is not None:
                level.ttft.append(ttft)
            level.itl.extend(gaps)


def run_level(channel, pb, grpc, concurrency, max_requests, seconds, max_new_tokens, timeout):
    stub = channel.unary_stream("/tandem.v1.Generation/GenerateStream",
                                request_serializer=pb.GenerateStreamRequest.SerializeToString,
                                response_deserializer=pb.GenerationChunk.FromString)
    prompts = [f"load test prompt {i}: " + "word " * (i % 9) for i in range(64)]
    level = Level()
    start = time.monotonic()
    stop_at = start + seconds
    threads = [threading.Thread(target=run_client,
                                args=(stub, pb, grpc, level, prompts, max_new_tokens, stop_at,
                                      max_requests, timeout), daemon=True)
               for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level.elapsed = time.monotonic() - start
    return level


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def print_header():
    print(f"{'conc':>4} {'reqs':>6} {'req/s':>7} {'tok/s':>8} {'ttft_p50':>9} {'ttft_p99':>9} "
          f"{'itl_p50':>8} {'itl_p99':>8}  statuses")


def print_level(c, lv):
    done = sum(lv.statuses.values())
    print(f"{c:>4} {done:>6} {done / lv.elapsed:>7.2f} {lv.tokens / lv.elapsed:>8.1f} "
          f"{1000 * percentile(lv.ttft, 50):>7.1f}ms {1000 * percentile(lv.ttft, 99):>7.1f}ms "
          f"{1000 * percentile(lv.itl, 50):>6.1f}ms {1000 * percentile(lv.itl, 99):>6.1f}ms  "
          + " ".join(f"{k}={v}" for k, v in sorted(lv.statuses.items())), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pb2", required=True)
    ap.add_argument("--target", required=True, help="host:port; must be a loopback address")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--requests", type=int, default=200, help="per level, at most")
    ap.add_argument("--seconds", type=float, default=30, help="per level, at most")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120, help="per call deadline")
    ap.add_argument("--soak", type=float, default=0, help="minutes at concurrency 16")
    ap.add_argument("--service-pid", type=int, default=0, help="for the soak's RSS samples")
    args = ap.parse_args()
    host = args.target.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]", "::1"):
        print(f"loadtest: {args.target} is not a loopback address", file=sys.stderr)
        return 2
    sys.path.insert(0, args.pb2)
    import grpc
    from tandem.v1 import generation_pb2 as pb
    channel = grpc.insecure_channel(args.target)
    grpc.channel_ready_future(channel).result(timeout=30)

    if args.soak <= 0:
        print(f"loadtest: {args.target}, max_new_tokens {args.max_new_tokens}, per level at most "
              f"{args.requests} requests or {args.seconds:.0f} s")
        print_header()
        for c in [int(x) for x in args.concurrency.split(",")]:
            lv = run_level(channel, pb, grpc, c, args.requests, args.seconds, args.max_new_tokens,
                           args.timeout)
            print_level(c, lv)
        return 0

    # Soak: one long level at concurrency 16 in a thread, RSS sampled here every 10 s.
    minutes = args.soak
    print(f"loadtest: soak {minutes:g} min at concurrency 16, max_new_tokens "
          f"{args.max_new_tokens}, service pid {args.service_pid}")
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "lv", run_level(channel, pb, grpc, 16, 1 << 62, minutes * 60, args.max_new_tokens,
                        args.timeout)), daemon=True)
    start = time.monotonic()
    t.start()
    samples = []
    while t.is_alive():
        t.join(timeout=10)
        if args.service_pid:
            svc = rss_kib(args.service_pid)
            workers = [rss_kib(p) or 0 for p in children(args.service_pid)]
            samples.append((time.monotonic() - start, svc, sum(workers)))
            print(f"  t={samples[-1][0]:6.0f}s service_rss={svc} KiB workers_rss={sum(workers)} KiB",
                  flush=True)
    lv = result["lv"]
    print_header()
    print_level(16, lv)
    done = sum(lv.statuses.values())
    print(f"soak: sent {lv.sent}, ended {done} ({lv.sent - done} without an end), lost {lv.lost}")
    ok = lv.sent == done and lv.lost == 0
    if len(samples) >= 4:
        warm = [s[1] for s in samples[len(samples) // 4:] if s[1]]
        if warm:
            growth = max(warm) - min(warm)
            print(f"soak: service RSS after warm-up (last 3/4 of samples): min {min(warm)} KiB, "
                  f"max {max(warm)} KiB, spread {growth} KiB; first {samples[0][1]} KiB, "
                  f"last {samples[-1][1]} KiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
