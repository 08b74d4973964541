#include "server/job.h"

#include <chrono>

#include "base/log.h"
#include "server/errors.h"
#include "server/sse.h"

namespace lily::server {

namespace {

using Clock = std::chrono::steady_clock;

const char* const kStopped = "the server is shutting down: the generation was stopped when the drain time was over";

void set_error(HttpResponse& res, const CompletionJob& job, const ApiError& e, int retry_after) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", std::to_string(retry_after));
  res.set_content(dump(job.error_body(e)), "application/json");
}

// Writes the job's events in its framing.
class JobStream {
 public:
  JobStream(SseWriter& sse, const CompletionJob& job) : sse_(sse), job_(job) {}
  bool event(const json& e) {
    return job_.named_events ? sse_.event(e, e.value("type", std::string())) : sse_.event(e);
  }
  bool events(const std::vector<json>& events) {
    for (const json& e : events) {
      if (!event(e)) return false;
    }
    return true;
  }
  void end() {
    if (job_.done_marker) sse_.done();
  }
  // A failure ends the stream: its error event, then the end.
  void fail(const ApiError& e) {
    event(job_.error_event ? job_.error_event(e) : job_.error_body(e));
    end();
  }

 private:
  SseWriter& sse_;
  const CompletionJob& job_;
};

// Runs the completion; a failure of the server's own (not the client's) becomes an ApiError 500.
// keep_going: polled while a parallel completion runs (the client still there, the drain time
// not over).
CompletionResult run_completion(ServerContext& ctx, const CompletionJob& job, const DeltaCallback& on_delta,
                                const KeepGoing& keep_going) {
  ++ctx.running;
  struct Release {
    std::atomic<int>& running;
    ~Release() { --running; }
  } release{ctx.running};
  try {
    return ctx.service().complete(job.prepared, on_delta, keep_going);
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
    set_error(res, job, ApiError(503, "the server is shutting down or the client went away"), 1);
    return;
  }
  const double queued = std::chrono::duration<double>(Clock::now() - joined).count();
  try {
    const auto alive = [&] { return req.client_alive() && !ctx.stop_generation; };
    CompletionResult r = run_completion(
        ctx, job, [&](const ChatDelta&) { return alive(); }, alive);
    ticket.reset();
    ctx.metrics.count_completion(r, queued);
    if (r.cancelled && ctx.stop_generation) return set_error(res, job, ApiError(503, kStopped), 1);
    res.set_content(dump(job.body(r)), "application/json");
  } catch (const ApiError& e) {
    set_error(res, job, e, 1);
  }
}

void run_streamed(ServerContext& ctx, StreamSink& sink, CompletionJob& job,
                  std::unique_ptr<RequestQueue::Ticket> ticket) {
  const auto joined = Clock::now();
  SseWriter sse([&](const char* data, size_t size) { return sink.write({data, size}); });
  JobStream out(sse, job);
  // The stream starts now, whatever the wait: a client or proxy that sees nothing for long gives up.
  out.events(job.opening());
  if (const size_t ahead = ticket->ahead(); ahead > 0) {
    sse.comment(fmt::format("waiting for {} request{} ahead", ahead, ahead == 1 ? "" : "s"));
  }
  if (!ticket->wait([&] { return sink.alive(); })) {
    ticket.reset();
    if (!sink.alive()) return;
    out.fail(ApiError(503, "the server is shutting down"));
    return;
  }
  const double queued = std::chrono::duration<double>(Clock::now() - joined).count();
  CompletionResult r;
  try {
    r = run_completion(
        ctx, job,
        [&](const ChatDelta& d) { return out.events(job.delta_events(d)) && sink.alive() && !ctx.stop_generation; },
        [&] { return sink.alive() && !ctx.stop_generation; });
  } catch (const ApiError& e) {
    // Mid-stream failure: an error event, then the end ([DONE] for what the openai SDKs expect).
    out.fail(e);
    return;
  }
  ticket.reset();
  ctx.metrics.count_completion(r, queued);
  if (r.cancelled) {
    if (ctx.stop_generation && sse.ok()) out.fail(ApiError(503, kStopped));
    return;
  }
  out.events(job.closing(r));
  out.end();
}

}  // namespace

PreparedCompletion prepare_chat_within_context(const ChatService& service, ChatRequest chat) {
  const std::optional<int64_t> asked = chat.options.max_tokens;
  chat.options.max_tokens.reset();  // what the context leaves
  PreparedCompletion p;
  try {
    p = service.prepare_chat(chat);
  } catch (const TemplateError& e) {
    bad_request(e.what(), "messages");
  } catch (const RequestError& e) {
    bad_request(e.what(), e.param, e.code);
  }
  if (asked && *asked < p.max_tokens) p.max_tokens = *asked;
  p.options.max_tokens = p.max_tokens;
  return p;
}

void run_job(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, std::shared_ptr<CompletionJob> job) {
  std::unique_ptr<RequestQueue::Ticket> ticket = ctx.queue.join();
  if (!ticket) {
    set_error(res, *job,
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
