// The request queue: one at a time, first come first served, bounded, abandonable, shut down.
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

}  // namespace
}  // namespace lily::server
