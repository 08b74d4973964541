// job.h: running one prepared completion in its turn, streamed (SSE) or as one JSON body.
//
// The endpoint builds the job (the prepared prompt and how to encode what comes out); run_job
// queues it (503 + Retry-After when the line is full), waits for its turn, runs it, and stops
// it at the next token when the client goes away or the drain time of a shutdown is over.
// A stream starts at once, before its turn: the role chunk and a comment saying how many
// requests are ahead go out first, then the transport's ": keep-alive" comments while it waits.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

struct CompletionJob {
  PreparedCompletion prepared;
  bool stream = false;
  std::function<std::vector<json>()> opening;                         // stream: first events
  std::function<std::vector<json>(const ChatDelta&)> delta_events;    // stream: per delta
  std::function<std::vector<json>(const CompletionResult&)> closing;  // stream: last events
  std::function<json(const CompletionResult&)> body;                  // not streamed
};

void run_job(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, std::shared_ptr<CompletionJob> job);

}  // namespace lily::server
