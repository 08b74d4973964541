// session_cache.cpp: POST /cache/clear, lily's own route (no OpenAI counterpart): forgets every
// conversation the session cache keeps (src/runtime/prefix_cache.h) and gives the memory back to
// the system. It waits its turn in the request queue like a completion; the conversations that are
// running are out of the cache while they run (prefix_cache.h), so it may clear beside them.
// Answers {"cleared_sequences": N, "cleared_bytes": B}.
#include <malloc.h>

#include "server/errors.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

void handle_cache_clear(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  ChatService& service = ctx.service();
  std::unique_ptr<RequestQueue::Ticket> ticket = ctx.queue.join();
  if (!ticket) throw ApiError(503, "the server is busy: too many requests are waiting");
  if (!ticket->wait([&] { return req.client_alive(); })) {
    throw ApiError(503, "the server is shutting down or the client went away");
  }
  const PrefixCacheStats before = service.cache_stats();
  service.clear_cache();
  malloc_trim(0);  // the freed states are large: give the pages back now, not at the next growth
  res.set_content(dump(json{{"cleared_sequences", before.sequences}, {"cleared_bytes", before.bytes}}),
                  "application/json");
}

}  // namespace lily::server
