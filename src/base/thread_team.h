// thread_team.h: a fixed team of threads that run one function together: the fast CPU path's
// parallel regions (the reference backend keeps parallel_for, thread_pool.h).
//
// A decode step of the fast path has a few hundred parallel regions, some of a few
// microseconds. parallel_for wakes its workers through a condition variable, takes chunks
// under a mutex and calls through std::function: tens of microseconds a fork-join. Here:
//   - workers spin on an epoch counter for a while after each region (then sleep on it, so an
//     idle process does not burn its cores), and the caller is member 0, so a region starts
//     in well under a microsecond when the workers are awake;
//   - work is split statically (Member::share): each member knows its rows without a queue;
//   - inside a region, Member::barrier() separates phases, so a layer's steps that depend on
//     each other (router -> experts -> their sum) are one region, not one fork-join each;
//   - the function is called through a plain pointer: no allocation per region.
// A region started inside a region, or while another thread runs one, runs on the calling
// thread alone (a team of one): nested and concurrent use is correct, only not parallel.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace lily {

class ThreadTeam {
 public:
  // A member's view of the running region.
  class Member {
   public:
    int index() const { return index_; }  // 0 .. count() - 1; the caller is 0
    int count() const { return count_; }
    // Waits until every member of the region has called barrier() as often as this one.
    void barrier();
    // This member's part of [0, n) split evenly in whole blocks of `block` items: [first, second).
    std::pair<int64_t, int64_t> share(int64_t n, int64_t block = 1) const;

   private:
    friend class ThreadTeam;
    Member(ThreadTeam* team, int index, int count) : team_(team), index_(index), count_(count) {}
    ThreadTeam* team_;  // null for a team of one
    int index_, count_;
  };

  explicit ThreadTeam(int threads);  // threads in all, the caller's included
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(member) on every member, the calling thread as member 0, and returns when all
  // have returned. The first exception thrown by any member is rethrown here; the others
  // leave their barrier() by an exception of their own, which is dropped.
  template <class Fn>
  void run(Fn&& fn) {
    run_region(&call<std::remove_reference_t<Fn>>, &fn);
  }

 private:
  using Call = void (*)(void* fn, Member& member);
  template <class Fn>
  static void call(void* fn, Member& member) {
    (*static_cast<Fn*>(fn))(member);
  }

  void run_region(Call call, void* fn);
  void worker_loop(int index);
  void run_member(int index);  // the region's function on one member, errors recorded
  void barrier_wait();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one region at a time; others run alone
  // The region: set by the caller before the epoch moves on.
  Call call_ = nullptr;
  void* fn_ = nullptr;
  std::atomic<uint64_t> epoch_{0};  // + 1 per region; workers wait for it to move
  std::atomic<int> sleepers_{0};    // workers asleep on epoch_ (the caller notifies only then)
  std::atomic<int> running_{0};     // workers still in the region
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
  // Barrier state: arrivals in this round, and the round.
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> round_{0};
  std::atomic<int> barrier_sleepers_{0};
  std::atomic<bool> failed_{false};  // a member threw: barriers give up
  std::mutex error_mu_;
  std::exception_ptr error_;
};

// The process's team of cpu_thread_count() threads (started on first use).
ThreadTeam& cpu_team();

}  // namespace lily
