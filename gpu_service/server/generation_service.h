// tandem.v1.Generation over gRPC's callback API (no thread per request): each call is a reactor
// object; generation requests go to the Engine, whose sinks feed the reactors from the engine's
// thread. Methods are registered raw so that bad requests are answered INVALID_ARGUMENT naming the
// field (raw_request.h).
//
// Every call echoes a request id (x-request-id metadata, else a generated one) in the initial
// metadata, in the response's request_id, and in its one log line (request_log.h).
//
// Status codes: INVALID_ARGUMENT for a bad request; RESOURCE_EXHAUSTED when the queue is full;
// UNAVAILABLE while shutting down; INTERNAL when the backend failed mid-request (the stream's last
// message has stop reason ERROR first); CANCELLED when the client went away.
#ifndef TANDEM_GPU_SERVICE_SERVER_GENERATION_SERVICE_H_
#define TANDEM_GPU_SERVICE_SERVER_GENERATION_SERVICE_H_

#include "gpu_service/backend/backend.h"
#include "gpu_service/engine/engine.h"
#include "gpu_service/server/request_validation.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

using GenerationRawService = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_GenerateStream<
        v1::Generation::WithRawCallbackMethod_Tokenize<
            v1::Generation::WithRawCallbackMethod_Detokenize<
                v1::Generation::WithRawCallbackMethod_ModelInfo<v1::Generation::Service>>>>>;

class GenerationService final : public GenerationRawService {
 public:
  // `engine` and `backend` must outlive the service (and the gRPC server it is registered in).
  GenerationService(Engine* engine, const Backend* backend, const ServingLimits& limits);

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

 private:
  class GenerateCall;
  class StreamCall;

  Engine* engine_;
  const Backend* backend_;
  ServingLimits limits_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_SERVER_GENERATION_SERVICE_H_
