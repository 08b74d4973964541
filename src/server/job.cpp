#include "server/job.h"

#include <chrono>

#include "base/log.h"
#include "server/errors.h"
#include "server/sse.h"

namespace lily::server {

namespace {

using Clock = std::chrono::steady_clock;

const char* const kStopped = "the server is shutting down: the generation was stopped when the drain time was over";

void set_error(HttpResponse& res, const ApiError& e, int retry_after) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", std::to_string(retry_after));
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
    return ctx.service().complete(job.prepared, on_delta);
  } catch (const RequestError& e) {
    throw ApiError(400, e.what(), e.param, e.code);
  } catch (const std::exception& e) {
    LILY_LOG_WARN("generation failed: {}", e.what());
    throw ApiError(500, std::string("generation failed: ") + e.what());
  }
}

void run_whole(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, CompletionJob& job,
               std::unique_ptr<RequestQueue::Ticket> ticket) {
  const auto joined = Clock::now();
  if (!ticket->wait([&] { return req.client_alive(); })) {
    set_error(res, ApiError(503, "the server is shutting down or the client went away"), 1);
    return;
  }
  const double queued = std::chrono::duration<double>(Clock::now() - joined).count();
  try {
    CompletionResult r = run_completion(ctx, job,
                                        [&](const ChatDelta&) { return req.client_alive() && !ctx.stop_generation; });
    ticket.reset();
    ctx.metrics.count_completion(r, queued);
    if (r.cancelled && ctx.stop_generation) return set_error(res, ApiError(503, kStopped), 1);
    res.set_content(dump(job.body(r)), "application/json");
  } catch (const ApiError& e) {
    set_error(res, e, 1);
  }
}

void run_streamed(ServerContext& ctx, StreamSink& sink, CompletionJob& job,
                  std::unique_ptr<RequestQueue::Ticket> ticket) {
  const auto joined = Clock::now();
  SseWriter sse([&](const char* data, size_t size) { return sink.write({data, size}); });
  // The stream starts now, whatever the wait: a client or proxy that sees nothing for long gives up.
  for (const json& e : job.opening()) sse.event(e);
  if (const size_t ahead = ticket->ahead(); ahead > 0) {
    sse.comment(fmt::format("waiting for {} request{} ahead", ahead, ahead == 1 ? "" : "s"));
  }
  if (!ticket->wait([&] { return sink.alive(); })) {
    ticket.reset();
    if (!sink.alive()) return;
    sse.event(error_json(503, "the server is shutting down"));
    sse.done();
    return;
  }
  const double queued = std::chrono::duration<double>(Clock::now() - joined).count();
  CompletionResult r;
  try {
    r = run_completion(ctx, job, [&](const ChatDelta& d) {
      for (const json& e : job.delta_events(d)) {
        if (!sse.event(e)) return false;
      }
      return sink.alive() && !ctx.stop_generation;
    });
  } catch (const ApiError& e) {
    // Mid-stream failure: an error event, then [DONE] (what the openai SDKs expect).
    sse.event(error_json(e));
    sse.done();
    return;
  }
  ticket.reset();
  ctx.metrics.count_completion(r, queued);
  if (r.cancelled) {
    if (ctx.stop_generation && sse.ok()) {
      sse.event(error_json(503, kStopped));
      sse.done();
    }
    return;
  }
  for (const json& e : job.closing(r)) sse.event(e);
  sse.done();
}

}  // namespace

void run_job(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, std::shared_ptr<CompletionJob> job) {
  std::unique_ptr<RequestQueue::Ticket> ticket = ctx.queue.join();
  if (!ticket) {
    set_error(res,
              ApiError(503, ctx.queue.shutting_down() ? "the server is shutting down"
                                                      : "the server is busy: too many requests are waiting"),
              ctx.options.retry_after_seconds);
    return;
  }
  if (!job->stream) return run_whole(ctx, req, res, *job, std::move(ticket));

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The writer runs once, on this request's worker thread, after the head is sent.
  auto held = std::make_shared<std::unique_ptr<RequestQueue::Ticket>>(std::move(ticket));
  res.set_stream("text/event-stream",
                 [&ctx, job, held](StreamSink& sink) { run_streamed(ctx, sink, *job, std::move(*held)); });
}

}  // namespace lily::server
