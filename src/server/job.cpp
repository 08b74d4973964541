#include "server/job.h"

#include <httplib.h>

#include <chrono>

#include "base/log.h"
#include "server/errors.h"
#include "server/sse.h"

namespace lily::server {

namespace {

using Clock = std::chrono::steady_clock;

void set_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

// Runs the completion; a failure of the server's own (not the client's) becomes an ApiError 500.
CompletionResult run_completion(ServerContext& ctx, const CompletionJob& job, const DeltaCallback& on_delta) {
  ctx.running = true;
  struct Reset {
    std::atomic<bool>& flag;
    ~Reset() { flag = false; }
  } reset{ctx.running};
  try {
    return ctx.service.complete(job.prepared, on_delta);
  } catch (const RequestError& e) {
    throw ApiError(400, e.what(), e.param, e.code);
  } catch (const std::exception& e) {
    LILY_LOG_WARN("generation failed: {}", e.what());
    throw ApiError(500, std::string("generation failed: ") + e.what());
  }
}

}  // namespace

void run_job(ServerContext& ctx, const httplib::Request& req, httplib::Response& res,
             std::shared_ptr<CompletionJob> job) {
  std::shared_ptr<RequestQueue::Ticket> ticket = ctx.queue.join();
  if (!ticket) {
    res.set_header("Retry-After", std::to_string(ctx.options.retry_after_seconds));
    set_error(res, ApiError(503, ctx.queue.shutting_down() ? "the server is shutting down"
                                                           : "the server is busy: too many requests are waiting"));
    return;
  }
  const auto joined = Clock::now();
  auto connection = std::make_shared<ClientConnection>(req);

  if (!job->stream) {
    if (!ticket->wait([&] { return connection->alive(); })) {
      set_error(res, ApiError(503, "the server is shutting down or the client went away"));
      return;
    }
    const double queued = std::chrono::duration<double>(Clock::now() - joined).count();
    try {
      CompletionResult r = run_completion(
          ctx, *job, [&](const ChatDelta&) { return connection->alive() && !ctx.queue.shutting_down(); });
      ticket.reset();
      ctx.metrics.count_completion(r, queued);
      res.set_content(dump(job->body(r)), "application/json");
    } catch (const ApiError& e) {
      set_error(res, e);
    }
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [&ctx, job, ticket, connection, joined](size_t, httplib::DataSink& sink) mutable {
        SseWriter sse([&](const char* data, size_t size) { return sink.write(data, size); });
        if (!ticket->wait([&] { return connection->alive(); })) {
          ticket.reset();
          if (!connection->alive()) return false;
          sse.event(error_json(503, "the server is shutting down"));
          sse.done();
          sink.done();
          return true;
        }
        const double queued = std::chrono::duration<double>(Clock::now() - joined).count();
        for (const json& e : job->opening()) sse.event(e);
        CompletionResult r;
        try {
          r = run_completion(ctx, *job, [&](const ChatDelta& d) {
            for (const json& e : job->delta_events(d)) {
              if (!sse.event(e)) return false;
            }
            return connection->alive() && !ctx.queue.shutting_down();
          });
        } catch (const ApiError& e) {
          ticket.reset();
          // Mid-stream failure: an error event, then [DONE] (what the openai SDKs expect).
          sse.event(error_json(e));
          sse.done();
          sink.done();
          return sse.ok();
        }
        ticket.reset();
        ctx.metrics.count_completion(r, queued);
        if (r.cancelled || !sse.ok()) return false;
        for (const json& e : job->closing(r)) sse.event(e);
        sse.done();
        sink.done();
        return sse.ok();
      });
}

}  // namespace lily::server
