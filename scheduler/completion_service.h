// tripod.v1.Completion on the scheduler's gRPC port: the client API of the HTTP front end for
// gRPC clients (Complete: the whole answer; Generate: a stream of chunks). A thin adapter: the
// same parsing, checks and dispatcher as HTTP; errors are gRPC status codes whose message is the
// OpenAI-style JSON error body. The callback API holds no thread per call, so open streams cost
// what open SSE streams cost. A client that cancels its call cancels the request on the workers.
#pragma once

#include "grpcpp/grpcpp.h"
#include "scheduler/api_keys.h"
#include "scheduler/dispatcher.h"
#include "scheduler/served_model.h"
#include "tripod/v1/completion.grpc.pb.h"

namespace tripod::scheduler {

class CompletionService final : public v1::Completion::CallbackService {
 public:
  CompletionService(const ServedModel* model, Dispatcher* dispatcher, const ApiKeys* keys)
      : model_(model), dispatcher_(dispatcher), keys_(keys), max_n_(dispatcher->options().max_n) {}

  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* context,
                                     const v1::CompletionRequest* request,
                                     v1::CompletionResponse* response) override;
  grpc::ServerWriteReactor<v1::CompletionChunk>* Generate(
      grpc::CallbackServerContext* context, const v1::CompletionRequest* request) override;

 private:
  const ServedModel* model_;
  Dispatcher* dispatcher_;
  const ApiKeys* keys_;
  const int max_n_;  // the dispatcher's: n and best_of at most (choices.h)
};

}  // namespace tripod::scheduler
