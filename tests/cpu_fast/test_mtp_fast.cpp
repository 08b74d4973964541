// The MTP head on the fast CPU backend (forward_hidden, forward_mtp; mtp_fast.h) against the
// reference backend's, on the golden fixture tiny-a in every layout that carries mtp.* (hf-fused,
// hf-per-expert, hf-fused quantized at load, mlx-q4 with the head from hf-fused), with today's
// fast-vs-reference bar (test_backend.cpp): logits within 1e-2 of max |reference| and the same
// argmax at >= 99% of rows:
//   forward_hidden's logits and post-norm rows; the head teacher-forced over a prompt in calls of
//   1, 2, 3 and 8 rows (the decode-step layers for one row, the prefill layers for more), then
//   chained drafts feeding m back; poisoned output buffers; its cache through clone / snapshot /
//   restore / reset (bit for bit against a fresh sequence of the same backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily {
namespace {

struct Case {
  const char* layout;   // under tiny-a
  const char* mtp_dir;  // LoadOptions::mtp_dir under tiny-a ("" for the model's own)
  int quantize_bits;    // LoadOptions::quantize_bits
  const char* name;
};

struct Bar {
  double max_abs_diff = 0, max_abs_ref = 0;
  int64_t rows = 0, argmax_mismatches = 0;

  void add(const std::vector<float>& got, const std::vector<float>& want, int64_t width) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      max_abs_diff = std::max(max_abs_diff, std::isfinite(got[i]) ? double(std::fabs(got[i] - want[i])) : INFINITY);
      max_abs_ref = std::max(max_abs_ref, double(std::fabs(want[i])));
    }
    for (int64_t r = 0; r < int64_t(got.size()) / width; ++r) {
      auto row = [&](const std::vector<float>& v) { return v.begin() + r * width; };
      argmax_mismatches += (std::max_element(row(got), row(got) + width) - row(got)) !=
                           (std::max_element(row(want), row(want) + width) - row(want));
      ++rows;
    }
  }
  void expect(const std::string& what, bool argmax = true) const {
    std::printf("[%s] max |diff| = %.3g, max |ref| = %.3g, relative %.3g, argmax mismatches %lld of %lld\n",
                what.c_str(), max_abs_diff, max_abs_ref, max_abs_diff / max_abs_ref, (long long)argmax_mismatches,
                (long long)rows);
    EXPECT_GT(rows, 0) << what;
    EXPECT_LE(max_abs_diff, 1e-2 * max_abs_ref) << what;
    if (argmax) {
      EXPECT_LE(double(argmax_mismatches), 0.01 * double(rows)) << what;
    }
  }
};

class FastMtp : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string dir = test::fixture_dir("tiny-a");
    LoadOptions options;
    if (*GetParam().mtp_dir) options.mtp_dir = dir + "/" + GetParam().mtp_dir;
    options.quantize_bits = GetParam().quantize_bits;
    weights_ = load_model(dir + "/" + GetParam().layout, options);
    fast_ = make_cpu_fast_backend(weights_);
    reference_ = make_cpu_backend(weights_);
    ids_ = test::read_json(dir + "/reference.json")["ids"].get<std::vector<int32_t>>();
    ids_.resize(40);
    H_ = weights_->config.hidden_size;
    V_ = weights_->config.vocab_size;
  }

  std::span<const float> rows(const std::vector<float>& v, int64_t width, int64_t first, int64_t n) const {
    return std::span<const float>(v).subspan(size_t(first * width), size_t(n * width));
  }

  std::shared_ptr<ModelWeights> weights_;
  std::unique_ptr<Backend> fast_, reference_;
  std::vector<int32_t> ids_;
  int64_t H_ = 0, V_ = 0;
};

TEST_P(FastMtp, HasTheHead) { EXPECT_TRUE(fast_->has_mtp()) << fast_->mtp_unavailable(); }

// forward_hidden: the logits of forward and the rows after the final norm, as the reference's.
TEST_P(FastMtp, ForwardHiddenMatchesReference) {
  for (int64_t T : {1, 2, 40}) {
    std::vector<float> logits[2], hidden[2];
    Backend* backends[2] = {fast_.get(), reference_.get()};
    for (int b = 0; b < 2; ++b) {
      auto seq = backends[b]->new_sequence(64);
      logits[b].assign(3, NAN);  // poisoned: sized and filled by the call
      hidden[b].assign(5, NAN);
      backends[b]->forward_hidden(*seq, std::span<const int32_t>(ids_).first(size_t(T)), LogitsWanted::all, logits[b],
                                  LogitsWanted::all, hidden[b]);
      EXPECT_EQ(seq->length(), T);
    }
    Bar l, h;
    l.add(logits[0], logits[1], V_);
    h.add(hidden[0], hidden[1], H_);
    l.expect(std::string(GetParam().name) + " forward_hidden logits, T " + std::to_string(T));
    h.expect(std::string(GetParam().name) + " forward_hidden rows, T " + std::to_string(T), false);
    // Only the last row of each, and neither.
    auto seq = fast_->new_sequence(64);
    std::vector<float> last_logits, last_hidden;
    fast_->forward_hidden(*seq, std::span<const int32_t>(ids_).first(size_t(T)), LogitsWanted::none, last_logits,
                          LogitsWanted::last, last_hidden);
    EXPECT_TRUE(last_logits.empty());
    const std::span<const float> want = rows(hidden[0], H_, T - 1, 1);
    EXPECT_TRUE(std::equal(last_hidden.begin(), last_hidden.end(), want.begin(), want.end())) << T;
  }
}

// The head over the prompt, teacher-forced (hidden row i with ids[i+1]), in calls of `per_call`
// rows, then 8 chained drafts each feeding its m back; the same hidden rows (the reference's) into
// both, so the head alone is compared.
TEST_P(FastMtp, TeacherForcedThenChainedMatchReference) {
  const int64_t P = int64_t(ids_.size());
  std::vector<float> prompt_logits, hidden;
  auto ref_main = reference_->new_sequence(64);
  reference_->forward_hidden(*ref_main, ids_, LogitsWanted::none, prompt_logits, LogitsWanted::all, hidden);
  for (int64_t per_call : {1, 2, 3, 8}) {
    const std::string what = std::string(GetParam().name) + ", " + std::to_string(per_call) + " rows a call";
    Backend* backends[2] = {fast_.get(), reference_.get()};
    std::vector<float> forced[2], chained[2], last_m[2];
    for (int b = 0; b < 2; ++b) {
      auto seq = backends[b]->new_sequence(64);
      std::vector<float> logits(11, NAN), m(13, NAN);  // poisoned
      for (int64_t r = 0; r < P - 1; r += per_call) {
        const int64_t n = std::min(per_call, P - 1 - r);
        backends[b]->forward_mtp(*seq, rows(hidden, H_, r, n),
                                 std::span<const int32_t>(ids_).subspan(size_t(r + 1), size_t(n)), LogitsWanted::all,
                                 logits, m);
        ASSERT_EQ(int64_t(logits.size()), n * V_);
        ASSERT_EQ(int64_t(m.size()), n * H_);
        forced[b].insert(forced[b].end(), logits.begin(), logits.end());
        last_m[b] = m;
      }
      EXPECT_EQ(seq->mtp_length(), P - 1);
      EXPECT_EQ(seq->length(), 0) << "the head leaves the main model's length alone";
      std::vector<float> h(rows(hidden, H_, P - 1, 1).begin(), rows(hidden, H_, P - 1, 1).end());
      int32_t token = ids_[size_t(P - 1)];
      for (int step = 0; step < 8; ++step) {
        backends[b]->forward_mtp(*seq, h, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits, m);
        chained[b].insert(chained[b].end(), logits.begin(), logits.end());
        token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()) % int32_t(V_);
        h = m;
      }
      EXPECT_EQ(seq->mtp_length(), P - 1 + 8);
    }
    Bar f, c, m;
    f.add(forced[0], forced[1], V_);
    c.add(chained[0], chained[1], V_);
    m.add(last_m[0], last_m[1], H_);
    f.expect(what + ": teacher-forced logits");
    c.expect(what + ": chained logits");
    m.expect(what + ": the last call's m", false);
  }
}

// The fast backend's own run: prompt, the head over it, 3 chained steps (the tokens fixed).
std::vector<std::vector<float>> fast_chain(Backend& fast, SequenceState& seq, std::span<const float> h0) {
  std::vector<std::vector<float>> out;
  std::vector<float> h(h0.begin(), h0.end()), logits, m;
  for (int32_t token : {11, 12, 13}) {
    fast.forward_mtp(seq, h, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits, m);
    out.push_back(logits);
    h = m;
  }
  return out;
}

TEST_P(FastMtp, CacheFollowsCloneSnapshotRestoreReset) {
  const int64_t n = 30;
  const std::span<const int32_t> prompt = std::span<const int32_t>(ids_).first(size_t(n));
  std::vector<float> logits, hidden, mtp_logits, m;
  auto prefill = [&](SequenceState& seq) {
    fast_->forward_hidden(seq, prompt, LogitsWanted::none, logits, LogitsWanted::all, hidden);
    fast_->forward_mtp(seq, rows(hidden, H_, 0, n - 1), prompt.subspan(1), LogitsWanted::none, mtp_logits, m);
  };
  auto fresh = fast_->new_sequence(64);
  prefill(*fresh);
  const std::vector<float> last(rows(hidden, H_, n - 1, 1).begin(), rows(hidden, H_, n - 1, 1).end());
  const auto want = fast_chain(*fast_, *fresh, last);

  auto seq = fast_->new_sequence(64);
  prefill(*seq);
  auto copy = seq->clone();
  EXPECT_EQ(copy->mtp_length(), n - 1);
  EXPECT_EQ(fast_chain(*fast_, *copy, last), want) << "the clone carries the head's cache";
  auto snap = seq->snapshot();
  fast_chain(*fast_, *seq, last);
  EXPECT_EQ(seq->mtp_length(), n - 1 + 3);
  seq->restore(*snap);
  EXPECT_EQ(seq->mtp_length(), n - 1);
  EXPECT_EQ(fast_chain(*fast_, *seq, last), want) << "restore cuts the head's cache";
  seq->reset();
  EXPECT_EQ(seq->mtp_length(), 0);
  prefill(*seq);
  EXPECT_EQ(fast_chain(*fast_, *seq, last), want) << "reset empties it";
}

TEST_P(FastMtp, BadArgumentsAreRefusedBeforeAnythingChanges) {
  auto seq = fast_->new_sequence(8);
  std::vector<float> logits, m, hidden(size_t(3 * H_), 0.f);
  const int32_t tokens[3] = {1, 2, 3}, bad[3] = {1, int32_t(V_), 3};
  auto error_of = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string err = error_of(
      [&] { fast_->forward_mtp(*seq, rows(hidden, H_, 0, 2), tokens, LogitsWanted::all, logits, m); });
  EXPECT_NE(err.find("forward_mtp: 256 hidden values for 3 tokens; expected [3, 128]"), std::string::npos) << err;
  err = error_of([&] { fast_->forward_mtp(*seq, hidden, bad, LogitsWanted::all, logits, m); });
  EXPECT_NE(err.find("token id 384 is outside the vocabulary [0, 384)"), std::string::npos) << err;
  std::vector<float> nine(size_t(9 * H_), 0.f);
  std::vector<int32_t> nine_tokens(9, 1);
  err = error_of([&] { fast_->forward_mtp(*seq, nine, nine_tokens, LogitsWanted::all, logits, m); });
  EXPECT_NE(err.find("the MTP cache of 0 positions plus 9 new ones exceeds the sequence's capacity of 8"),
            std::string::npos)
      << err;
  EXPECT_EQ(seq->mtp_length(), 0);
  EXPECT_EQ(seq->length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FastMtp,
                         ::testing::Values(Case{"hf-fused", "", 0, "hf_fused"},
                                           Case{"hf-per-expert", "", 0, "hf_per_expert"},
                                           Case{"hf-fused", "", 4, "hf_fused_q4"},
                                           Case{"mlx-q4", "hf-fused", 0, "mlx_q4_mtp_from_hf"}),
                         [](const auto& info) { return std::string(info.param.name); });

// Without mtp.* the fast backend says why, as the reference does, and runs the main model.
TEST(FastMtpUnavailable, AModelWithoutTheHeadSaysSo) {
  const std::string dir = test::fixture_dir("tiny-a") + "/mlx-q4";
  auto fast = make_cpu_fast_backend(load_model(dir));
  EXPECT_FALSE(fast->has_mtp());
  EXPECT_NE(fast->mtp_unavailable().find("the model has no MTP head: " + dir + " has no mtp.* tensors"),
            std::string::npos)
      << fast->mtp_unavailable();
  auto seq = fast->new_sequence(8);
  std::vector<float> logits, m, hidden(size_t(fast->config().hidden_size), 0.f);
  const int32_t token = 1;
  try {
    fast->forward_mtp(*seq, hidden, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits, m);
    ADD_FAILURE() << "forward_mtp ran without the head";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), fast->mtp_unavailable());
  }
  fast->forward_hidden(*seq, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits, LogitsWanted::last,
                       hidden);
  EXPECT_EQ(seq->length(), 1);
  EXPECT_EQ(seq->mtp_length(), 0);
}

}  // namespace
}  // namespace lily
