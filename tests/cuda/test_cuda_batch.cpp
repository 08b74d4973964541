// test_cuda_batch.cpp: the CUDA backend's batch step (Backend::forward_batch: one token of each of
// several sequences in one step, batch_rows.h) against each sequence alone, on the embedded model:
// sequences at lengths 0, 1, 5, 63, 64, 65, 148 and one at its capacity - 1, each row's logits
// against a one-token forward of a twin state (the decode step), then one more decode step of
// every sequence that has room, so the states the batch step left (KV rows, DeltaNet states,
// positions) are checked through the logits they lead to. N = 2, 8 and 16; with the MoE on the
// decode kernels too (moe_slots_up_to) and with the batch graph replayed for other sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/checkpoint/load.h"

namespace lily {
namespace {

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

struct Sequence {
  std::unique_ptr<SequenceState> batch, alone;  // twins: one through the batch step, one alone
  int32_t next = 0;                             // the token the step appends
};

// max |a - b| over a row of V, and max |b|.
std::pair<double, double> row_diff(const float* a, const float* b, int64_t V) {
  double diff = 0, top = 0;
  for (int64_t i = 0; i < V; ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    top = std::max(top, double(std::fabs(b[i])));
  }
  return {diff, top};
}

// The CPU reference's logits after prompt + token (a fresh sequence).
std::vector<float> cpu_logits(Backend& cpu, std::vector<int32_t> tokens, int32_t token) {
  tokens.push_back(token);
  std::vector<float> logits;
  cpu.forward(*cpu.new_sequence(int64_t(tokens.size())), tokens, LogitsWanted::last, logits);
  return logits;
}

void check_batch(CudaBackend& gpu, Backend& cpu, int N, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << N << " sequences");
  const int64_t V = gpu.config().vocab_size;
  const int lengths[] = {0, 1, 5, 63, 64, 65, 148, 149};  // the last: capacity 150, full after the step
  std::vector<Sequence> seqs;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits;
  for (int r = 0; r < N; ++r) {
    const int length = lengths[r % 8];
    const int64_t capacity = r % 8 == 7 ? 150 : 256;
    std::vector<int32_t> prompt(static_cast<size_t>(length));
    for (int i = 0; i < length; ++i) prompt[size_t(i)] = int32_t((seed + uint32_t(r) * 131 + uint32_t(i) * 7) % V);
    prompts.push_back(prompt);
    Sequence s{gpu.new_sequence(capacity), gpu.new_sequence(capacity), int32_t((seed + uint32_t(r) * 17) % V)};
    if (length > 0) {
      gpu.forward(*s.batch, prompt, LogitsWanted::none, logits);
      gpu.forward(*s.alone, prompt, LogitsWanted::none, logits);
    }
    seqs.push_back(std::move(s));
  }
  // The batch step against each sequence's one-token forward (the decode graph).
  std::vector<SequenceState*> states;
  std::vector<int32_t> tokens;
  for (auto& s : seqs) states.push_back(s.batch.get()), tokens.push_back(s.next);
  std::vector<float> rows(size_t(N * V), NAN);
  gpu.forward_batch(states, tokens, rows);
  ASSERT_EQ(rows.size(), size_t(N * V));
  std::vector<float> alone;
  int argmax_differs = 0;  // the few-row lm_head rounds x to bf16, the decode one not: a near-tie may flip
  for (int r = 0; r < N; ++r) {
    Sequence& s = seqs[size_t(r)];
    gpu.forward(*s.alone, std::span<const int32_t>(&s.next, 1), LogitsWanted::last, alone);
    const float* got = rows.data() + size_t(r) * size_t(V);
    const auto [diff, top] = row_diff(got, alone.data(), V);
    // And both against the CPU reference (the bound of the GPU forward's tests), which says which
    // one is off when they differ.
    const std::vector<float> ref = cpu_logits(cpu, prompts[size_t(r)], s.next);
    const auto [batch_off, ref_top] = row_diff(got, ref.data(), V);
    const double alone_off = row_diff(alone.data(), ref.data(), V).first;
    EXPECT_LE(diff, 2e-2 * top) << "row " << r << " (length " << lengths[r % 8] << ", token " << s.next << ", seed "
                                << seed << "): max |batch| " << row_diff(got, got, V).second << ", arg max "
                                << argmax(got, V) << " against " << argmax(alone.data(), V)
                                << "; against the CPU: batch " << batch_off << ", alone " << alone_off;
    EXPECT_LE(batch_off, 2e-2 * ref_top) << "row " << r << ": the batch row against the CPU reference";
    argmax_differs += argmax(got, V) != argmax(alone.data(), V);
    EXPECT_EQ(s.batch->length(), s.alone->length()) << "row " << r;
  }
  EXPECT_LE(argmax_differs, N / 8) << "rows whose arg max differs from the sequence alone's";
  // One more step of every sequence with room: the states the batch step left.
  for (int r = 0; r < N; ++r) {
    Sequence& s = seqs[size_t(r)];
    if (s.batch->length() >= s.batch->capacity()) continue;
    const int32_t t = int32_t((seed + uint32_t(r) * 29 + 3) % V);
    std::vector<float> a, b;
    gpu.forward(*s.batch, std::span<const int32_t>(&t, 1), LogitsWanted::last, a);
    gpu.forward(*s.alone, std::span<const int32_t>(&t, 1), LogitsWanted::last, b);
    const auto [diff, top] = row_diff(a.data(), b.data(), V);
    EXPECT_LE(diff, 2e-2 * top) << "row " << r << ": the step after the batch step";
  }
}

std::unique_ptr<CudaBackend> backend(const std::shared_ptr<const ModelWeights>& w, std::vector<std::string> edits) {
  CudaBackendOptions o;
  o.plan_edits = std::move(edits);
  return make_cuda_backend(w, o);
}

TEST(CudaBatch, StepsMatchEachSequenceAlone) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  auto cpu = make_cpu_backend(weights);
  for (const auto& edits : {std::vector<std::string>{"batch_rows_up_to=16"},
                            std::vector<std::string>{"batch_rows_up_to=16", "moe_slots_up_to=16"}}) {
    SCOPED_TRACE(edits.back());
    auto gpu = backend(weights, edits);
    check_batch(*gpu, *cpu, 2, 1);
    check_batch(*gpu, *cpu, 8, 2);
    check_batch(*gpu, *cpu, 16, 3);
    check_batch(*gpu, *cpu, 8, 4);  // the graph of 8 rows again, for other sequences
    check_batch(*gpu, *cpu, 2, 5);  // and of 2
  }
}

// The case StepsMatchEachSequenceAlone fails on (sessions 25-26: the replayed 8-row graph after a
// 16-row step, seed 4, row 0 0.707 off the CPU) on a fresh backend, the graph captured for it: if
// this fails too, the fault follows the data (another row's inputs reaching row 0), not the replay.
TEST(CudaBatch, TheFailingCaseOnAFreshBackend) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  auto cpu = make_cpu_backend(weights);
  auto gpu = backend(weights, {"batch_rows_up_to=16"});
  check_batch(*gpu, *cpu, 8, 4);
}

// The default plan runs a batch as the sequences one after another: the same contract.
TEST(CudaBatch, DefaultPlanRunsSequencesOneAfterAnother) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  auto gpu = make_cuda_backend(weights);
  check_batch(*gpu, *make_cpu_backend(weights), 3, 5);
}

// A refused batch step changes no sequence (Backend::check_batch before anything runs).
TEST(CudaBatch, RefusedStepChangesNothing) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  auto gpu = backend(weights, {"batch_rows_up_to=16"});
  auto a = gpu->new_sequence(8), full = gpu->new_sequence(1);
  std::vector<float> logits;
  const int32_t one = 1;
  gpu->forward(*full, std::span<const int32_t>(&one, 1), LogitsWanted::none, logits);
  std::vector<SequenceState*> states = {a.get(), full.get()};
  const std::vector<int32_t> tokens = {1, 2};
  EXPECT_THROW(gpu->forward_batch(states, tokens, logits), Error);
  EXPECT_EQ(a->length(), 0);
  std::vector<SequenceState*> twice = {a.get(), a.get()};
  EXPECT_THROW(gpu->forward_batch(twice, tokens, logits), Error);
  EXPECT_EQ(a->length(), 0);
}

}  // namespace
}  // namespace lily
