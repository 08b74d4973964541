// chat_batch.cpp: parallel completions (ChatServiceOptions::parallel > 1, chat_service.h).
//
// A completion is a BatchJob of the service's scheduler (batch_scheduler.h). On the scheduler
// thread: start() takes its sequence from the session cache and joins the batch (its template
// boundary a PrefillStop, where the snapshot is taken as complete() takes it); each token goes
// through ChatService::on_token (the first-token snapshot, stop ids, the reply stream: stop
// strings and the output parser decided there, token for token as on the serial path); end()
// builds the result and puts the sequence back in the cache. The reply's deltas go to an outbox;
// the calling thread, waiting in wait(), hands them to on_delta and polls KeepGoing, and a
// refusal of either cancels the job (it leaves the batch before the next step). Nothing the
// calling thread does can hold the steps of the others: a slow client only fills its outbox.
#include <condition_variable>
#include <mutex>

#include "base/error.h"
#include "runtime/chat_completion.h"

namespace lily {

SlotBudget SlotBudget::of(const ModelConfig& config, int64_t context, int parallel, uint64_t cache_budget,
                          uint64_t free_bytes) {
  SlotBudget b;
  b.per_slot = SessionCacheBudget::state_bytes(config, context);
  b.fit = std::max(parallel, 1);
  if (free_bytes == 0 || b.per_slot == 0) return b;
  b.room = free_bytes > cache_budget ? free_bytes - cache_budget : 0;
  b.fit = int(std::clamp<uint64_t>(b.room / b.per_slot, 1, uint64_t(b.fit)));
  return b;
}

std::string SlotBudget::shortfall(int parallel, int64_t context) const {
  const uint64_t mib = 1 << 20;
  return fmt::format("--parallel {} needs {} MiB for the slots' states ({} MiB each at a context of {} tokens: KV "
                     "cache, DeltaNet state and snapshots), but {} MiB are free beyond the session cache: {} fit; "
                     "lower --parallel, --ctx-size or --cache-mib",
                     parallel, per_slot * uint64_t(parallel) / mib, per_slot / mib, context, room / mib, fit);
}

class ChatService::BatchCompletion final : public BatchJob {
 public:
  BatchCompletion(ChatService& service, const PreparedCompletion& p)
      : service_(service), p_(p), start_(std::chrono::steady_clock::now()) {}

  std::optional<uint64_t> start(BatchGenerator& batch) override {
    c_.emplace(service_.begin(
        p_, [this](const ChatDelta& d) { return post(d); }, start_));
    Completion& c = *c_;
    if (cancel_) c.cancelled = true;
    if (c.cancelled || c.remaining() <= 0) return std::nullopt;
    PrefillStop stop;
    if (p_.options.use_cache) stop = {p_.reuse_boundary, [&c] { c.seq.snapshot_here(); }};
    return c.seq.join(
        batch, service_.reply_request(c), [this](const GeneratedToken& t) { return on_token(t); }, std::move(stop));
  }

  void end(BatchOutcome outcome) override {
    std::exception_ptr error = outcome.error;
    CompletionResult result;
    if (!error) {
      try {
        result = finish(outcome.result);
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mutex_);
      result_ = std::move(result);
      error_ = error;
      done_ = true;
    }
    changed_.notify_all();
  }

  bool cancelled() const override { return cancel_; }

  // The calling thread: the deltas to on_delta as they come, until the end; the result, or the
  // completion's error rethrown. An exception of on_delta or keep_going cancels the job and is
  // rethrown once it has ended (the job refers to the caller's PreparedCompletion).
  CompletionResult wait(const DeltaCallback& on_delta, const KeepGoing& keep_going) {
    bool open = true;  // the caller takes deltas
    std::exception_ptr caller_error;
    auto polled = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait_for(lock, kKeepGoingPoll, [&] { return done_ || !outbox_.empty(); });
      std::vector<ChatDelta> deltas = std::move(outbox_);
      outbox_.clear();
      const bool done = done_;
      lock.unlock();
      try {
        for (const ChatDelta& d : deltas) open = open && on_delta(d);
        // keep_going once a poll interval (a delta a token: a poll of the client each would cost
        // a system call a token, on a model of a thousand tokens a second).
        if (open && !done && keep_going && std::chrono::steady_clock::now() - polled >= kKeepGoingPoll) {
          open = keep_going();
          polled = std::chrono::steady_clock::now();
        }
      } catch (...) {
        caller_error = std::current_exception();
        open = false;
      }
      if (!open) cancel_ = true;
      lock.lock();
      if (done && outbox_.empty()) break;
    }
    if (caller_error) std::rethrow_exception(caller_error);
    if (error_) std::rethrow_exception(error_);
    return std::move(result_);
  }

 private:
  // The scheduler thread: a delta of the reply to the outbox; false once the caller stopped.
  bool post(const ChatDelta& d) {
    bool was_empty = false;
    {
      std::lock_guard lock(mutex_);
      was_empty = outbox_.empty();
      outbox_.push_back(d);
    }
    if (was_empty) changed_.notify_all();  // else the caller has a wake-up coming already
    return !cancel_;
  }

  bool on_token(const GeneratedToken& t) {
    if (cancel_) {
      c_->cancelled = true;
      return false;
    }
    return service_.on_token(*c_, t);
  }

  CompletionResult finish(const GenerateResult& g) {
    LILY_CHECK(c_.has_value(), "internal: a parallel completion ended without starting");
    Completion& c = *c_;
    c.seq.finish_round(g);
    c.timings.add(g);
    // A cancelled generation is the caller's stop only when it asked (a stop string ends the
    // reply through the same refusal of a token).
    if (g.finish == FinishReason::cancelled && cancel_) c.cancelled = true;
    return service_.finish(c, c.cancelled ? FinishReason::cancelled : g.finish);
  }

  ChatService& service_;
  const PreparedCompletion& p_;  // the caller's, alive while it waits
  const std::chrono::steady_clock::time_point start_;
  std::optional<Completion> c_;  // from start(), on the scheduler thread
  std::atomic<bool> cancel_{false};

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<ChatDelta> outbox_;  // under mutex_, as the rest below
  bool done_ = false;
  CompletionResult result_;
  std::exception_ptr error_;
};

CompletionResult ChatService::complete_in_batch(const PreparedCompletion& p, const DeltaCallback& on_delta,
                                                const KeepGoing& keep_going) {
  auto job = std::make_shared<BatchCompletion>(*this, p);
  scheduler_->submit(job);
  return job->wait(on_delta, keep_going);
}

}  // namespace lily
