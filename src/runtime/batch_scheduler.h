// batch_scheduler.h: the thread that runs parallel requests' steps (`lily serve --parallel N`).
//
// One thread owns a BatchGenerator (batch_generate.h) and the backend while it runs: every
// request's prefill chunks and batch steps, its state's snapshots and its session-cache entry
// are worked on there, so the backend is never driven from two threads. A job is submitted from
// any thread and waits in a FIFO line until a slot is free; then, on the scheduler thread,
// start() joins it to the batch (or ends it at once), the batch's callbacks run it token by
// token, and end() gets its outcome, once, whatever happened: finished, stopped, cancelled
// (cancelled() polled before every step: a client gone leaves within one step, prefilling or
// not), failed (an exception of its own, from start() or its callbacks: that job alone), or the
// scheduler shut down (an error outcome for every job not ended).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/batch_generate.h"

namespace lily {

class BatchJob {
 public:
  virtual ~BatchJob() = default;
  // On the scheduler thread, in its turn: joins `batch` (BatchGenerator::add) and returns the
  // id, or returns none when there is nothing to generate (end() then follows at once). May
  // throw: the job ends with the error.
  virtual std::optional<uint64_t> start(BatchGenerator& batch) = 0;
  // On the scheduler thread, once: how the job ended (outcome.error set when it failed). Must
  // not throw.
  virtual void end(BatchOutcome outcome) = 0;
  // Any thread: true once the job should stop (its client gone). Polled before each step.
  virtual bool cancelled() const = 0;
};

class BatchScheduler {
 public:
  BatchScheduler(Backend& backend, BatchGenerateOptions options);
  ~BatchScheduler();  // stops the thread; jobs not ended end with an error
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  void submit(std::shared_ptr<BatchJob> job);
  size_t running() const;  // jobs holding a slot
  size_t waiting() const;  // jobs in line behind the slots
  int slots() const { return options_.max_running; }

 private:
  void loop();
  void admit(std::deque<std::shared_ptr<BatchJob>>& line);
  void cancel_abandoned();
  void end_finished();

  const BatchGenerateOptions options_;
  BatchGenerator batch_;                                  // the scheduler thread's alone
  std::map<uint64_t, std::shared_ptr<BatchJob>> active_;  // by batch id: joined, not ended

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<BatchJob>> inbox_;  // submitted, not yet started (under mutex_)
  size_t running_ = 0;                           // active_.size(), for other threads (under mutex_)
  bool stopping_ = false;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace lily
