// The CUDA backend's forward_candidates under a grammar's mask (AllowedTokens: filled on the host
// while the step runs, uploaded, read by top_candidates) on models/lily-tiny, against the same
// backend's whole row selected on the host (tests/runtime/candidate_backends.h): two sequences
// fed the same tokens run the same kernels, so the candidates must be the row's exactly. Masks:
// every id, none, one, a random half, a sparse few; k 1, 20, 256; a mask longer than the
// vocabulary (a grammar's vocabulary may be); a fill that throws (the step happened: the state
// stays consistent and the next step matches); a mask too short (refused before the step).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "../runtime/candidate_backends.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "base/error.h"
#include "cuda_test_util.h"
#include "model/checkpoint/load.h"

namespace lily {
namespace {

enum class MaskKind { all, none, one, half, sparse };

std::vector<uint64_t> make_mask(MaskKind kind, int32_t n, size_t words, std::mt19937& rng) {
  std::vector<uint64_t> mask(words, 0);
  const int32_t one = int32_t(rng() % uint32_t(n));
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t r = rng() % 100;
    if (kind == MaskKind::all || (kind == MaskKind::half && r < 50) || (kind == MaskKind::sparse && r < 3) ||
        (kind == MaskKind::one && i == one))
      mask[size_t(i) >> 6] |= uint64_t(1) << (i & 63);
  }
  return mask;
}

struct Fixture {
  std::shared_ptr<const ModelWeights> weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  std::unique_ptr<Backend> gpu = make_cuda_backend(weights);
  int32_t V = weights->config.vocab_size;
  std::vector<int32_t> prompt = {4001, 882, 198, 1532, 3, 220, 24, 19, 22, 10, 18, 22};
  Fixture() {
    for (int32_t& t : prompt) t = std::min<int32_t>(t, V - 1);
  }
};

TEST(CudaMaskedCandidates, EqualTheWholeRowsMaskedSelection) {
  REQUIRE_GPU();
  Fixture f;
  // Each step, `whole` has run the decode step of `token` (its row is the next token's logits)
  // and `picked` runs it now through forward_candidates.
  auto whole = f.gpu->new_sequence(512), picked = f.gpu->new_sequence(512);
  std::vector<float> row;
  f.gpu->forward(*whole, f.prompt, LogitsWanted::none, row);
  f.gpu->forward(*picked, f.prompt, LogitsWanted::none, row);
  int32_t token = 7;
  f.gpu->forward(*whole, std::span<const int32_t>(&token, 1), LogitsWanted::last, row);
  std::mt19937 rng(18);
  const MaskKind kinds[] = {MaskKind::all, MaskKind::none, MaskKind::one, MaskKind::half, MaskKind::sparse};
  const int ks[] = {1, 20, 256};
  for (int step = 0; step < 60; ++step) {
    const MaskKind kind = kinds[size_t(step) % std::size(kinds)];
    const int k = ks[size_t(step / 5) % std::size(ks)];
    // A grammar's vocabulary may be longer than the model's row: a few words more.
    const size_t words = (size_t(f.V) + 63) / 64 + (step % 3 == 2 ? 3 : 0);
    const int32_t limit = step % 4 == 3 ? f.V - 37 : f.V;  // vocab_limit below the row too
    SCOPED_TRACE(testing::Message() << "step " << step << " k " << k << " mask kind " << int(kind) << " words " << words
                                    << " limit " << limit);
    const std::vector<uint64_t> mask = make_mask(kind, f.V, words, rng);
    // The whole row of the step after `token`, selected on the host among the allowed ids.
    const std::vector<TokenLogit> want = test::select_candidates(row, k, limit, mask);
    int fills = 0;
    AllowedTokens allowed{words, [&](std::span<uint64_t> m) {
                            ++fills;
                            ASSERT_EQ(m.size(), words);
                            std::copy(mask.begin(), mask.end(), m.begin());
                          }};
    std::vector<TokenLogit> got{{-1, 0.0f}};  // poisoned: must be replaced
    ASSERT_TRUE(f.gpu->forward_candidates(*picked, token, k, limit, &allowed, got));
    EXPECT_EQ(fills, 1);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token, want[i].token) << "rank " << i;
      EXPECT_EQ(got[i].logit, want[i].logit) << "rank " << i;
    }
    if (kind == MaskKind::none) {
      EXPECT_TRUE(got.empty());
    }
    if (kind == MaskKind::one) {
      EXPECT_LE(got.size(), 1u);
    }
    // The next token: the best allowed one, else the row's best (both sequences take it).
    ASSERT_EQ(picked->length(), whole->length());
    token = want.empty() ? test::select_candidates(row, 1, f.V)[0].token : want[0].token;
    f.gpu->forward(*whole, std::span<const int32_t>(&token, 1), LogitsWanted::last, row);
  }
}

// A fill that throws: the step was launched before it, so the state has the token (its length
// counts it) and the sequence goes on as the whole-row one does.
TEST(CudaMaskedCandidates, AFillThatThrowsLeavesTheStateConsistent) {
  REQUIRE_GPU();
  Fixture f;
  auto whole = f.gpu->new_sequence(256), picked = f.gpu->new_sequence(256);
  std::vector<float> row;
  f.gpu->forward(*whole, f.prompt, LogitsWanted::none, row);
  f.gpu->forward(*picked, f.prompt, LogitsWanted::none, row);
  const size_t words = (size_t(f.V) + 63) / 64;
  AllowedTokens throws{words, [](std::span<uint64_t>) { throw std::runtime_error("grammar failed"); }};
  std::vector<TokenLogit> out;
  EXPECT_THROW(f.gpu->forward_candidates(*picked, 7, 20, f.V, &throws, out), std::runtime_error);
  EXPECT_EQ(picked->length(), int64_t(f.prompt.size()) + 1);
  const int32_t seven = 7, nine = 9;
  f.gpu->forward(*whole, std::span(&seven, 1), LogitsWanted::none, row);
  f.gpu->forward(*whole, std::span(&nine, 1), LogitsWanted::last, row);
  AllowedTokens all{words, [](std::span<uint64_t> m) { std::fill(m.begin(), m.end(), ~uint64_t(0)); }};
  ASSERT_TRUE(f.gpu->forward_candidates(*picked, nine, 20, f.V, &all, out));
  const auto want = test::select_candidates(row, 20, f.V);
  ASSERT_EQ(out.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out[i].token, want[i].token) << "rank " << i;
}

// A mask that does not cover the ids selected over is refused before the step: nothing fed.
TEST(CudaMaskedCandidates, AShortMaskIsRefusedBeforeTheStep) {
  REQUIRE_GPU();
  Fixture f;
  auto s = f.gpu->new_sequence(64);
  std::vector<float> row;
  f.gpu->forward(*s, f.prompt, LogitsWanted::none, row);
  int fills = 0;
  AllowedTokens short_mask{(size_t(f.V) + 63) / 64 - 1, [&](std::span<uint64_t>) { ++fills; }};
  std::vector<TokenLogit> out;
  EXPECT_THROW(f.gpu->forward_candidates(*s, 7, 20, f.V, &short_mask, out), Error);
  EXPECT_EQ(fills, 0);
  EXPECT_EQ(s->length(), int64_t(f.prompt.size()));
}

}  // namespace
}  // namespace lily
