// request_queue.h: one generation at a time; the others wait in a bounded FIFO line.
//
// A request joins the line before it starts (full line: the caller answers 503 with
// Retry-After), waits until it is first, generates, and leaves (the Ticket's destructor), which
// lets the next one go. A request whose client goes away while waiting leaves the line without
// running. shutdown() wakes every waiting request with "give up".
#pragma once

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
  explicit RequestQueue(size_t max_waiting) : max_waiting_(max_waiting) {}

  class Ticket {
   public:
    Ticket(RequestQueue& queue, uint64_t id) : queue_(queue), id_(id) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    // Blocks until this request is first in line. Returns false (and leaves the line) when the
    // server shuts down or `keep_waiting` (polled every `poll`) returns false.
    bool wait(const std::function<bool()>& keep_waiting,
              std::chrono::milliseconds poll = std::chrono::milliseconds(100));
    // Requests in line before this one (0: its turn).
    size_t ahead() const;

   private:
    RequestQueue& queue_;
    uint64_t id_;
  };

  // A place in the line, or nullptr when max_waiting requests are already waiting.
  std::unique_ptr<Ticket> join();
  size_t waiting() const;  // requests in line behind the one running (the queue depth)
  void shutdown();
  bool shutting_down() const;

 private:
  void leave(uint64_t id);

  size_t max_waiting_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<uint64_t> line_;  // front: the request running (or about to)
  uint64_t next_id_ = 0;
  bool shutdown_ = false;
};

}  // namespace lily::server
