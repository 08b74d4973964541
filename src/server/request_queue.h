// request_queue.h: `slots` generations at a time (lily serve --parallel); the others wait in a
// bounded FIFO line.
//
// A request joins the line before it starts (full line: the caller answers 503 with
// Retry-After), waits until it is among the first `slots`, generates, and leaves (the Ticket's
// destructor), which lets the next one go. A request whose client goes away while waiting leaves the line without
// running. shutdown() wakes every waiting request with "give up".
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace lily::server {

class RequestQueue {
 public:
  // max_waiting: requests that may wait while every slot is taken; slots: at least 1.
  explicit RequestQueue(size_t max_waiting, size_t slots = 1)
      : max_waiting_(max_waiting), slots_(std::max<size_t>(slots, 1)) {}

  class Ticket {
   public:
    Ticket(RequestQueue& queue, uint64_t id) : queue_(queue), id_(id) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    // Blocks until this request holds a slot (among the first `slots` in line). Returns false (and leaves the line)
    // when the server shuts down or `keep_waiting` (polled every `poll`) returns false.
    bool wait(const std::function<bool()>& keep_waiting,
              std::chrono::milliseconds poll = std::chrono::milliseconds(100));
    // Requests in line that take a slot before this one (0: its turn).
    size_t ahead() const;

   private:
    RequestQueue& queue_;
    uint64_t id_;
  };

  // A place in the line, or nullptr when max_waiting requests are already waiting.
  std::unique_ptr<Ticket> join();
  size_t waiting() const;  // requests in line behind the slots (the queue depth)
  size_t busy() const;     // slots taken
  size_t slots() const { return slots_; }
  void shutdown();
  bool shutting_down() const;

 private:
  void leave(uint64_t id);

  bool has_slot(uint64_t id) const;  // under mutex_

  size_t max_waiting_;
  size_t slots_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<uint64_t> line_;  // the first `slots_`: the requests running (or about to)
  uint64_t next_id_ = 0;
  bool shutdown_ = false;
};

}  // namespace lily::server
