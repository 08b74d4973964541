#include "base/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace lily {

int cpu_thread_count() {
  static const int count = [] {
    if (const char* env = std::getenv("LILY_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    return std::max(1, int(std::thread::hardware_concurrency()));
  }();
  return count;
}

namespace {

// Workers wait for a job (a range split into chunks) and take chunks until none are left.
class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock serial(run_mu_);  // one job at a time
    {
      std::lock_guard lock(mu_);
      fn_ = &fn;
      n_ = n;
      chunk_ = chunk;
      next_ = 0;
      pending_ = (n + chunk - 1) / chunk;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    take_chunks();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void take_chunks() {
    for (;;) {
      int64_t begin;
      const std::function<void(int64_t, int64_t)>* fn;
      {
        std::lock_guard lock(mu_);
        if (!fn_ || next_ >= n_) return;
        begin = next_;
        next_ += chunk_;
        fn = fn_;
      }
      int64_t end = std::min(begin + chunk_, n_);
      try {
        (*fn)(begin, end);
      } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      take_chunks();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace

void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int threads = cpu_thread_count();
  min_chunk = std::max<int64_t>(1, min_chunk);
  if (threads == 1 || n <= min_chunk) {
    fn(0, n);
    return;
  }
  // About 4 chunks per thread balances uneven work without much locking.
  int64_t chunk = std::max(min_chunk, (n + 4 * threads - 1) / (4 * threads));
  static Pool pool(threads - 1);
  pool.run(n, chunk, fn);
}

}  // namespace lily
