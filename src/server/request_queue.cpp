// request_queue.cpp: see request_queue.h.
#include "server/request_queue.h"

#include <algorithm>

namespace lily::server {

std::unique_ptr<RequestQueue::Ticket> RequestQueue::join() {
  std::lock_guard lock(mutex_);
  if (shutdown_ || line_.size() >= slots_ + max_waiting_) return nullptr;
  line_.push_back(next_id_);
  return std::make_unique<Ticket>(*this, next_id_++);
}

RequestQueue::Ticket::~Ticket() { queue_.leave(id_); }

bool RequestQueue::Ticket::wait(const std::function<bool()>& keep_waiting, std::chrono::milliseconds poll) {
  std::unique_lock lock(queue_.mutex_);
  while (true) {
    if (queue_.shutdown_) return false;
    if (queue_.has_slot(id_)) return true;
    queue_.changed_.wait_for(lock, poll);
    if (queue_.shutdown_) return false;
    if (queue_.has_slot(id_)) return true;
    lock.unlock();
    const bool keep = keep_waiting();
    lock.lock();
    if (!keep) return false;
  }
}

size_t RequestQueue::Ticket::ahead() const {
  std::lock_guard lock(queue_.mutex_);
  auto it = std::find(queue_.line_.begin(), queue_.line_.end(), id_);
  const size_t position = size_t(it - queue_.line_.begin());
  return position < queue_.slots_ ? 0 : position - queue_.slots_ + 1;
}

bool RequestQueue::has_slot(uint64_t id) const {
  const size_t n = std::min(line_.size(), slots_);
  return std::find(line_.begin(), line_.begin() + ptrdiff_t(n), id) != line_.begin() + ptrdiff_t(n);
}

void RequestQueue::leave(uint64_t id) {
  {
    std::lock_guard lock(mutex_);
    auto it = std::find(line_.begin(), line_.end(), id);
    if (it != line_.end()) line_.erase(it);
  }
  changed_.notify_all();
}

size_t RequestQueue::waiting() const {
  std::lock_guard lock(mutex_);
  return line_.size() > slots_ ? line_.size() - slots_ : 0;
}

size_t RequestQueue::busy() const {
  std::lock_guard lock(mutex_);
  return std::min(line_.size(), slots_);
}

void RequestQueue::shutdown() {
  {
    std::lock_guard lock(mutex_);
    shutdown_ = true;
  }
  changed_.notify_all();
}

bool RequestQueue::shutting_down() const {
  std::lock_guard lock(mutex_);
  return shutdown_;
}

}  // namespace lily::server
