// task_list.h: the decode step as persistent work (issue 16): every block of one resident grid
// walks its own list of tasks in order; a task waits for counters in global memory that other
// tasks add to when they finish, never for a grid barrier. This header is the host side that
// every such kernel shares: the list, and the check that makes it safe by construction.
//
//   task t on block b:  wait until counter[w.counter] >= w.count for each of its waits, then run,
//                       then counter[signal] += 1 (release), if it signals
// The rules the check enforces (check_task_list), so that a list that passes cannot deadlock and
// cannot race on the buffers its tasks declare:
//   - counters: every wait and signal names a counter of the list; a wait's count is the number
//     of tasks that signal its counter (a wait is for all of them: a task that needs only some
//     tiles waits on a counter of its own), and a counter nobody waits for is an error too;
//   - progress: with every block resident and running its list in order, every task runs (a
//     simulation of exactly that, so a cycle through program order and waits is found, named by
//     the tasks it leaves stuck);
//   - races: two tasks whose declared accesses overlap, one a write, are ordered by program
//     order and waits (happens-before), unless both only accumulate (atomic adds).
// Counters grow from step to step (a wait's count is per step; the kernel adds step * count), so
// a replayed step needs no reset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lily::cuda::persistent {

// A byte range of one buffer a task reads or writes (buffers: ids the builder hands out).
struct Access {
  enum class Kind : uint8_t { read, write, accumulate };
  Kind kind = Kind::read;
  uint32_t buffer = 0;
  uint64_t begin = 0, end = 0;  // [begin, end) in bytes
};

struct Wait {
  uint32_t counter = 0;
  uint32_t count = 0;  // per step: the number of tasks that signal `counter`
};

struct Task {
  uint16_t op = 0;  // what to run (the kernel's opcode)
  uint16_t layer = 0;
  uint16_t slot = 0;   // gate_up and down: the expert slot (0..k-1 routed, k the shared expert);
                       // attention_split: the first KV head
  uint32_t first = 0;  // the work range of the op, in its own units (rows, tiles, heads, ...)
  uint32_t count = 0;
  uint16_t row = 0;  // the step's token rows it works on, [row, row + rows) (a step of several tokens)
  uint16_t rows = 1;
  std::vector<Wait> waits;
  int32_t signal = -1;           // counter added to when done; -1: none
  std::vector<Access> accesses;  // checked only: what it reads and writes
  std::string name;              // for error messages ("layer 3 in_proj rows 0..95")
};

struct TaskList {
  uint32_t counters = 0;
  std::vector<std::vector<Task>> blocks;  // block b runs blocks[b] in order
  size_t tasks() const;
};

// Throws lily::Error naming the first broken rule and the tasks it concerns.
void check_task_list(const TaskList& list);

}  // namespace lily::cuda::persistent
