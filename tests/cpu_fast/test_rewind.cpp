// SequenceState::keep_row_states / rewind (backend.h) on both CPU backends (their shared
// cpu::CpuSequenceState), on the golden fixture tiny-a (hf-fused bf16: the reference layers and
// the fast path's dequantizing products; mlx-q4: the fast integer kernels):
//   a verify of T = 1..9 rows kept, rewound to each length it passed through, then the next
//   token's logits against a fresh sequence fed the same first L tokens (bit for bit on the fast
//   backend where the fresh one runs the same products, else within 1e-3 of max |logit|; within
//   1e-4 on the reference, whose kept rows run the recurrent form of the delta rule instead of
//   the chunked one); after prompts of 63, 64 and 65 tokens; across
//   the backend's 256-token blocks; a second, shorter rewind; clone / snapshot / restore after a
//   rewind; the refusals (no keep, a length the call did not pass, a longer second rewind, a
//   forward in between, an MTP length past the cache's) changing nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily {
namespace {

struct Case {
  const char* backend;  // "reference" | "fast"
  const char* layout;   // under tiny-a
};

std::unique_ptr<Backend> make(const char* backend, std::shared_ptr<const ModelWeights> w) {
  return std::string(backend) == "fast" ? make_cpu_fast_backend(std::move(w)) : make_cpu_backend(std::move(w));
}

// max |a - b| / max |b| (infinite for a NaN or different sizes).
double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return d / m;
}

class Rewind : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    weights_ = load_model(test::fixture_dir("tiny-a") + "/" + GetParam().layout);
    backend_ = make(GetParam().backend, weights_);
    const int64_t V = weights_->config.vocab_size;
    for (int64_t i = 0; i < 400; ++i) ids_.push_back(int32_t((i * 7919 + 13) % V));
  }
  bool fast() const { return std::string(GetParam().backend) == "fast"; }

  std::span<const int32_t> ids(int64_t from, int64_t n) const {
    return std::span<const int32_t>(ids_).subspan(size_t(from), size_t(n));
  }

  // The next token's logits (ids_[length]) through a copy of `seq`, which stays as it is.
  std::vector<float> next_logits(const SequenceState& seq) {
    auto copy = seq.clone();
    std::vector<float> logits(7, NAN);  // poisoned: forward sizes and fills it
    backend_->forward(*copy, ids(copy->length(), 1), LogitsWanted::last, logits);
    return logits;
  }

  // A fresh sequence fed ids [0, P) then [P, L) (two forwards, as the verify's sequence was).
  std::unique_ptr<SequenceState> fresh(int64_t P, int64_t L) {
    auto seq = backend_->new_sequence(1024);
    std::vector<float> ignored;
    if (P > 0) backend_->forward(*seq, ids(0, P), LogitsWanted::none, ignored);
    if (L > P) backend_->forward(*seq, ids(P, L - P), LogitsWanted::none, ignored);
    return seq;
  }

  // ids [0, P), then a verify of ids [P, P + T) keeping `rows`; its logits into `logits`.
  std::unique_ptr<SequenceState> verified(int64_t P, int64_t T, int rows, std::vector<float>* logits = nullptr) {
    auto seq = backend_->new_sequence(1024);
    std::vector<float> out;
    if (P > 0) backend_->forward(*seq, ids(0, P), LogitsWanted::none, out);
    EXPECT_TRUE(seq->keep_row_states(rows));
    backend_->forward(*seq, ids(P, T), LogitsWanted::all, logits ? *logits : out);
    return seq;
  }

  // The next logits after a rewind against a fresh sequence of the same tokens. Bit for bit on
  // the fast backend where the fresh sequence ran the kept tokens as a block too (two or more:
  // the same products, per token); one token is a decode step there, whose GEMV sums in another
  // order than the block's GEMM (1.1e-4 measured on hf-fused).
  void expect_like_fresh(const SequenceState& seq, int64_t P, const std::string& what) {
    const std::vector<float> got = next_logits(seq), want = next_logits(*fresh(P, seq.length()));
    const double d = relative_diff(got, want);
    if (fast() && seq.length() - P >= 2) {
      EXPECT_EQ(d, 0) << what << ": not bit for bit";
    }
    EXPECT_LE(d, fast() ? 1e-3 : 1e-4) << what;
  }

  std::shared_ptr<ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
  std::vector<int32_t> ids_;
};

TEST_P(Rewind, EachLengthOfAVerifyOfOneToNineRows) {
  const int64_t P = 5;
  for (int64_t T = 1; T <= 9; ++T)
    for (int64_t L = P + 1; L <= P + T; ++L) {
      auto seq = verified(P, T, int(T));
      ASSERT_TRUE(seq->rewind(L, 0)) << "T " << T << " L " << L;
      EXPECT_EQ(seq->length(), L);
      expect_like_fresh(*seq, P, "T " + std::to_string(T) + ", rewound to " + std::to_string(L));
    }
}

TEST_P(Rewind, AfterPromptsAroundSixtyFourTokens) {
  for (int64_t P : {63, 64, 65})
    for (int64_t T : {1, 4, 9})
      for (int64_t L = P + 1; L <= P + T; ++L) {
        auto seq = verified(P, T, int(T));
        ASSERT_TRUE(seq->rewind(L, 0));
        expect_like_fresh(*seq, P, "P " + std::to_string(P) + ", T " + std::to_string(T) + ", L " + std::to_string(L));
      }
}

// A verify of 260 tokens keeping 6: the backends' 256-token blocks leave 4 rows to the last one,
// so they move its start to hold the 6.
TEST_P(Rewind, KeptRowsAcrossTheBlocksOfALongCall) {
  const int64_t T = 260;
  for (int64_t L : {255, 257, 259, 260}) {
    auto seq = verified(0, T, 6);
    ASSERT_TRUE(seq->rewind(L, 0)) << L;
    expect_like_fresh(*seq, 0, "260 rows, rewound to " + std::to_string(L));
  }
  auto seq = verified(0, T, 6);
  EXPECT_FALSE(seq->rewind(254, 0)) << "before the first kept row";
}

// Keeping rows changes none of the forward's logits on the fast backend (its delta rule is token
// by token either way); on the reference, within rounding.
TEST_P(Rewind, KeepingChangesNoLogits) {
  for (int64_t T : {1, 2, 9}) {
    std::vector<float> kept, plain;
    verified(7, T, int(T), &kept);
    auto seq = fresh(7, 7);
    backend_->forward(*seq, ids(7, T), LogitsWanted::all, plain);
    if (fast()) {
      EXPECT_EQ(kept, plain) << T;
    }
    EXPECT_LE(relative_diff(kept, plain), 1e-4) << T;
  }
}

// Rewinds one after another, each shorter (a second rewind the kept rows still serve); a clone,
// a snapshot and its restore of a rewound state.
TEST_P(Rewind, ShorterRewindsThenCloneSnapshotRestore) {
  const int64_t P = 10, T = 8;
  auto seq = verified(P, T, int(T));
  for (int64_t L = P + T; L > P; --L) {
    ASSERT_TRUE(seq->rewind(L, 0)) << L;
    expect_like_fresh(*seq, P, "successive rewinds, at " + std::to_string(L));
  }
  EXPECT_FALSE(seq->rewind(P + 2, 0)) << "past the length of the last rewind";
  EXPECT_EQ(seq->length(), P + 1);

  auto copy = seq->clone();
  EXPECT_FALSE(copy->rewind(P + 1, 0)) << "a clone keeps no rows";
  expect_like_fresh(*copy, P, "clone after a rewind");
  auto snap = seq->snapshot();
  std::vector<float> ignored;
  backend_->forward(*seq, ids(P + 1, 5), LogitsWanted::none, ignored);
  seq->restore(*snap);
  EXPECT_EQ(seq->length(), P + 1);
  EXPECT_FALSE(seq->rewind(P + 1, 0)) << "a restore forgets the kept rows";
  expect_like_fresh(*seq, P, "snapshot restored after a rewind");
}

// A refused rewind returns false and changes nothing: the length, the memory and the next logits.
TEST_P(Rewind, RefusalsChangeNothing) {
  const int64_t P = 6, T = 4;
  auto check_refused = [&](SequenceState& seq, int64_t length, int64_t mtp_length, const std::string& what) {
    const int64_t before = seq.length();
    const uint64_t bytes = seq.memory_bytes();
    const std::vector<float> logits = next_logits(seq);
    EXPECT_FALSE(seq.rewind(length, mtp_length)) << what;
    EXPECT_EQ(seq.length(), before) << what;
    EXPECT_EQ(seq.memory_bytes(), bytes) << what;
    EXPECT_EQ(next_logits(seq), logits) << what;
  };
  auto plain = fresh(P, P + T);
  check_refused(*plain, P + 2, 0, "a call without keep_row_states");
  auto seq = verified(P, T, int(T));
  check_refused(*seq, P, 0, "the length before the call");
  check_refused(*seq, P + T + 1, 0, "past the call");
  check_refused(*seq, P + 2, 1, "an MTP length past the cache's 0");
  check_refused(*seq, P + 2, -1, "a negative MTP length");
  ASSERT_TRUE(seq->rewind(P + 2, 0));
  check_refused(*seq, P + 3, 0, "longer than the rewind before");
  std::vector<float> ignored;
  backend_->forward(*seq, ids(P + 2, 1), LogitsWanted::none, ignored);
  check_refused(*seq, P + 2, 0, "after a forward");
  // Fewer rows kept than the call's: only its last ones.
  auto few = verified(P, T, 2);
  check_refused(*few, P + 1, 0, "before the kept rows");
  ASSERT_TRUE(few->rewind(P + T - 1, 0));
  expect_like_fresh(*few, P, "two of four rows kept");
  // More rows asked than the call has: all of them.
  auto more = verified(P, 3, 9);
  ASSERT_TRUE(more->rewind(P + 1, 0));
  expect_like_fresh(*more, P, "nine asked, three run");
  EXPECT_FALSE(more->keep_row_states(0));
  EXPECT_FALSE(more->keep_row_states(65));
}

// A batch step (forward_batch: one row of each sequence) uses the keep up: its one row's states
// are the live ones, so only its own length can be rewound to, and the keep holds no further.
TEST_P(Rewind, ABatchStepKeepsItsOneRow) {
  auto a = fresh(9, 9), b = fresh(4, 4);
  ASSERT_TRUE(a->keep_row_states(3));
  SequenceState* states[2] = {a.get(), b.get()};
  const int32_t tokens[2] = {ids_[9], ids_[4]};
  std::vector<float> logits;
  backend_->forward_batch(states, tokens, logits);
  EXPECT_FALSE(a->rewind(9, 0)) << "before the step's one row";
  EXPECT_FALSE(b->rewind(5, 0)) << "no keep asked";
  EXPECT_TRUE(a->rewind(10, 0));
  backend_->forward(*a, ids(10, 2), LogitsWanted::none, logits);
  EXPECT_FALSE(a->rewind(11, 0)) << "the keep held for the batch step only";
  expect_like_fresh(*a, 9, "after a batch step");
}

// rewind cuts the MTP cache to its mtp_length: the head's next step then equals that of a
// sequence whose cache was cut by a restore to the same length.
TEST_P(Rewind, CutsTheMtpCache) {
  if (!backend_->has_mtp()) GTEST_SKIP() << backend_->mtp_unavailable();
  const int64_t P = 12, T = 4, H = weights_->config.hidden_size;
  auto seq = backend_->new_sequence(1024);
  std::vector<float> logits, hidden, mtp_logits, m;
  backend_->forward_hidden(*seq, ids(0, P), LogitsWanted::none, logits, LogitsWanted::all, hidden);
  backend_->forward_mtp(*seq, std::span<const float>(hidden).first(size_t((P - 1) * H)), ids(1, P - 1),
                        LogitsWanted::none, mtp_logits, m);
  auto at_prompt = seq->snapshot();  // the head at P - 1
  auto copy = seq->clone();
  ASSERT_TRUE(seq->keep_row_states(int(T)));
  backend_->forward_hidden(*seq, ids(P, T), LogitsWanted::all, logits, LogitsWanted::all, hidden);
  backend_->forward_mtp(*seq, hidden, ids(P + 1, T), LogitsWanted::none, mtp_logits, m);  // drafts' rows
  EXPECT_EQ(seq->mtp_length(), P - 1 + T);
  EXPECT_FALSE(seq->rewind(P + 2, P + T)) << "an MTP length past the cache's";
  ASSERT_TRUE(seq->rewind(P + 2, P + 1));
  EXPECT_EQ(seq->mtp_length(), P + 1);
  // The copy: the first two verify tokens and their head rows, the long way.
  backend_->forward_hidden(*copy, ids(P, 2), LogitsWanted::none, logits, LogitsWanted::all, hidden);
  backend_->forward_mtp(*copy, hidden, ids(P + 1, 2), LogitsWanted::none, mtp_logits, m);
  const std::vector<float> h(size_t(H), 0.25f);
  std::vector<float> got, want;
  const int32_t token = 3;
  backend_->forward_mtp(*seq, h, std::span<const int32_t>(&token, 1), LogitsWanted::last, got, m);
  backend_->forward_mtp(*copy, h, std::span<const int32_t>(&token, 1), LogitsWanted::last, want, m);
  EXPECT_LE(relative_diff(got, want), 1e-5);
  seq->restore(*at_prompt);
  EXPECT_EQ(seq->mtp_length(), P - 1);
}

// The kept rows' buffers are counted, allocated for the most rows asked, reused, and freed by
// reset().
TEST_P(Rewind, MemoryCountsTheKeptStates) {
  auto seq = backend_->new_sequence(1024);
  const uint64_t empty = seq->memory_bytes();
  const ModelConfig& c = weights_->config;
  const uint64_t deltanet_layers = uint64_t(
      std::count(c.layer_types.begin(), c.layer_types.end(), LayerKind::linear_attention));
  const uint64_t ssm = uint64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  const uint64_t conv_row = uint64_t(c.linear_conv_dim()) * 4;
  ASSERT_TRUE(seq->keep_row_states(5));  // 4 states kept (the last row's are the live ones)
  const uint64_t kept = deltanet_layers * (4 * ssm + (4 + c.linear_conv_kernel_dim - 2) * conv_row);
  EXPECT_EQ(seq->memory_bytes(), empty + kept);
  ASSERT_TRUE(seq->keep_row_states(3));
  EXPECT_EQ(seq->memory_bytes(), empty + kept) << "fewer rows reuse the buffers";
  seq->reset();
  EXPECT_EQ(seq->memory_bytes(), empty);
}

INSTANTIATE_TEST_SUITE_P(Backends, Rewind,
                         ::testing::Values(Case{"reference", "hf-fused"}, Case{"fast", "hf-fused"},
                                           Case{"fast", "mlx-q4"}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.backend) + "_" + info.param.layout;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace lily
