// task_list.cpp: see task_list.h.
#include "backend/cuda/persistent/task_list.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace lily::cuda::persistent {

namespace {

// A task by its place: block b, index i in the block's list.
struct Place {
  uint32_t block = 0, index = 0;
};

// Every task numbered, block by block, with its place and its name for messages.
class Index {
 public:
  explicit Index(const TaskList& list) : list_(list) {
    for (uint32_t b = 0; b < list.blocks.size(); ++b) {
      first_.push_back(uint32_t(places_.size()));
      for (uint32_t i = 0; i < list.blocks[b].size(); ++i) places_.push_back({b, i});
    }
  }
  size_t size() const { return places_.size(); }
  uint32_t id(uint32_t block, uint32_t index) const { return first_[block] + index; }
  const Task& task(uint32_t id) const { return list_.blocks[places_[id].block][places_[id].index]; }
  const Place& place(uint32_t id) const { return places_[id]; }
  std::string describe(uint32_t id) const {
    const Task& t = task(id);
    return fmt::format("'{}' (block {}, task {})", t.name.empty() ? fmt::format("op {}", t.op) : t.name,
                       places_[id].block, places_[id].index);
  }

 private:
  const TaskList& list_;
  std::vector<uint32_t> first_;
  std::vector<Place> places_;
};

// The tasks that signal each counter.
std::vector<std::vector<uint32_t>> producers_of(const TaskList& list, const Index& index) {
  std::vector<std::vector<uint32_t>> producers(list.counters);
  for (uint32_t id = 0; id < index.size(); ++id) {
    const Task& t = index.task(id);
    if (t.signal < 0) continue;
    LILY_CHECK(uint32_t(t.signal) < list.counters, "task list: {} signals counter {} of {}", index.describe(id),
               t.signal, list.counters);
    producers[size_t(t.signal)].push_back(id);
  }
  return producers;
}

// Every wait names a counter that has producers, and waits for all of them; every counter that
// is signalled is waited for.
void check_counters(const TaskList& list, const Index& index, const std::vector<std::vector<uint32_t>>& producers) {
  std::vector<bool> waited(list.counters, false);
  for (uint32_t id = 0; id < index.size(); ++id)
    for (const Wait& w : index.task(id).waits) {
      LILY_CHECK(w.counter < list.counters, "task list: {} waits for counter {} of {}", index.describe(id), w.counter,
                 list.counters);
      const size_t n = producers[w.counter].size();
      LILY_CHECK(n > 0, "task list: {} waits for counter {}, which no task signals", index.describe(id), w.counter);
      LILY_CHECK(w.count == n,
                 "task list: {} waits for {} signals of counter {}, which {} tasks signal (a wait is for all of "
                 "them: give a partial wait a counter of its own)",
                 index.describe(id), w.count, w.counter, n);
      waited[w.counter] = true;
    }
  for (uint32_t c = 0; c < list.counters; ++c)
    LILY_CHECK(producers[c].empty() || waited[c], "task list: counter {} is signalled by {} and waited for by nobody",
               c, index.describe(producers[c].front()));
}

// Runs the list as the resident grid would: every block in order, a task when its waits hold.
// Returns the tasks in the order they ran (a topological order of program order and waits);
// throws naming the stuck tasks when some never can.
std::vector<uint32_t> simulate(const TaskList& list, const Index& index,
                               const std::vector<std::vector<uint32_t>>& producers) {
  std::vector<uint32_t> value(list.counters, 0), pc(list.blocks.size(), 0), order;
  order.reserve(index.size());
  auto ready = [&](const Task& t) {
    return std::all_of(t.waits.begin(), t.waits.end(), [&](const Wait& w) { return value[w.counter] >= w.count; });
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (uint32_t b = 0; b < list.blocks.size(); ++b)
      while (pc[b] < list.blocks[b].size() && ready(list.blocks[b][pc[b]])) {
        const Task& t = list.blocks[b][pc[b]];
        if (t.signal >= 0) ++value[size_t(t.signal)];
        order.push_back(index.id(b, pc[b]++));
        progress = true;
      }
  }
  if (order.size() == index.size()) return order;
  std::string stuck;
  int shown = 0;
  for (uint32_t b = 0; b < list.blocks.size() && shown < 4; ++b) {
    if (pc[b] == list.blocks[b].size()) continue;
    const uint32_t id = index.id(b, pc[b]);
    for (const Wait& w : index.task(id).waits) {
      if (value[w.counter] >= w.count) continue;
      std::string missing;
      for (uint32_t p : producers[w.counter])
        if (index.place(p).index >= pc[index.place(p).block]) {
          missing = index.describe(p);
          break;
        }
      stuck += fmt::format("\n  {} waits for counter {} ({} of {}; {} has not run)", index.describe(id), w.counter,
                           value[w.counter], w.count, missing);
      break;
    }
    ++shown;
  }
  fail("task list: {} of {} tasks can never run (a cycle through the block order and the waits):{}",
       index.size() - order.size(), index.size(), stuck);
}

// Happens-before as vector clocks: what happens before a task is, in every block, a prefix of
// that block's list (program order), so a task keeps one count a block: clock[t][b] tasks of
// block b happen before t. Memory is tasks x blocks counts, not tasks^2 bits (the whole model at
// 8 rows checks in 142 MB). Built in an order where every predecessor comes first; a counter's clock
// is the join of its producers' clocks (each producer included), ready before any waiter runs.
class HappensBefore {
 public:
  HappensBefore(const Index& index, const std::vector<uint32_t>& order, size_t blocks, size_t counters)
      : index_(index), blocks_(blocks), clock_(index.size() * blocks, 0) {
    std::vector<uint32_t> counter_clock(counters * blocks, 0);
    for (uint32_t id : order) {
      const Place& at = index.place(id);
      uint32_t* c = &clock_[id * blocks_];
      if (at.index > 0) join(c, &clock_[index.id(at.block, at.index - 1) * blocks_]);
      c[at.block] = at.index;  // the tasks before it in its own block
      for (const Wait& w : index.task(id).waits) join(c, &counter_clock[w.counter * blocks_]);
      const int32_t signal = index.task(id).signal;
      if (signal >= 0) {
        uint32_t* cc = &counter_clock[size_t(signal) * blocks_];
        join(cc, c);
        cc[at.block] = std::max(cc[at.block], at.index + 1);  // the producer itself
      }
    }
  }
  size_t blocks() const { return blocks_; }
  // How many tasks of each block happen before `id`.
  const uint32_t* clock(uint32_t id) const { return &clock_[id * blocks_]; }
  // Whether a happens before b (a != b).
  bool before(uint32_t a, uint32_t b) const {
    const Place& pa = index_.place(a);
    return clock_[b * blocks_ + pa.block] > pa.index;
  }

 private:
  void join(uint32_t* dst, const uint32_t* src) const {
    for (size_t b = 0; b < blocks_; ++b) dst[b] = std::max(dst[b], src[b]);
  }
  const Index& index_;
  size_t blocks_;
  std::vector<uint32_t> clock_;
};

const char* kind_name(Access::Kind k) {
  return k == Access::Kind::read ? "reads" : k == Access::Kind::write ? "writes" : "accumulates into";
}

// Overlapping accesses of one buffer, at least one writing and not both accumulating, are ordered.
// One pass over the tasks in an order that extends happens-before (the simulation's), each
// buffer's bytes cut into cells at every access's ends. A cell keeps its last writer and, since
// that write, the latest reader and the latest accumulator of every block (as clocks: what
// happens before a task is a prefix of each block's list, so the latest of a block stands for
// all of that block's). Each access is checked against them: a read comes after the last write
// and every accumulation since it, an accumulation after the last write and every read since it,
// a write after all of those. Any two conflicting accesses are then ordered, directly or through
// those between them; the cost is the cells an access covers times the blocks, not the pairs of
// accesses (the whole model at 8 rows has ~5k reads of all of h against ~330k accumulations).
class RaceCheck {
 public:
  RaceCheck(const Index& index, const HappensBefore& hb) : index_(index), hb_(hb), blocks_(hb.blocks()) {
    for (uint32_t id = 0; id < index.size(); ++id)
      for (const Access& a : index.task(id).accesses) {
        LILY_CHECK(a.begin < a.end, "task list: {} declares an empty access of buffer {}", index.describe(id),
                   a.buffer);
        if (buffers_.size() <= a.buffer) buffers_.resize(a.buffer + 1);
        buffers_[a.buffer].edges.push_back(a.begin);
        buffers_[a.buffer].edges.push_back(a.end);
      }
    for (Buffer& b : buffers_) {
      std::sort(b.edges.begin(), b.edges.end());
      b.edges.erase(std::unique(b.edges.begin(), b.edges.end()), b.edges.end());
      b.cells.resize(b.edges.empty() ? 0 : b.edges.size() - 1);
    }
  }

  // All of a task's accesses are checked before any is recorded (a task may read what it writes).
  void run(uint32_t id) {
    const Task& t = index_.task(id);
    for (const Access& a : t.accesses)
      each_cell(a, [&](Cell& cell, uint64_t begin, uint64_t end) { check(id, a, cell, begin, end); });
    for (int pass = 0; pass < 2; ++pass)  // reads and accumulations, then writes (which reset)
      for (const Access& a : t.accesses)
        if ((a.kind == Access::Kind::write) == (pass == 1))
          each_cell(a, [&](Cell& cell, uint64_t, uint64_t) { record(id, a.kind, cell); });
  }

 private:
  struct Cell {
    int64_t writer = -1;
    std::vector<uint32_t> reads, accumulations;  // by block: 1 + the index of the latest, 0 none
  };
  struct Buffer {
    std::vector<uint64_t> edges;
    std::vector<Cell> cells;  // [edges[i], edges[i + 1])
  };

  template <typename F>
  void each_cell(const Access& a, F f) {
    Buffer& b = buffers_[a.buffer];
    size_t i = size_t(std::lower_bound(b.edges.begin(), b.edges.end(), a.begin) - b.edges.begin());
    for (; i + 1 < b.edges.size() && b.edges[i] < a.end; ++i) f(b.cells[i], b.edges[i], b.edges[i + 1]);
  }

  void check(uint32_t id, const Access& a, const Cell& cell, uint64_t begin, uint64_t end) const {
    if (cell.writer >= 0 && !hb_.before(uint32_t(cell.writer), id))
      race(uint32_t(cell.writer), Access::Kind::write, id, a, begin, end);
    if (a.kind != Access::Kind::read) after_all(id, a, cell.reads, Access::Kind::read, begin, end);
    if (a.kind != Access::Kind::accumulate) after_all(id, a, cell.accumulations, Access::Kind::accumulate, begin, end);
  }

  // id comes after the latest access of every block in `latest`. Neither the writer nor these are
  // ever id itself: a task's accesses are recorded after all of them are checked.
  void after_all(uint32_t id, const Access& a, const std::vector<uint32_t>& latest, Access::Kind kind, uint64_t begin,
                 uint64_t end) const {
    if (latest.empty()) return;
    const uint32_t* clock = hb_.clock(id);
    for (uint32_t b = 0; b < blocks_; ++b)
      if (latest[b] > clock[b]) race(index_.id(b, latest[b] - 1), kind, id, a, begin, end);
  }

  void record(uint32_t id, Access::Kind kind, Cell& cell) const {
    if (kind == Access::Kind::write) {
      cell.writer = id;
      cell.reads.clear(), cell.accumulations.clear();  // all before this write, which comes first now
      return;
    }
    std::vector<uint32_t>& latest = kind == Access::Kind::read ? cell.reads : cell.accumulations;
    if (latest.empty()) latest.assign(blocks_, 0);
    const Place& at = index_.place(id);
    latest[at.block] = std::max(latest[at.block], at.index + 1);
  }

  [[noreturn]] void race(uint32_t prior, Access::Kind prior_kind, uint32_t id, const Access& a, uint64_t begin,
                         uint64_t end) const {
    fail("task list: {} {} buffer {} bytes [{}, {}) and {} {} bytes [{}, {}) with nothing ordering them",
         index_.describe(prior), kind_name(prior_kind), a.buffer, begin, end, index_.describe(id), kind_name(a.kind),
         a.begin, a.end);
  }

  const Index& index_;
  const HappensBefore& hb_;
  size_t blocks_;
  std::vector<Buffer> buffers_;
};

void check_races(const Index& index, const std::vector<uint32_t>& order, const HappensBefore& hb) {
  RaceCheck races(index, hb);
  for (uint32_t id : order) races.run(id);
}

}  // namespace

size_t TaskList::tasks() const {
  size_t n = 0;
  for (const auto& b : blocks) n += b.size();
  return n;
}

void check_task_list(const TaskList& list) {
  const Index index(list);
  const auto producers = producers_of(list, index);
  check_counters(list, index, producers);
  const std::vector<uint32_t> order = simulate(list, index, producers);
  bool writes = false;  // a list that only reads cannot race (and needs no happens-before)
  for (const auto& block : list.blocks)
    for (const Task& t : block)
      for (const Access& a : t.accesses) writes = writes || a.kind != Access::Kind::read;
  if (writes) check_races(index, order, HappensBefore(index, order, list.blocks.size(), list.counters));
}

}  // namespace lily::cuda::persistent
