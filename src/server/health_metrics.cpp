// health_metrics.cpp: GET /health (200 {"status": "ok"} and the slots once the model is loaded;
// 503 with the loading phase before) and GET /metrics (Prometheus text exposition format 0.0.4).

#include "server/errors.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

std::string escape_label_value(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Metrics::count_request(const std::string& route_label, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route_label, status}];
}

void Metrics::count_completion(const CompletionResult& r, double queue_seconds) {
  std::lock_guard lock(mutex_);
  ++completions_;
  if (r.cancelled) ++cancelled_;
  prompt_tokens_ += r.usage.prompt_tokens;
  cached_tokens_ += r.usage.cached_tokens;
  generated_tokens_ += r.usage.completion_tokens;
  prefilled_tokens_ += r.timings.prefilled_tokens;
  drafted_tokens_ += r.timings.drafted_tokens;
  accepted_tokens_ += r.timings.accepted_tokens;
  prefill_seconds_ += r.timings.prefill_seconds;
  decode_seconds_ += r.timings.decode_seconds;
  ttft_seconds_ += r.timings.first_token_seconds;
  queue_seconds_ += queue_seconds;
  last_ttft_ = r.timings.first_token_seconds;
  if (r.timings.prefill_seconds > 0) last_prefill_tps_ = double(r.timings.prefilled_tokens) / r.timings.prefill_seconds;
  if (r.timings.decode_seconds > 0) last_decode_tps_ = double(r.timings.decoded_tokens) / r.timings.decode_seconds;
}

std::string Metrics::prometheus(size_t queue_depth, const SlotStats& slots, const PrefixCacheStats& cache, bool ready,
                                size_t connections) const {
  std::lock_guard lock(mutex_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  out += "# HELP lily_requests_total HTTP requests by route and status.\n# TYPE lily_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += fmt::format("lily_requests_total{{path=\"{}\",status=\"{}\"}} {}\n", escape_label_value(key.first),
                       key.second, n);
  }
  metric("lily_completions_total", "counter", "Completions run (chat and text).", completions_);
  metric("lily_completions_cancelled_total", "counter", "Completions stopped because the client went away.",
         cancelled_);
  metric("lily_prompt_tokens_total", "counter", "Prompt tokens of all completions.", prompt_tokens_);
  metric("lily_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the session cache (not computed).",
         cached_tokens_);
  metric("lily_prefill_tokens_total", "counter", "Prompt tokens computed.", prefilled_tokens_);
  metric("lily_generated_tokens_total", "counter", "Completion tokens generated.", generated_tokens_);
  metric("lily_speculative_drafted_tokens_total", "counter",
         "Tokens the MTP head drafted for speculative decoding (--speculate).", drafted_tokens_);
  metric("lily_speculative_accepted_tokens_total", "counter",
         "Drafted tokens the verify kept (each a completion token; the rest were refused).", accepted_tokens_);
  metric("lily_prefill_seconds_total", "counter", "Time spent computing prompts.", prefill_seconds_);
  metric("lily_decode_seconds_total", "counter", "Time spent generating tokens.", decode_seconds_);
  metric("lily_time_to_first_token_seconds_total", "counter", "Sum of the times to first token (queue wait excluded).",
         ttft_seconds_);
  metric("lily_queue_seconds_total", "counter", "Time requests spent waiting in the queue.", queue_seconds_);
  metric("lily_time_to_first_token_seconds", "gauge", "Time to first token of the last completion.", last_ttft_);
  metric("lily_prefill_tokens_per_second", "gauge", "Prefill speed of the last completion.", last_prefill_tps_);
  metric("lily_decode_tokens_per_second", "gauge", "Decode speed of the last completion.", last_decode_tps_);
  metric("lily_queue_depth", "gauge", "Requests waiting for their turn.", queue_depth);
  metric("lily_busy", "gauge", "1 while a completion is running.", slots.busy > 0 ? 1 : 0);
  metric("lily_slots", "gauge", "Completions that may run at once (--parallel).", slots.slots);
  metric("lily_slots_busy", "gauge", "Slots running a completion.", slots.busy);
  metric("lily_ready", "gauge", "1 once the model is loaded.", ready ? 1 : 0);
  metric("lily_http_connections", "gauge", "HTTP connections open.", connections);
  metric("lily_session_cache_sequences", "gauge", "Conversations kept in the session cache.", cache.sequences);
  metric("lily_session_cache_bytes", "gauge", "Memory held by the session cache.", cache.bytes);
  metric("lily_session_cache_budget_bytes", "gauge", "Memory budget of the session cache.", cache.budget_bytes);
  return out;
}

void handle_health(ServerContext& ctx, const HttpRequest&, HttpResponse& res) {
  if (!ctx.ready()) {
    // Loading: what is being done and for how long (the load has no finer measure of progress).
    const auto [phase, seconds] = ctx.phase();
    res.status = 503;
    res.set_header("Retry-After", "1");
    res.set_content(dump(json{{"status", "loading"}, {"phase", phase}, {"elapsed_seconds", seconds}}),
                    "application/json");
    return;
  }
  const SlotStats slots = ctx.slots();
  res.set_content(dump(json{{"status", "ok"},
                            {"slots", slots.slots},
                            {"slots_busy", slots.busy},
                            {"slots_idle", size_t(slots.slots) - std::min(slots.busy, size_t(slots.slots))},
                            {"waiting", slots.waiting}}),
                  "application/json");
}

void handle_metrics(ServerContext& ctx, const HttpRequest&, HttpResponse& res) {
  const PrefixCacheStats cache = ctx.ready() ? ctx.service().cache_stats() : PrefixCacheStats{};
  const SlotStats slots = ctx.slots();
  res.set_content(ctx.metrics.prometheus(slots.waiting, slots, cache, ctx.ready(), ctx.open_connections()),
                  "text/plain; version=0.0.4");
}

}  // namespace lily::server
