// ThreadTeam (src/base/thread_team.h): every member runs every region once, shares cover a
// range exactly, barriers order phases, exceptions reach the caller and leave the team usable,
// nested and concurrent regions run alone, idle workers sleep and wake, teams shut down.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/thread_team.h"

namespace lily {
namespace {

TEST(ThreadTeam, ManyShortRegionsRunEveryMemberOnce) {
  ThreadTeam team(3);
  ASSERT_EQ(team.size(), 3);
  std::vector<int> calls(3, 0);
  for (int region = 0; region < 5000; ++region) {
    team.run([&](ThreadTeam::Member& m) {
      ASSERT_EQ(m.count(), 3);
      ++calls[size_t(m.index())];  // each member its own slot
    });
  }
  EXPECT_EQ(calls, std::vector<int>(3, 5000));
}

TEST(ThreadTeam, SharesCoverTheRangeInWholeBlocks) {
  ThreadTeam team(3);
  for (int64_t n : {0, 1, 2, 3, 63, 64, 65, 129, 1000})
    for (int64_t block : {1, 64}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      team.run([&](ThreadTeam::Member& m) {
        const auto [first, last] = m.share(n, block);
        EXPECT_LE(first, last);
        EXPECT_TRUE(first == last || first % block == 0) << "n " << n << " block " << block << ": " << first;
        for (int64_t i = first; i < last; ++i) seen[size_t(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[size_t(i)].load(), 1) << "n " << n << " item " << i;
    }
}

TEST(ThreadTeam, BarrierSeparatesPhases) {
  ThreadTeam team(3);
  std::vector<int> slots(3, -1);
  int failures = 0;
  std::atomic<int> bad{0};
  for (int region = 0; region < 2000; ++region) {
    team.run([&](ThreadTeam::Member& m) {
      for (int phase = 0; phase < 3; ++phase) {
        slots[size_t(m.index())] = region * 3 + phase;
        m.barrier();
        for (int j = 0; j < m.count(); ++j)
          if (slots[size_t(j)] != region * 3 + phase) bad.fetch_add(1);
        m.barrier();  // nobody writes the next phase before all have read this one
      }
    });
  }
  failures = bad.load();
  EXPECT_EQ(failures, 0);
}

TEST(ThreadTeam, ExceptionsReachTheCallerAndTheTeamStaysUsable) {
  ThreadTeam team(3);
  for (int thrower = 0; thrower < 3; ++thrower) {
    std::atomic<int> after_barrier{0};
    try {
      team.run([&](ThreadTeam::Member& m) {
        if (m.index() == thrower) throw std::runtime_error("member " + std::to_string(m.index()));
        m.barrier();  // the others wait here for the thrower, which never comes
        after_barrier.fetch_add(1);
      });
      ADD_FAILURE() << "no exception from member " << thrower;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "member " + std::to_string(thrower));
    }
    EXPECT_EQ(after_barrier.load(), 0);
    std::atomic<int> ran{0};
    team.run([&](ThreadTeam::Member& m) {
      m.barrier();
      ran.fetch_add(1);
    });
    EXPECT_EQ(ran.load(), 3);
  }
  ThreadTeam alone(1);
  EXPECT_THROW(alone.run([](ThreadTeam::Member&) { throw std::logic_error("alone"); }), std::logic_error);
}

TEST(ThreadTeam, NestedRegionsRunAlone) {
  ThreadTeam team(3);
  std::atomic<int> inner_calls{0}, inner_count{0};
  team.run([&](ThreadTeam::Member& outer) {
    team.run([&](ThreadTeam::Member& inner) {
      inner_calls.fetch_add(1);
      inner_count.fetch_add(inner.count());
      inner.barrier();  // a team of one: returns at once
      EXPECT_EQ(inner.share(10, 4), (std::pair<int64_t, int64_t>(0, 10)));
    });
    outer.barrier();
  });
  EXPECT_EQ(inner_calls.load(), 3);
  EXPECT_EQ(inner_count.load(), 3);
}

TEST(ThreadTeam, ConcurrentCallersBothFinish) {
  ThreadTeam team(3);
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int region = 0; region < 2000; ++region)
      team.run([&](ThreadTeam::Member& m) {
        const auto [first, last] = m.share(100);
        for (int64_t i = first; i < last; ++i) total.fetch_add(i);
        m.barrier();
      });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 2000 * (99 * 100 / 2));
}

TEST(ThreadTeam, IdleWorkersSleepAndWake) {
  ThreadTeam team(3);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin: the workers sleep
    std::atomic<int> ran{0};
    team.run([&](ThreadTeam::Member& m) {
      std::this_thread::sleep_for(std::chrono::milliseconds(m.index() == 1 ? 3 : 0));  // one slow member
      m.barrier();
      ran.fetch_add(1);
    });
    EXPECT_EQ(ran.load(), 3);
  }
}

TEST(ThreadTeam, ShutsDownAwakeOrAsleep) {
  for (int i = 0; i < 20; ++i) {
    ThreadTeam team(1 + i % 4);
    if (i % 2) team.run([](ThreadTeam::Member&) {});
    if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace
}  // namespace lily
