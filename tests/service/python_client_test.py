#!/usr/bin/python3
"""tandem-gpu-service called from Python (Debian's python3-grpcio and python3-protobuf).

Starts the service on a free loopback port with the tiny model, then checks that Generate and
GenerateStream give the same greedy tokens as `tandem generate` (the offline path), that the
streamed pieces concatenate to the unary text, and that a bad request is INVALID_ARGUMENT naming
the field. Stubs: generation_pb2 from `protoc --python_out` (built by CMake) and grpc's generic
unary/stream calls, so no grpc_tools is needed.

usage: python_client_test.py BUILD_DIR PB2_DIR
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc

BUILD, PB2 = sys.argv[1], sys.argv[2]
sys.path.insert(0, PB2)
from tandem.v1 import generation_pb2 as pb  # noqa: E402

N = 12
PROMPT = "Hello from Python"


def model_path(tmp):
    shared = os.path.join(BUILD, "tests", "service", "tiny.gguf")
    if os.path.exists(shared):
        return shared
    path = os.path.join(tmp, "tiny.gguf")
    subprocess.run([os.path.join(BUILD, "gpu_service", "tandem"), "gen-model", "--preset", "tiny",
                    "--out", path], check=True, stdout=subprocess.DEVNULL)
    return path


def offline_ids(model):
    out = subprocess.run([os.path.join(BUILD, "gpu_service", "tandem"), "generate", "--model", model,
                          "--prompt", PROMPT, "-n", str(N), "--ids", "--threads", "2"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("generated_ids:"):
            return [int(x) for x in line.split(":")[1].split()]
    raise AssertionError("no generated_ids in: " + out)


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        model = model_path(tmp)
        ready = os.path.join(tmp, "ready")
        log = open(os.path.join(tmp, "service.log"), "w")
        service = subprocess.Popen(
            [os.path.join(BUILD, "gpu_service", "tandem-gpu-service"), "--model", model,
             "--listen", "127.0.0.1:0", "--ready-file", ready, "--threads", "2"],
            stdout=subprocess.DEVNULL, stderr=log)
        try:
            for _ in range(6000):
                if os.path.exists(ready) or service.poll() is not None:
                    break
                time.sleep(0.01)
            port = dict(line.split("=") for line in open(ready).read().split())["grpc_port"]
            channel = grpc.insecure_channel("127.0.0.1:" + port)
            generate = channel.unary_unary(
                "/tandem.v1.Generation/Generate",
                request_serializer=pb.GenerateRequest.SerializeToString,
                response_deserializer=pb.GenerateResponse.FromString)
            stream = channel.unary_stream(
                "/tandem.v1.Generation/GenerateStream",
                request_serializer=pb.GenerateStreamRequest.SerializeToString,
                response_deserializer=pb.GenerationChunk.FromString)
            params = pb.GenerationParameters(
                stopping=pb.StoppingCriteria(max_new_tokens=N, ignore_eos=True),
                response=pb.ResponseOptions(generated_tokens=True))

            want = offline_ids(model)
            resp, call = generate.with_call(
                pb.GenerateRequest(inputs=[pb.GenerationInput(text=PROMPT)], params=params),
                metadata=[("x-request-id", "python-1")], timeout=60)
            unary = [t.id for t in resp.results[0].tokens]
            check(unary == want, "Generate tokens %s != tandem generate %s" % (unary, want))
            check(resp.request_id == "python-1", "request id not echoed: " + resp.request_id)
            check(resp.results[0].stop_reason == pb.MAX_TOKENS, "unary stop reason")

            chunks = list(stream(pb.GenerateStreamRequest(input=pb.GenerationInput(text=PROMPT),
                                                          params=params), timeout=60))
            streamed = [t.id for c in chunks for t in c.tokens]
            check(streamed == want, "GenerateStream tokens %s != %s" % (streamed, want))
            check("".join(c.text for c in chunks) == resp.results[0].text,
                  "streamed pieces do not concatenate to the unary text")
            check(chunks[0].input_token_count == resp.results[0].input_token_count,
                  "first chunk lacks the input token count")
            check(chunks[-1].stop_reason == pb.MAX_TOKENS, "last chunk's stop reason")

            try:
                generate(pb.GenerateRequest(
                    inputs=[pb.GenerationInput(text="x")],
                    params=pb.GenerationParameters(sampling=pb.SamplingParameters(min_p=2))),
                    timeout=60)
                check(False, "min_p = 2 was accepted")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "bad min_p: %s" % e.code())
                check(e.details().startswith("params.sampling.min_p"), "field not named: " + e.details())
            channel.close()
        finally:
            service.send_signal(signal.SIGTERM)
            code = service.wait(timeout=60)
            check(code == 0, "service exit code %s" % code)
    if failures:
        sys.exit(1)
    print("python client: all checks passed")


if __name__ == "__main__":
    main()
