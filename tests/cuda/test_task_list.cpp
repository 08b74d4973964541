// test_task_list.cpp: the checker of persistent task lists (backend/cuda/persistent/task_list.h)
// on hand-made lists, good and bad: no GPU needed. Each bad list breaks one rule and must be
// refused with a message naming it; the good ones (a pipeline across blocks, a layered chain of
// the decode step's shape) must pass.
#include <gtest/gtest.h>

#include <random>

#include "backend/cuda/persistent/task_list.h"
#include "base/error.h"

namespace lily::test {
namespace {

using cuda::persistent::Access;
using cuda::persistent::check_task_list;
using cuda::persistent::Task;
using cuda::persistent::TaskList;
using cuda::persistent::Wait;

Access read(uint32_t buffer, uint64_t begin, uint64_t end) { return {Access::Kind::read, buffer, begin, end}; }
Access write(uint32_t buffer, uint64_t begin, uint64_t end) { return {Access::Kind::write, buffer, begin, end}; }
Access accumulate(uint32_t buffer, uint64_t begin, uint64_t end) {
  return {Access::Kind::accumulate, buffer, begin, end};
}

Task task(std::string name, std::vector<Wait> waits, int32_t signal, std::vector<Access> accesses) {
  Task t;
  t.name = std::move(name), t.waits = std::move(waits), t.signal = signal, t.accesses = std::move(accesses);
  return t;
}

// The message of the Error check_task_list throws ("" when it accepts the list).
std::string refusal(const TaskList& list) {
  try {
    check_task_list(list);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Four producers on blocks 0-3 write a quarter of buffer 0 each and signal counter 0; block 4
// waits for all four and reads the whole buffer, then writes buffer 1.
TaskList pipeline() {
  TaskList l;
  l.counters = 1;
  l.blocks.resize(5);
  for (uint32_t b = 0; b < 4; ++b) l.blocks[b].push_back(task("produce", {}, 0, {write(0, 256 * b, 256 * (b + 1))}));
  l.blocks[4].push_back(task("consume", {{0, 4}}, -1, {read(0, 0, 1024), write(1, 0, 64)}));
  return l;
}

TEST(TaskList, APipelinePasses) { EXPECT_EQ(refusal(pipeline()), ""); }

TEST(TaskList, AReadWithoutItsWaitIsARace) {
  TaskList l = pipeline();
  l.blocks[4][0].waits.clear();
  l.counters = 1;
  // Counter 0 is now signalled and waited for by nobody: that is the first rule broken.
  EXPECT_NE(refusal(l).find("waited for by nobody"), std::string::npos) << refusal(l);
  // With the counter waited for by another task, the unordered read is the race.
  l.blocks[4].push_back(task("later", {{0, 4}}, -1, {}));
  const std::string why = refusal(l);
  EXPECT_NE(why.find("with nothing ordering them"), std::string::npos) << why;
  EXPECT_NE(why.find("'consume'"), std::string::npos) << why;
}

// Order through a chain: A (block 0) writes, B (block 1) waits for A, C (block 2) waits for B and
// reads A's bytes: ordered by transitivity, and by program order on block 2 for D after C. With
// C's wait gone (the counter then waited for by D alone), C's read is the race.
TEST(TaskList, OrderThroughAChainOfBlocksIsKnown) {
  auto chain = [](bool c_waits) {
    TaskList l;
    l.counters = 2;
    l.blocks.resize(3);
    l.blocks[0].push_back(task("A", {}, 0, {write(0, 0, 64)}));
    l.blocks[1].push_back(task("B", {{0, 1}}, 1, {}));
    l.blocks[2].push_back(task("C", c_waits ? std::vector<Wait>{{1, 1}} : std::vector<Wait>{}, -1, {read(0, 0, 64)}));
    l.blocks[2].push_back(task("D", c_waits ? std::vector<Wait>{} : std::vector<Wait>{{1, 1}}, -1, {write(0, 32, 96)}));
    return l;
  };
  EXPECT_EQ(refusal(chain(true)), "");
  const std::string why = refusal(chain(false));
  EXPECT_NE(why.find("'A' (block 0, task 0) writes"), std::string::npos) << why;
  EXPECT_NE(why.find("'C' (block 2, task 0) reads"), std::string::npos) << why;
}

TEST(TaskList, AWaitIsForEveryProducer) {
  TaskList l = pipeline();
  l.blocks[4][0].waits[0].count = 3;
  EXPECT_NE(refusal(l).find("waits for 3 signals of counter 0, which 4 tasks signal"), std::string::npos) << refusal(l);
}

TEST(TaskList, CountersMustExistAndHaveProducers) {
  TaskList l = pipeline();
  l.blocks[4][0].waits.push_back({7, 1});
  EXPECT_NE(refusal(l).find("counter 7 of 1"), std::string::npos) << refusal(l);
  l = pipeline();
  l.counters = 2;
  l.blocks[4][0].waits.push_back({1, 1});
  EXPECT_NE(refusal(l).find("which no task signals"), std::string::npos) << refusal(l);
  l = pipeline();
  l.blocks[0][0].signal = 5;
  EXPECT_NE(refusal(l).find("signals counter 5 of 1"), std::string::npos) << refusal(l);
}

// A waits for B, B for A, on two blocks: neither can ever run.
TEST(TaskList, ACycleAcrossBlocksDeadlocks) {
  TaskList l;
  l.counters = 2;
  l.blocks.resize(2);
  l.blocks[0].push_back(task("A", {{1, 1}}, 0, {}));
  l.blocks[1].push_back(task("B", {{0, 1}}, 1, {}));
  const std::string why = refusal(l);
  EXPECT_NE(why.find("2 of 2 tasks can never run"), std::string::npos) << why;
  EXPECT_NE(why.find("'A' (block 0, task 0) waits for counter 1"), std::string::npos) << why;
}

// A block that waits for what it would produce itself later: program order makes the cycle.
TEST(TaskList, AWaitOnLaterWorkOfTheSameBlockDeadlocks) {
  TaskList l;
  l.counters = 1;
  l.blocks.resize(1);
  l.blocks[0].push_back(task("waits first", {{0, 1}}, -1, {}));
  l.blocks[0].push_back(task("signals later", {}, 0, {}));
  const std::string why = refusal(l);
  EXPECT_NE(why.find("can never run"), std::string::npos) << why;
  EXPECT_NE(why.find("'signals later' (block 0, task 1) has not run"), std::string::npos) << why;
}

// Two unordered tasks may both add into one range (atomic adds); not one adding while the other
// reads, and not one writing while the other adds.
TEST(TaskList, AccumulatesNeedNoOrderAmongThemselves) {
  TaskList l;
  l.counters = 0;
  l.blocks.resize(2);
  l.blocks[0].push_back(task("add a", {}, -1, {accumulate(3, 0, 64)}));
  l.blocks[1].push_back(task("add b", {}, -1, {accumulate(3, 32, 96)}));
  EXPECT_EQ(refusal(l), "");
  l.blocks[1][0].accesses = {read(3, 60, 70)};
  EXPECT_NE(refusal(l).find("'add a' (block 0, task 0) accumulates into buffer 3"), std::string::npos) << refusal(l);
  l.blocks[1][0].accesses = {write(3, 0, 8)};
  EXPECT_NE(refusal(l).find("with nothing ordering them"), std::string::npos) << refusal(l);
  // Disjoint ranges of one buffer, or the same range of two buffers, do not conflict.
  l.blocks[1][0].accesses = {write(3, 64, 128), write(4, 0, 64)};
  EXPECT_EQ(refusal(l), "");
}

// Program order orders a block's own tasks: write then read on one block needs no counter;
// happens-before is transitive through a chain of waits on other blocks.
TEST(TaskList, OrderIsTransitive) {
  TaskList l;
  l.counters = 2;
  l.blocks.resize(3);
  l.blocks[0].push_back(task("write x", {}, -1, {write(0, 0, 16)}));
  l.blocks[0].push_back(task("read x, signal", {}, 0, {read(0, 0, 16)}));
  l.blocks[1].push_back(task("relay", {{0, 1}}, 1, {}));
  l.blocks[2].push_back(task("overwrite x", {{1, 1}}, -1, {write(0, 0, 16)}));
  EXPECT_EQ(refusal(l), "");
  l.blocks[2][0].waits.clear();  // nothing orders the overwrite now (and counter 1 is unwaited)
  l.blocks[2].push_back(task("waits relay", {{1, 1}}, -1, {}));
  EXPECT_NE(refusal(l).find("'overwrite x'"), std::string::npos) << refusal(l);
}

// The decode step's shape: per layer, tiles of a projection over every block write their rows of
// y, a core task reads all of y and writes z, tiles of an output projection read z and add into h,
// which the next layer's projection tiles read. 40 layers on 132 blocks: must pass; dropping any
// one wait must be caught.
TaskList layered(int layers, int blocks) {
  TaskList l;
  l.blocks.resize(size_t(blocks));
  const uint32_t h = 0, y = 1, z = 2;
  int32_t h_ready = -1;  // the counter the previous layer's output tiles signal
  uint32_t h_producers = 0;
  for (int layer = 0; layer < layers; ++layer) {
    const int32_t y_ready = int32_t(l.counters++), z_ready = int32_t(l.counters++), h_done = int32_t(l.counters++);
    std::vector<Wait> after_h;
    if (h_ready >= 0) after_h.push_back({uint32_t(h_ready), h_producers});
    for (int b = 0; b < blocks; ++b)
      l.blocks[size_t(b)].push_back(task(fmt::format("layer {} proj {}", layer, b), after_h, y_ready,
                                         {read(h, 0, 8192), write(y, 64 * b, 64 * (b + 1))}));
    l.blocks[size_t(layer % blocks)].push_back(task(fmt::format("layer {} core", layer),
                                                    {{uint32_t(y_ready), uint32_t(blocks)}}, z_ready,
                                                    {read(y, 0, 64 * blocks), write(z, 0, 4096)}));
    for (int b = 0; b < blocks; ++b)
      l.blocks[size_t(b)].push_back(task(fmt::format("layer {} out {}", layer, b), {{uint32_t(z_ready), 1}}, h_done,
                                         {read(z, 0, 4096), accumulate(h, 64 * b, 64 * (b + 1))}));
    h_ready = h_done, h_producers = uint32_t(blocks);
  }
  // The step's end (lm_head) reads h after the last layer.
  l.blocks[0].push_back(task("lm_head", {{uint32_t(h_ready), h_producers}}, -1, {read(h, 0, 8192)}));
  return l;
}

TEST(TaskList, TheDecodeStepsShapePasses) {
  const TaskList l = layered(40, 132);
  EXPECT_EQ(l.tasks(), size_t(40 * (2 * 132 + 1) + 1));
  EXPECT_EQ(refusal(l), "");
}

TEST(TaskList, DroppingAnyWaitOfALayeredListIsCaught) {
  std::mt19937 rng(7);
  const TaskList good = layered(6, 16);
  for (int trial = 0; trial < 40; ++trial) {
    TaskList bad = good;
    // A random task with waits loses one of them.
    std::vector<std::pair<size_t, size_t>> waiting;
    for (size_t b = 0; b < bad.blocks.size(); ++b)
      for (size_t i = 0; i < bad.blocks[b].size(); ++i)
        if (!bad.blocks[b][i].waits.empty()) waiting.push_back({b, i});
    const auto [b, i] = waiting[rng() % waiting.size()];
    bad.blocks[b][i].waits.pop_back();
    EXPECT_NE(refusal(bad), "") << "trial " << trial << ": " << bad.blocks[b][i].name << " without its wait";
  }
}

}  // namespace
}  // namespace lily::test
