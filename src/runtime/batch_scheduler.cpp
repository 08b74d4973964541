// batch_scheduler.cpp: see batch_scheduler.h.
#include "runtime/batch_scheduler.h"

#include <utility>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace lily {

namespace {

void end_with_error(BatchJob& job, std::exception_ptr error) {
  BatchOutcome outcome;
  outcome.error = std::move(error);
  job.end(std::move(outcome));
}

}  // namespace

BatchScheduler::BatchScheduler(Backend& backend, BatchGenerateOptions options)
    : options_(options), batch_(backend, options), thread_([this] { loop(); }) {}

BatchScheduler::~BatchScheduler() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void BatchScheduler::submit(std::shared_ptr<BatchJob> job) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      inbox_.push_back(std::move(job));
      job = nullptr;
    }
  }
  if (job) return end_with_error(*job, std::make_exception_ptr(Error("the scheduler has stopped")));
  wake_.notify_all();
}

size_t BatchScheduler::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

size_t BatchScheduler::waiting() const {
  std::lock_guard lock(mutex_);
  return inbox_.size();
}

void BatchScheduler::loop() {
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !active_.empty(); });
      if (stopping_) break;
      admit(inbox_);
      running_ = active_.size();
    }
    cancel_abandoned();
    if (!active_.empty()) batch_.step();
    end_finished();
  }
  // Shut down: every job not ended gets an error.
  std::deque<std::shared_ptr<BatchJob>> left;
  {
    std::lock_guard lock(mutex_);
    left.swap(inbox_);
    running_ = 0;
  }
  const auto stopped = std::make_exception_ptr(Error("the server is shutting down: the generation was stopped"));
  for (auto& [id, job] : active_) end_with_error(*job, stopped);
  for (auto& job : left) end_with_error(*job, stopped);
  active_.clear();
}

// The line's first jobs into the free slots, in order (under mutex_: a job's start() is short,
// its prefill runs in the steps).
void BatchScheduler::admit(std::deque<std::shared_ptr<BatchJob>>& line) {
  while (active_.size() < size_t(options_.max_running) && !line.empty()) {
    std::shared_ptr<BatchJob> job = std::move(line.front());
    line.pop_front();
    try {
      if (std::optional<uint64_t> id = job->start(batch_)) {
        active_[*id] = std::move(job);
      } else {
        job->end(BatchOutcome{});
      }
    } catch (...) {
      end_with_error(*job, std::current_exception());
    }
  }
}

void BatchScheduler::cancel_abandoned() {
  for (auto& [id, job] : active_)
    if (job->cancelled()) batch_.cancel(id);
}

// Finished jobs leave their slots (counted free first: a caller that returns sees its slot
// free), then get their outcomes.
void BatchScheduler::end_finished() {
  std::vector<std::pair<std::shared_ptr<BatchJob>, BatchOutcome>> ended;
  for (auto it = active_.begin(); it != active_.end();) {
    if (std::optional<BatchOutcome> outcome = batch_.take(it->first)) {
      ended.emplace_back(std::move(it->second), std::move(*outcome));
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  if (ended.empty()) return;
  {
    std::lock_guard lock(mutex_);
    running_ = active_.size();
  }
  for (auto& [job, outcome] : ended) job->end(std::move(outcome));
}

}  // namespace lily
