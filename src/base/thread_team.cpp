// thread_team.cpp: the team's workers, regions and barriers (thread_team.h).
//
// Every wait (a worker for the next region, the caller for the workers, a member at a barrier)
// first spins on its atomic for up to kSpin, then sleeps on it (std::atomic::wait, a futex).
// The side that moves the atomic calls notify only when a sleeper has said so, through a
// counter or flag written before it looks at the atomic once more (both sequentially
// consistent, so one of the two always sees the other): the common, awake case makes no
// system call.
#include "base/thread_team.h"

#include <chrono>

#include "base/thread_pool.h"

namespace lily {

namespace {

// Long enough to cover the serial steps between a decode step's regions (norms, routing: a
// few microseconds), short enough that an idle process gives its cores back at once.
constexpr auto kSpin = std::chrono::microseconds(50);
// A spinning thread yields its core every this many pauses: on a machine with more runnable
// threads than cores, the member it waits for may need that core. Measured with 2 threads
// doing 10 us each per region, on the 2 cores at load average 7 (other builds): 106 us a
// region spinning on pause alone for 5 us, 545 us for 100 us; 67-80 us yielding, as
// parallel_for's 58 (whose caller takes every chunk when the worker is late). On an idle
// machine sched_yield returns at once.
constexpr int kPausesPerYield = 32;

// The team whose region this thread is running (workers: always their own).
thread_local const ThreadTeam* tl_region_team = nullptr;

// Thrown by barrier() in the members left when another one threw.
struct RegionAbandoned {};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() or kSpin has passed; returns done().
template <class Done>
bool spin_until(Done done) {
  for (int i = 0; i < 64; ++i) {
    if (done()) return true;
    cpu_relax();
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 256; ++i) {
      if (done()) return true;
      cpu_relax();
      if (i % kPausesPerYield == kPausesPerYield - 1) std::this_thread::yield();
    }
    if (std::chrono::steady_clock::now() - start > kSpin) return done();
  }
}

}  // namespace

void ThreadTeam::Member::barrier() {
  if (team_ && count_ > 1) team_->barrier_wait();
}

std::pair<int64_t, int64_t> ThreadTeam::Member::share(int64_t n, int64_t block) const {
  if (n <= 0) return {0, 0};
  const int64_t blocks = (n + block - 1) / block;
  const int64_t b0 = blocks * index_ / count_, b1 = blocks * (index_ + 1) / count_;
  return {std::min(n, b0 * block), std::min(n, b1 * block)};
}

ThreadTeam::ThreadTeam(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadTeam::~ThreadTeam() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadTeam::run_region(Call call, void* fn) {
  std::unique_lock lock(run_mu_, std::try_to_lock);
  if (!lock.owns_lock() || tl_region_team == this || workers_.empty()) {
    Member alone(nullptr, 0, 1);
    call(fn, alone);
    return;
  }
  tl_region_team = this;
  call_ = call;
  fn_ = fn;
  arrived_.store(0);
  failed_.store(false);
  error_ = nullptr;
  running_.store(int(workers_.size()));
  epoch_.fetch_add(1);  // releases the fields above to the workers
  if (sleepers_.load() > 0) epoch_.notify_all();
  run_member(0);
  if (!spin_until([&] { return running_.load(std::memory_order_acquire) == 0; })) {
    caller_asleep_.store(true);
    for (int r; (r = running_.load()) != 0;) running_.wait(r);
    caller_asleep_.store(false);
  }
  tl_region_team = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadTeam::worker_loop(int index) {
  tl_region_team = this;
  uint64_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen; })) {
      sleepers_.fetch_add(1);
      while (epoch_.load() == seen) epoch_.wait(seen);
      sleepers_.fetch_sub(1);
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    run_member(index);
    if (running_.fetch_sub(1) == 1 && caller_asleep_.load()) running_.notify_one();
  }
}

void ThreadTeam::run_member(int index) {
  Member member(this, index, size());
  try {
    call_(fn_, member);
  } catch (const RegionAbandoned&) {
  } catch (...) {
    {
      std::lock_guard lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    failed_.store(true);
    round_.fetch_add(1);  // frees the members waiting at a barrier, which then see failed_
    round_.notify_all();
  }
}

void ThreadTeam::barrier_wait() {
  if (failed_.load()) throw RegionAbandoned{};
  const uint32_t round = round_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == size() - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    round_.fetch_add(1);  // releases every member's work before the barrier
    if (barrier_sleepers_.load() > 0) round_.notify_all();
    return;
  }
  // failed_ is read after round_ each time: a member that threw set it before moving round_.
  auto released = [&] { return round_.load() != round || failed_.load(); };
  if (!spin_until(released)) {
    barrier_sleepers_.fetch_add(1);
    while (!released()) round_.wait(round);
    barrier_sleepers_.fetch_sub(1);
  }
  if (failed_.load()) throw RegionAbandoned{};
}

ThreadTeam& cpu_team() {
  static ThreadTeam team(cpu_thread_count());
  return team;
}

}  // namespace lily
