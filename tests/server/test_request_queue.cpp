// The request queue: one at a time or `slots` at once (--parallel), first come first served,
// bounded, abandonable, shut down.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "server/request_queue.h"

namespace lily::server {
namespace {

TEST(RequestQueue, OneAtATimeInArrivalOrder) {
  RequestQueue queue(8);
  auto first = queue.join();
  ASSERT_TRUE(first);
  ASSERT_TRUE(first->wait([] { return true; }));
  std::vector<int> order;
  std::mutex m;
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<RequestQueue::Ticket>> tickets;
  for (int i = 0; i < 4; ++i) tickets.push_back(queue.join());
  EXPECT_EQ(queue.waiting(), 4u);
  std::atomic<int> running{0};
  for (int i = 3; i >= 0; --i) {  // threads start in reverse order; the line keeps arrival order
    threads.emplace_back([&, i] {
      ASSERT_TRUE(tickets[size_t(i)]->wait([] { return true; }));
      EXPECT_EQ(++running, 1);
      {
        std::lock_guard lock(m);
        order.push_back(i);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      --running;
      tickets[size_t(i)].reset();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(order.empty());  // the first ticket still holds the turn
  first.reset();
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(queue.waiting(), 0u);
}

TEST(RequestQueue, FullWhenMaxWaitingAreWaiting) {
  RequestQueue queue(2);
  auto running = queue.join();
  auto a = queue.join();
  auto b = queue.join();
  EXPECT_TRUE(running && a && b);
  EXPECT_FALSE(queue.join());
  a.reset();  // a client that left frees its place
  EXPECT_TRUE(queue.join());
}

TEST(RequestQueue, AbandonedWaitLeavesTheLine) {
  RequestQueue queue(4);
  auto running = queue.join();
  auto waiting = queue.join();
  EXPECT_FALSE(waiting->wait([] { return false; }, std::chrono::milliseconds(1)));
  waiting.reset();
  EXPECT_EQ(queue.waiting(), 0u);
}

TEST(RequestQueue, ShutdownWakesTheWaiting) {
  RequestQueue queue(4);
  auto running = queue.join();
  auto waiting = queue.join();
  std::thread t([&] { EXPECT_FALSE(waiting->wait([] { return true; })); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  queue.shutdown();
  t.join();
  EXPECT_FALSE(queue.join());
}

// --parallel 3: three requests run at once, the next two wait in arrival order and know how many
// are ahead; a sixth is refused. A slot freed goes to the first in line, not to a later one.
TEST(RequestQueue, SlotsRunAtOnceAndTheLineWaitsInOrder) {
  RequestQueue queue(2, 3);
  EXPECT_EQ(queue.slots(), 3u);
  std::vector<std::unique_ptr<RequestQueue::Ticket>> running;
  for (int i = 0; i < 3; ++i) {
    running.push_back(queue.join());
    ASSERT_TRUE(running.back());
    EXPECT_TRUE(running.back()->wait([] { return false; }, std::chrono::milliseconds(1))) << "slot " << i;
    EXPECT_EQ(running.back()->ahead(), 0u);
  }
  auto fourth = queue.join(), fifth = queue.join();
  ASSERT_TRUE(fourth && fifth);
  EXPECT_FALSE(queue.join()) << "3 slots and 2 waiting: full";
  EXPECT_EQ(queue.busy(), 3u);
  EXPECT_EQ(queue.waiting(), 2u);
  EXPECT_EQ(fourth->ahead(), 1u);
  EXPECT_EQ(fifth->ahead(), 2u);
  std::atomic<bool> fifth_started{false};
  std::thread t([&] {
    EXPECT_TRUE(fifth->wait([] { return true; }, std::chrono::milliseconds(1)));
    fifth_started = true;
  });
  running[1].reset();  // a slot frees: the fourth's, not the fifth's
  EXPECT_TRUE(fourth->wait([] { return false; }, std::chrono::milliseconds(1)));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(fifth_started) << "the fifth waits behind the fourth";
  EXPECT_EQ(fifth->ahead(), 1u);
  running[0].reset();
  t.join();
  EXPECT_TRUE(fifth_started);
  EXPECT_EQ(queue.waiting(), 0u);
  EXPECT_EQ(queue.busy(), 3u);
}

}  // namespace
}  // namespace lily::server
