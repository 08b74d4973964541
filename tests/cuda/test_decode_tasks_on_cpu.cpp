// test_decode_tasks_on_cpu.cpp: the decode task list (backend/cuda/persistent/decode_tasks.h) run on
// the CPU, as the oracle of the persistent kernel that will run it on the GPU (issue 16).
//
// Every task's body is written here in plain C++ over the step's buffers, reading and writing only
// what its Access list declares, and the tasks run in an order the kernel could take: at each turn
// a random block whose next task has all its waits met. Before each step every scratch buffer is
// poisoned with NaN (expert slots with kUnsetSlot), so a task that reads what no task before it
// wrote shows. The logits of every step must match the CPU reference backend's decode step (fp32
// both; only the order of the sums differs) on tiny-a and lily-tiny, with the default tiling and
// with odd tiles on few blocks (more attention splits than cached rows included). That proves the
// decomposition computes the model: the fused input projection's row order, DeltaNet head groups
// with their key heads and conv channels, attention splits and their combine, the router's last
// row as the shared expert's gate, and every expert slot's down added into h. A list with one
// task's rows shifted must fail the comparison (the test can fail).
//
// Steps of several rows (DecodeRows) the same way. Verify: T = 1..8 drafts after a prefix, every
// row against the reference decoding the drafts one at a time; parallel: T = 2..8 sequences at
// different positions (0 included), every row against its own sequence's reference step. After
// the step, every state (DeltaNet conv and recurrent state, KV rows, positions) must equal the
// one-row list's over the same tokens, and one more token of every sequence must match the
// reference again. Rows taken out of order (a DeltaNet row from the state before the step,
// attention to later drafts) and tasks on the wrong rows must fail the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "base/error.h"
#include "decode_task_bodies.h"
#include "model/checkpoint/load.h"

namespace lily::test {
namespace {

// One step's tasks in a random order the kernel could take: each turn, one of the blocks whose
// next task has every wait met runs that task, then adds to its counter.
void run_step(const TaskList& list, TaskBodies& bodies, StepBuffers& b, std::mt19937& rng) {
  std::vector<size_t> next(list.blocks.size(), 0);
  std::vector<uint32_t> counters(list.counters, 0);
  std::vector<size_t> ready;
  for (size_t left = list.tasks(); left > 0; --left) {
    ready.clear();
    for (size_t k = 0; k < list.blocks.size(); ++k) {
      if (next[k] == list.blocks[k].size()) continue;
      const Task& t = list.blocks[k][next[k]];
      if (std::all_of(t.waits.begin(), t.waits.end(), [&](const Wait& w) { return counters[w.counter] >= w.count; }))
        ready.push_back(k);
    }
    ASSERT_FALSE(ready.empty()) << "no block can go on with " << left << " tasks left";
    const size_t k = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng)];
    const Task& t = list.blocks[k][next[k]++];
    bodies.run(t, b);
    if (t.signal >= 0) ++counters[size_t(t.signal)];
  }
}

struct Mismatch {
  double max_abs_diff = 0, max_abs_ref = 0;
  int argmax_differs = 0;

  // One row of V logits against the reference's.
  void add(const float* got, const std::vector<float>& want) {
    for (size_t i = 0; i < want.size(); ++i) {
      const double diff = std::fabs(double(got[i]) - want[i]);
      max_abs_diff = std::max(max_abs_diff, std::isfinite(diff) ? diff : INFINITY);
      max_abs_ref = std::max(max_abs_ref, double(std::fabs(want[i])));
    }
    argmax_differs += std::max_element(got, got + want.size()) - got !=
                      std::max_element(want.begin(), want.end()) - want.begin();
  }
  bool equal() const { return max_abs_diff <= 1e-4 * max_abs_ref && argmax_differs == 0; }
};

// Sequence states against each other: every float of the DeltaNet states and the KV caches (rows
// neither wrote are NaN in both), and the positions.
struct StateMismatch {
  double max_abs_diff = 0, max_abs_ref = 0;
  int positions_differ = 0;

  void add(const SequenceBuffers& got, const SequenceBuffers& want) {
    positions_differ += got.position != want.position;
    auto each = [&](const std::vector<std::vector<float>>& g, const std::vector<std::vector<float>>& w) {
      ASSERT_EQ(g.size(), w.size());
      for (size_t l = 0; l < g.size(); ++l) {
        ASSERT_EQ(g[l].size(), w[l].size());
        for (size_t i = 0; i < g[l].size(); ++i) {
          if (std::isnan(g[l][i]) && std::isnan(w[l][i])) continue;
          const double diff = std::fabs(double(g[l][i]) - w[l][i]);
          max_abs_diff = std::max(max_abs_diff, std::isfinite(diff) ? diff : INFINITY);
          max_abs_ref = std::max(max_abs_ref, double(std::fabs(w[l][i])));
        }
      }
    };
    each(got.conv, want.conv), each(got.ssm, want.ssm), each(got.k_cache, want.k_cache);
    each(got.v_cache, want.v_cache);
  }
};

// Steps of a model's task lists on the CPU, in a random ready order; the one-row list of the
// tiling at hand for single tokens.
class CpuSteps {
 public:
  CpuSteps(const ModelWeights& w, const DecodeTiling& tiling, uint32_t seed, Faults faults = {})
      : bodies_(w, tiling, faults), one_row_(build_decode_tasks(w.config, tiling).list), rng_(seed) {}

  SequenceBuffers new_sequence(int64_t capacity) const { return bodies_.new_sequence(capacity); }

  // One step of `list` (built for `rows`) over `seqs`; returns the logits [T, V].
  // kept: the DeltaNet states the step kept after its rows 0..T-2 (keep_states), as sequences
  // holding only those (conv, ssm; the attention layers' entries empty).
  std::vector<float> step(const TaskList& list, const DecodeRows& rows, std::vector<int32_t> tokens,
                          std::vector<SequenceBuffers>& seqs, std::vector<SequenceBuffers>* kept = nullptr) {
    StepBuffers b = bodies_.new_step(rows, std::move(tokens), std::move(seqs));
    run_step(list, bodies_, b, rng_);
    for (int r = 0; kept && r < rows.snapshots(); ++r) {
      SequenceBuffers x;
      for (size_t l = 0; l < b.conv_after.size(); ++l) {
        x.conv.push_back(b.conv_after[l][size_t(r)]);
        x.ssm.push_back(b.ssm_after[l][size_t(r)]);
      }
      kept->push_back(std::move(x));
    }
    seqs = std::move(b.seqs);
    return std::move(b.logits);
  }

  // One token of one sequence (the one-row list unless given another).
  std::vector<float> decode(SequenceBuffers& s, int32_t token, const TaskList* list = nullptr) {
    std::vector<SequenceBuffers> seqs;
    seqs.push_back(std::move(s));
    std::vector<float> logits = step(list ? *list : one_row_, DecodeRows{}, {token}, seqs);
    s = std::move(seqs[0]);
    return logits;
  }

 private:
  TaskBodies bodies_;
  const TaskList one_row_;
  std::mt19937 rng_;
};

// The reference backend's logits of one more token of `seq`.
std::vector<float> reference_decode(Backend& reference, SequenceState& seq, int32_t id) {
  std::vector<float> logits;
  reference.forward(seq, std::span<const int32_t>(&id, 1), LogitsWanted::last, logits);
  return logits;
}

// Every token of `ids` as a decode step through the task list and through the CPU backend.
Mismatch decode_both_ways(const std::shared_ptr<const ModelWeights>& weights, const DecodeTiling& tiling,
                          const std::vector<int32_t>& ids, const TaskList* list_override = nullptr) {
  CpuSteps steps(*weights, tiling, uint32_t(ids.size() * 7919 + size_t(tiling.blocks)));
  SequenceBuffers s = steps.new_sequence(int64_t(ids.size()));
  auto reference = make_cpu_backend(weights);
  auto seq = reference->new_sequence(int64_t(ids.size()));
  Mismatch m;
  for (int32_t id : ids) m.add(steps.decode(s, id, list_override).data(), reference_decode(*reference, *seq, id));
  EXPECT_EQ(s.position, int64_t(ids.size()));
  return m;
}

// A step of several rows and what it left, each against the reference.
struct RowsComparison {
  Mismatch logits;      // every row of the step, then one more token of every sequence after it
  StateMismatch state;  // the states after the step against the one-row list's over the same tokens
};

// A verify step of the `drafts` after `prefix` (both decoded a token at a time by the one-row list
// and by the reference): each row's logits against the reference decoding the drafts one at a
// time, the state after the step against the one-row list's after the same drafts, and `next` on
// both sides after the step.
RowsComparison verify_both_ways(const std::shared_ptr<const ModelWeights>& weights, const DecodeTiling& tiling,
                                const std::vector<int32_t>& prefix, const std::vector<int32_t>& drafts, int32_t next,
                                const TaskList* list_override = nullptr, Faults faults = {}) {
  const ModelConfig& c = weights->config;
  const DecodeRows rows{int(drafts.size()), DecodeRows::Kind::verify};
  const DecodeTasks tasks = build_decode_tasks(c, tiling, rows);
  const int64_t capacity = int64_t(prefix.size() + drafts.size()) + 1;
  CpuSteps steps(*weights, tiling, uint32_t(capacity * 31 + rows.count * 7 + tiling.blocks), faults);
  auto reference = make_cpu_backend(weights);
  auto seq = reference->new_sequence(capacity);
  std::vector<SequenceBuffers> one = {steps.new_sequence(capacity)};
  RowsComparison cmp;
  for (int32_t id : prefix) cmp.logits.add(steps.decode(one[0], id).data(), reference_decode(*reference, *seq, id));
  SequenceBuffers alone = one[0];  // the same drafts a token at a time
  const std::vector<float> got = steps.step(list_override ? *list_override : tasks.list, rows, drafts, one);
  for (size_t r = 0; r < drafts.size(); ++r) {
    cmp.logits.add(got.data() + r * size_t(c.vocab_size), reference_decode(*reference, *seq, drafts[r]));
    steps.decode(alone, drafts[r]);
  }
  cmp.state.add(one[0], alone);
  cmp.logits.add(steps.decode(one[0], next).data(), reference_decode(*reference, *seq, next));
  return cmp;
}

// A verify step of `drafts` after `prefix` keeping its states (DecodeRows::keep_states): the
// state kept after row r against the one-row list's after prefix + drafts[0..r], for r < T - 1
// (the DeltaNet conv taps and recurrent state of every layer).
StateMismatch kept_states_both_ways(const std::shared_ptr<const ModelWeights>& weights, const DecodeTiling& tiling,
                                    const std::vector<int32_t>& prefix, const std::vector<int32_t>& drafts,
                                    Faults faults = {}) {
  const DecodeRows rows{int(drafts.size()), DecodeRows::Kind::verify, true};
  const DecodeTasks tasks = build_decode_tasks(weights->config, tiling, rows);
  const int64_t capacity = int64_t(prefix.size() + drafts.size()) + 1;
  CpuSteps steps(*weights, tiling, uint32_t(capacity * 37 + rows.count), faults);
  std::vector<SequenceBuffers> one = {steps.new_sequence(capacity)};
  for (int32_t id : prefix) steps.decode(one[0], id);
  SequenceBuffers alone = one[0];
  std::vector<SequenceBuffers> kept;
  steps.step(tasks.list, rows, drafts, one, &kept);
  EXPECT_EQ(kept.size(), drafts.size() - 1);
  StateMismatch m;
  for (size_t r = 0; r + 1 < drafts.size() && r < kept.size(); ++r) {
    steps.decode(alone, drafts[r]);
    SequenceBuffers want;
    want.conv = alone.conv, want.ssm = alone.ssm;
    kept[r].position = want.position = 0;
    m.add(kept[r], want);
  }
  return m;
}

// A parallel step of one token a sequence, sequence i after prefixes[i]: each row's logits against
// the reference's step of that sequence, each state after the step against the one-row list's
// step of that sequence alone, then next[i] on both sides after the step.
RowsComparison parallel_both_ways(const std::shared_ptr<const ModelWeights>& weights, const DecodeTiling& tiling,
                                  const std::vector<std::vector<int32_t>>& prefixes, const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& next, const TaskList* list_override = nullptr) {
  const ModelConfig& c = weights->config;
  const DecodeRows rows{int(tokens.size()), DecodeRows::Kind::parallel};
  const DecodeTasks tasks = build_decode_tasks(c, tiling, rows);
  size_t longest = 0;
  for (const auto& p : prefixes) longest = std::max(longest, p.size());
  const int64_t capacity = int64_t(longest) + 2;
  CpuSteps steps(*weights, tiling, uint32_t(capacity * 31 + rows.count * 7 + tiling.blocks));
  auto reference = make_cpu_backend(weights);
  std::vector<std::unique_ptr<SequenceState>> refs;
  std::vector<SequenceBuffers> seqs, alone;
  RowsComparison cmp;
  for (size_t i = 0; i < tokens.size(); ++i) {
    refs.push_back(reference->new_sequence(capacity));
    seqs.push_back(steps.new_sequence(capacity));
    for (int32_t id : prefixes[i])
      cmp.logits.add(steps.decode(seqs[i], id).data(), reference_decode(*reference, *refs[i], id));
    alone.push_back(seqs[i]);
  }
  const std::vector<float> got = steps.step(list_override ? *list_override : tasks.list, rows, tokens, seqs);
  for (size_t i = 0; i < tokens.size(); ++i) {
    cmp.logits.add(got.data() + i * size_t(c.vocab_size), reference_decode(*reference, *refs[i], tokens[i]));
    steps.decode(alone[i], tokens[i]);
    cmp.state.add(seqs[i], alone[i]);
    cmp.logits.add(steps.decode(seqs[i], next[i]).data(), reference_decode(*reference, *refs[i], next[i]));
  }
  return cmp;
}

DecodeTiling odd_tiling(int blocks, int splits) {
  DecodeTiling t;
  t.blocks = blocks, t.in_proj_rows = 7, t.out_proj_rows = 5, t.router_rows = 3, t.expert_rows = 5;
  t.down_rows = 9, t.lm_head_rows = 50, t.attention_splits = splits, t.attention_kv_heads = 1, t.combine_heads = 1;
  return t;
}

std::vector<int32_t> fixture_ids() {
  return read_json(fixture_dir("tiny-a") + "/reference.json")["ids"].get<std::vector<int32_t>>();
}

void expect_equal_logits(const Mismatch& m, const std::string& what) {
  std::printf("[%s] max |diff| %.3g of max |ref| %.3g, argmax differs %d\n", what.c_str(), m.max_abs_diff,
              m.max_abs_ref, m.argmax_differs);
  EXPECT_LE(m.max_abs_diff, 1e-4 * m.max_abs_ref) << what;
  EXPECT_EQ(m.argmax_differs, 0) << what;
}

void expect_equal(const RowsComparison& cmp, const std::string& what) {
  expect_equal_logits(cmp.logits, what);
  std::printf("[%s] state: max |diff| %.3g of max |ref| %.3g, positions differ %d\n", what.c_str(),
              cmp.state.max_abs_diff, cmp.state.max_abs_ref, cmp.state.positions_differ);
  EXPECT_LE(cmp.state.max_abs_diff, 1e-4 * cmp.state.max_abs_ref) << what;
  EXPECT_EQ(cmp.state.positions_differ, 0) << what;
}

std::shared_ptr<const ModelWeights> tiny_a() { return load_model(fixture_dir("tiny-a") + "/mlx-q4"); }
std::shared_ptr<const ModelWeights> lily_tiny() {
  return load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
}

// n token ids drawn from the vocabulary, seeded.
std::vector<int32_t> random_ids(const ModelConfig& c, int n, uint32_t seed) {
  std::vector<int32_t> ids;
  std::mt19937 rng(seed);
  for (int i = 0; i < n; ++i) ids.push_back(int32_t(rng() % uint32_t(c.vocab_size)));
  return ids;
}

// t with DeltaNet tasks of three whole heads (a task across key heads; lily-tiny's last task one head).
DecodeTiling three_head_tasks(DecodeTiling t, const ModelConfig& c) {
  t.deltanet_columns = 3 * c.linear_value_head_dim;
  return t;
}

TEST(DecodeTasksOnCpu, TinyAMatchesTheReferenceBackend) {
  auto weights = tiny_a();
  const std::vector<int32_t> ids = fixture_ids();
  ASSERT_GE(ids.size(), 8u);
  expect_equal_logits(decode_both_ways(weights, DecodeTiling{}, ids), "tiny-a, default tiles, 132 blocks");
  DecodeTiling odd = odd_tiling(3, 5);
  expect_equal_logits(decode_both_ways(weights, odd, ids), "tiny-a, odd tiles, 3 blocks, 5 splits");
  odd = odd_tiling(1, 1);
  odd.deltanet_columns = 512;  // every head in one task
  expect_equal_logits(decode_both_ways(weights, odd, ids), "tiny-a, one block, one split");
  odd = odd_tiling(7, 64);  // more splits than cached rows: most splits are empty
  expect_equal_logits(decode_both_ways(weights, odd, ids), "tiny-a, 7 blocks, 64 splits");
}

TEST(DecodeTasksOnCpu, LilyTinyMatchesTheReferenceBackend) {
  auto weights = lily_tiny();
  const std::vector<int32_t> ids = random_ids(weights->config, 12, 5);
  expect_equal_logits(decode_both_ways(weights, three_head_tasks({}, weights->config), ids),
                      "lily-tiny, default tiles");
  const DecodeTiling odd = three_head_tasks(odd_tiling(5, 3), weights->config);
  expect_equal_logits(decode_both_ways(weights, odd, ids), "lily-tiny, odd tiles, 5 blocks, 3 splits");
}

// The comparison catches a wrong list: the rows of one task of each kind moved by one (the list
// stays well-formed; only what the task computes is wrong).
TEST(DecodeTasksOnCpu, AShiftedTaskFailsTheComparison) {
  auto weights = tiny_a();
  const std::vector<int32_t> ids = fixture_ids();
  const DecodeTiling odd = odd_tiling(3, 2);
  for (DecodeOp op : {DecodeOp::in_proj, DecodeOp::out_proj, DecodeOp::router, DecodeOp::gate_up, DecodeOp::down,
                      DecodeOp::lm_head}) {
    TaskList list = build_decode_tasks(weights->config, odd).list;
    bool shifted = false;
    for (auto& block : list.blocks)
      for (Task& t : block)
        if (!shifted && DecodeOp(t.op) == op && t.first > 0) --t.first, shifted = true;
    ASSERT_TRUE(shifted) << op_name(op);
    const Mismatch m = decode_both_ways(weights, odd, ids, &list);
    EXPECT_FALSE(m.max_abs_diff <= 1e-4 * m.max_abs_ref && m.argmax_differs == 0)
        << op_name(op) << ": a shifted task went unnoticed";
  }
}

// ---- Steps of several rows ----------------------------------------------------------------

std::vector<int32_t> slice(const std::vector<int32_t>& ids, size_t at, size_t n) {
  return {ids.begin() + long(at), ids.begin() + long(at + n)};
}

// Sequence i of a parallel step: a prefix of its own length (0 included) from its own part of
// `ids`, its token and the one after the step.
struct ParallelCase {
  std::vector<std::vector<int32_t>> prefixes;
  std::vector<int32_t> tokens, next;
};
ParallelCase parallel_case(const std::vector<int32_t>& ids, int T) {
  ParallelCase p;
  for (size_t i = 0; i < size_t(T); ++i) {
    p.prefixes.push_back(slice(ids, 10 * i, (i * 5) % 9));  // lengths 0, 5, 1, 6, 2, 7, 3, 8
    p.tokens.push_back(ids[100 + i]);
    p.next.push_back(ids[120 + i]);
  }
  return p;
}

// Verify rows: T drafts after a prefix, every row against the reference decoding them one at a
// time, the state after the step, and a token after it.
TEST(DecodeTasksOnCpu, VerifyRowsMatchTheReferenceBackend) {
  auto weights = tiny_a();
  const std::vector<int32_t> ids = fixture_ids();
  for (int T = 1; T <= kMaxDecodeRows; ++T)
    expect_equal(verify_both_ways(weights, DecodeTiling{}, slice(ids, 0, 5), slice(ids, 5, size_t(T)), ids[20]),
                 "tiny-a verify, T " + std::to_string(T) + ", default tiles");
  DecodeTiling one_block = odd_tiling(1, 1);
  one_block.deltanet_columns = 16;
  for (int T : {1, 2, 3, 8}) {
    const std::string rows = "tiny-a verify, T " + std::to_string(T);
    expect_equal(verify_both_ways(weights, odd_tiling(3, 5), slice(ids, 30, 7), slice(ids, 37, size_t(T)), ids[50]),
                 rows + ", odd tiles, 3 blocks, 5 splits");
    expect_equal(verify_both_ways(weights, odd_tiling(7, 64), slice(ids, 60, 4), slice(ids, 64, size_t(T)), ids[80]),
                 rows + ", 7 blocks, 64 splits");
    expect_equal(verify_both_ways(weights, one_block, slice(ids, 90, 3), slice(ids, 93, size_t(T)), ids[110]),
                 rows + ", one block, one split");
  }
  expect_equal(verify_both_ways(weights, odd_tiling(3, 2), {}, slice(ids, 0, 3), ids[3]),
               "tiny-a verify, T 3 from position 0");
}

// The states a verify step keeps after each row (for taking drafts back) are the states of the
// drafts decoded one at a time; a DeltaNet that restarts each row from the step's first state
// keeps wrong ones.
TEST(DecodeTasksOnCpu, KeptStatesAreTheStatesAfterEachRow) {
  for (const auto& weights : {tiny_a(), lily_tiny()}) {
    const std::vector<int32_t> ids = random_ids(weights->config, 16, 11);
    for (int T : {2, 5, 8})
      for (const DecodeTiling& t : {DecodeTiling{}, odd_tiling(3, 2)}) {
        const StateMismatch m = kept_states_both_ways(weights, t, slice(ids, 0, 4), slice(ids, 4, size_t(T)));
        EXPECT_LE(m.max_abs_diff, 1e-6 * m.max_abs_ref) << weights->config.num_layers << " layers, T " << T;
        EXPECT_GT(m.max_abs_ref, 0.0);
      }
    Faults restart;
    restart.deltanet_restarts_each_row = true;
    const StateMismatch bad = kept_states_both_ways(weights, odd_tiling(3, 2), slice(ids, 0, 4), slice(ids, 4, 3),
                                                    restart);
    EXPECT_GT(bad.max_abs_diff, 1e-3 * bad.max_abs_ref);
  }
  EXPECT_THROW(build_decode_tasks(tiny_a()->config, DecodeTiling{}, {3, DecodeRows::Kind::parallel, true}), Error);
}

TEST(DecodeTasksOnCpu, LilyTinyVerifyRowsMatchTheReferenceBackend) {
  auto weights = lily_tiny();
  const std::vector<int32_t> ids = random_ids(weights->config, 16, 7);
  const DecodeTiling odd = three_head_tasks(odd_tiling(5, 3), weights->config);
  for (int T : {2, 8}) {
    const std::string rows = "lily-tiny verify, T " + std::to_string(T);
    expect_equal(verify_both_ways(weights, DecodeTiling{}, slice(ids, 0, 5), slice(ids, 5, size_t(T)), ids[15]),
                 rows + ", default tiles");
    expect_equal(verify_both_ways(weights, odd, slice(ids, 0, 5), slice(ids, 5, size_t(T)), ids[15]),
                 rows + ", odd tiles, 5 blocks, 3 splits");
  }
}

// Parallel rows: T sequences at different positions, each row against its sequence's reference
// step, each state after the step, and a token after it.
TEST(DecodeTasksOnCpu, ParallelRowsMatchTheReferenceBackend) {
  auto weights = tiny_a();
  const std::vector<int32_t> ids = fixture_ids();
  for (int T = 2; T <= kMaxDecodeRows; ++T) {
    const ParallelCase p = parallel_case(ids, T);
    expect_equal(parallel_both_ways(weights, DecodeTiling{}, p.prefixes, p.tokens, p.next),
                 "tiny-a parallel, T " + std::to_string(T) + ", default tiles");
  }
  for (int T : {2, 3, 8}) {
    const ParallelCase p = parallel_case(ids, T);
    const std::string rows = "tiny-a parallel, T " + std::to_string(T);
    expect_equal(parallel_both_ways(weights, odd_tiling(3, 5), p.prefixes, p.tokens, p.next),
                 rows + ", odd tiles, 3 blocks, 5 splits");
    expect_equal(parallel_both_ways(weights, odd_tiling(7, 64), p.prefixes, p.tokens, p.next),
                 rows + ", 7 blocks, 64 splits");
  }
}

TEST(DecodeTasksOnCpu, LilyTinyParallelRowsMatchTheReferenceBackend) {
  auto weights = lily_tiny();
  const std::vector<int32_t> ids = random_ids(weights->config, 130, 9);
  const DecodeTiling odd = three_head_tasks(odd_tiling(5, 3), weights->config);
  for (int T : {3, 8}) {
    const ParallelCase p = parallel_case(ids, T);
    const std::string rows = "lily-tiny parallel, T " + std::to_string(T);
    expect_equal(parallel_both_ways(weights, DecodeTiling{}, p.prefixes, p.tokens, p.next), rows + ", default tiles");
    expect_equal(parallel_both_ways(weights, odd, p.prefixes, p.tokens, p.next), rows + ", odd tiles, 5 blocks");
  }
}

// The comparison catches a verify step that gets the order of its rows wrong: a DeltaNet row that
// starts from the state before the step instead of the previous row's, or attention that lets a
// row see the drafts after it.
TEST(DecodeTasksOnCpu, VerifyRowsOutOfOrderFailTheComparison) {
  auto weights = tiny_a();
  const std::vector<int32_t> ids = fixture_ids();
  Faults restart, later;
  restart.deltanet_restarts_each_row = true;
  later.attention_sees_later_rows = true;
  for (const auto& [faults, what] : {std::pair{restart, "DeltaNet rows from the state before the step"},
                                     std::pair{later, "attention to later rows"}}) {
    const RowsComparison cmp = verify_both_ways(weights, odd_tiling(3, 2), slice(ids, 0, 5), slice(ids, 5, 3), ids[8],
                                                nullptr, faults);
    EXPECT_FALSE(cmp.logits.equal()) << what << " went unnoticed";
  }
}

// The comparison catches a list whose tasks take the wrong rows: in a parallel step, one task of
// each per-sequence op moved to the next sequence; in a verify step, one task of each op leaving
// out the last row.
TEST(DecodeTasksOnCpu, TasksOnTheWrongRowsFailTheComparison) {
  auto weights = tiny_a();
  const std::vector<int32_t> ids = fixture_ids();
  const DecodeTiling odd = odd_tiling(3, 2);
  const ParallelCase p = parallel_case(ids, 3);
  for (DecodeOp op : {DecodeOp::deltanet_core, DecodeOp::attention_split, DecodeOp::attention_combine}) {
    TaskList list = build_decode_tasks(weights->config, odd, {3, DecodeRows::Kind::parallel}).list;
    bool moved = false;
    for (auto& block : list.blocks)
      for (Task& t : block)
        if (!moved && DecodeOp(t.op) == op && t.row == 1) t.row = 2, moved = true;
    ASSERT_TRUE(moved) << op_name(op);
    const RowsComparison cmp = parallel_both_ways(weights, odd, p.prefixes, p.tokens, p.next, &list);
    EXPECT_FALSE(cmp.logits.equal()) << op_name(op) << ": a task on the wrong sequence went unnoticed";
  }
  for (DecodeOp op : {DecodeOp::embed, DecodeOp::in_proj, DecodeOp::deltanet_core, DecodeOp::attention_split,
                      DecodeOp::attention_combine, DecodeOp::out_proj, DecodeOp::router, DecodeOp::gate_up,
                      DecodeOp::down, DecodeOp::lm_head}) {
    TaskList list = build_decode_tasks(weights->config, odd, {3, DecodeRows::Kind::verify}).list;
    bool cut = false;
    for (auto& block : list.blocks)
      for (Task& t : block)
        // An expert task of the shared slot: every row uses it (a routed slot only the rows that chose it).
        if (!cut && DecodeOp(t.op) == op && (t.slot == expert_slots(weights->config, {3}) || op != DecodeOp::gate_up))
          --t.rows, cut = true;
    ASSERT_TRUE(cut) << op_name(op);
    const RowsComparison cmp = verify_both_ways(weights, odd, slice(ids, 0, 5), slice(ids, 5, 3), ids[8], &list);
    EXPECT_FALSE(cmp.logits.equal()) << op_name(op) << ": a task leaving out a row went unnoticed";
  }
}

}  // namespace
}  // namespace lily::test
