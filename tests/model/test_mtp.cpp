// The MTP head in the CPU reference backend (spec §6, backend.h's forward_hidden / forward_mtp):
// its pieces against hand computations on tiny weights, the hidden rows it takes (after the final
// norm), its KV cache through clone / snapshot / restore / reset, a model or backend without it,
// and its logits against the PyTorch reference of tools/mtp_reference.py when that file exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "base/error.h"
#include "fixture.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily {
namespace {

const std::string kTiny = test::fixture_dir("tiny-a");

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// max |a - b| (infinite when a NaN is in either, or the sizes differ).
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    m = std::max(m, double(std::fabs(a[i] - b[i])));
  }
  return m;
}

std::vector<float> rows(const std::vector<float>& v, int64_t width, int64_t first, int64_t n) {
  return {v.begin() + first * width, v.begin() + (first + n) * width};
}

// ---- The pieces against hand computations on tiny hand-made weights ----------------------

// A model of hidden size 4 whose MTP head the test builds by hand: f32 matrices over vectors
// the struct owns. Its decoder layer adds nothing when `identity_layer` (o_proj and every down
// projection zero), so that m = RMSNorm_zc(u; norm) by hand.
struct HandMtp {
  static constexpr int64_t H = 4, V = 5;
  ModelConfig c;
  MtpWeights w;
  Matrix embed;
  std::vector<std::vector<float>> store;  // the matrices' values

  explicit HandMtp(bool identity_layer, uint32_t seed = 7) {
    c.hidden_size = int(H);
    c.vocab_size = int(V);
    c.num_attention_heads = 1;
    c.num_key_value_heads = 1;
    c.head_dim = 4;
    c.rotary_dim = 2;
    c.rope_theta = 1e4f;
    c.rms_norm_eps = 1e-6f;
    c.num_experts = 2;
    c.num_experts_per_tok = 1;
    c.moe_intermediate_size = 2;
    c.shared_expert_intermediate_size = 2;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    auto matrix = [&](int64_t rows, int64_t cols, bool zero = false) {
      store.emplace_back(size_t(rows * cols));
      for (float& x : store.back()) x = zero ? 0.f : normal(rng) / std::sqrt(float(cols));
      Matrix m;
      m.rows = rows, m.cols = cols, m.format = MatrixFormat::f32, m.data = store.back().data();
      return m;
    };
    auto gain = [&](int64_t n) {
      std::vector<float> g(static_cast<size_t>(n));
      for (float& x : g) x = 1.f + 0.3f * normal(rng);
      return g;
    };
    store.reserve(64);  // the views point into it
    embed = matrix(V, H);
    w.fc = matrix(H, 2 * H);
    w.pre_fc_norm_embedding = gain(H);
    w.pre_fc_norm_hidden = gain(H);
    w.norm = gain(H);
    LayerWeights& l = w.layer;
    l.kind = LayerKind::full_attention;
    l.input_layernorm = gain(H);
    l.post_attention_layernorm = gain(H);
    l.attention.q_proj = matrix(2 * 4, H);
    l.attention.k_proj = matrix(4, H);
    l.attention.v_proj = matrix(4, H);
    l.attention.o_proj = matrix(H, 4, identity_layer);
    l.attention.q_norm = gain(4);
    l.attention.k_norm = gain(4);
    MoeWeights& m = l.moe;
    m.router = matrix(2, H);
    for (int e = 0; e < 2; ++e) {
      m.experts.gate_proj.push_back(matrix(2, H));
      m.experts.up_proj.push_back(matrix(2, H));
      m.experts.down_proj.push_back(matrix(H, 2, identity_layer));
    }
    m.shared_gate_proj = matrix(2, H);
    m.shared_up_proj = matrix(2, H);
    m.shared_down_proj = matrix(H, 2, identity_layer);
    m.shared_expert_gate = matrix(1, H);
  }

  const float* matrix_values(const Matrix& m) const { return static_cast<const float*>(m.data); }
};

// x * rsqrt(mean(x^2) + eps) * gain, in double.
std::vector<double> hand_norm(const float* x, const std::vector<float>& gain, double eps = 1e-6) {
  const size_t n = gain.size();
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double inv = 1 / std::sqrt(ss / double(n) + eps);
  std::vector<double> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * gain[i];
  return y;
}

// fc @ input, fc: [H, 2H] row-major.
std::vector<double> hand_fc(const HandMtp& t, const std::vector<double>& input) {
  const float* fc = t.matrix_values(t.w.fc);
  std::vector<double> u(size_t(HandMtp::H), 0.0);
  for (int64_t r = 0; r < HandMtp::H; ++r)
    for (int64_t j = 0; j < 2 * HandMtp::H; ++j) u[size_t(r)] += double(fc[r * 2 * HandMtp::H + j]) * input[size_t(j)];
  return u;
}

// u = fc @ [RMSNorm_zc(E[x]; pre_fc_norm_embedding), RMSNorm_zc(h; pre_fc_norm_hidden)]:
// the embedding's half first. A head that put the hidden row first fails it.
TEST(MtpBlock, InputIsEmbeddingFirstThenHidden) {
  HandMtp t(/*identity_layer=*/false);
  const float hidden[2][4] = {{0.5f, -1.5f, 2.f, 0.25f}, {-0.3f, 0.9f, 0.1f, 1.2f}};
  const int32_t tokens[2] = {3, 1};
  std::vector<float> u(2 * 4, NAN);
  cpu::mtp_input(t.w, t.embed, t.c, &hidden[0][0], tokens, 2, u.data());
  for (int r = 0; r < 2; ++r) {
    const std::vector<double> e = hand_norm(t.matrix_values(t.embed) + tokens[r] * 4, t.w.pre_fc_norm_embedding);
    const std::vector<double> hh = hand_norm(hidden[r], t.w.pre_fc_norm_hidden);
    std::vector<double> e_then_h(e), h_then_e(hh);
    e_then_h.insert(e_then_h.end(), hh.begin(), hh.end());
    h_then_e.insert(h_then_e.end(), e.begin(), e.end());
    const std::vector<double> want = hand_fc(t, e_then_h), swapped = hand_fc(t, h_then_e);
    double diff = 0, swap_diff = 0;
    for (int i = 0; i < 4; ++i) {
      diff = std::max(diff, std::fabs(u[size_t(r * 4 + i)] - want[size_t(i)]));
      swap_diff = std::max(swap_diff, std::fabs(want[size_t(i)] - swapped[size_t(i)]));
    }
    EXPECT_LE(diff, 1e-5) << "row " << r;
    EXPECT_GE(swap_diff, 0.1) << "row " << r << ": the hand case cannot tell the order apart";
  }
}

// With a decoder layer that adds nothing, m = RMSNorm_zc(u; mtp.norm) of the hand u.
TEST(MtpBlock, OutputIsTheMtpNormOfTheLayersOutput) {
  HandMtp t(/*identity_layer=*/true);
  const float hidden[4] = {1.f, 2.f, -0.5f, 0.75f};
  const int32_t token = 4;
  std::vector<float> u(4), m(4, NAN);
  cpu::mtp_input(t.w, t.embed, t.c, hidden, &token, 1, u.data());
  cpu::AttentionCache cache;
  cpu::mtp_block(t.w, t.embed, t.c, cache, 0, hidden, &token, 1, m.data());
  const std::vector<double> want = hand_norm(u.data(), t.w.norm);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(m[size_t(i)], want[size_t(i)], 1e-5) << i;
  EXPECT_EQ(cache.k.size(), 4u) << "one K row of nkv x head_dim appended";
  EXPECT_EQ(cache.v.size(), 4u);
}

// The block runs at positions first_position + t over the rows its cache holds: three rows at
// once equal three rows one at a time (a block that ignored the position or the cache differs).
TEST(MtpBlock, RowsAtOnceEqualRowsOneByOne) {
  HandMtp t(/*identity_layer=*/false);
  const float hidden[3][4] = {{1.f, 2.f, -0.5f, 0.75f}, {0.2f, -1.f, 1.5f, 0.3f}, {-2.f, 0.4f, 0.6f, -0.1f}};
  const int32_t tokens[3] = {4, 0, 2};
  cpu::AttentionCache together, apart;
  std::vector<float> all(3 * 4, NAN), one(4, NAN), each;
  cpu::mtp_block(t.w, t.embed, t.c, together, 0, &hidden[0][0], tokens, 3, all.data());
  for (int r = 0; r < 3; ++r) {
    cpu::mtp_block(t.w, t.embed, t.c, apart, r, hidden[r], &tokens[r], 1, one.data());
    each.insert(each.end(), one.begin(), one.end());
  }
  EXPECT_LE(max_diff(all, each), 1e-5 * max_abs(all));
  EXPECT_EQ(together.k, apart.k);
}

// ---- On the tiny fixture (hf-fused: the published layout with mtp.*) ----------------------

// The model, its reference backend and a prompt: the first 48 of reference.json's ids (few, so
// that the tests stay quick under the sanitizers).
struct Fixture {
  std::shared_ptr<ModelWeights> weights;
  std::unique_ptr<Backend> backend;
  std::vector<int32_t> ids;  // [48]
  int64_t H = 0, V = 0;
};

Fixture load_fixture(const std::string& layout = "hf-fused", const LoadOptions& options = {}) {
  Fixture f;
  f.weights = load_model(kTiny + "/" + layout, options);
  f.backend = make_cpu_backend(f.weights);
  f.ids = test::read_json(kTiny + "/reference.json")["ids"].get<std::vector<int32_t>>();
  f.ids.resize(48);
  f.H = f.weights->config.hidden_size;
  f.V = f.weights->config.vocab_size;
  return f;
}

// The prompt `ids` through the main model, then MTP rows 0..T-2 (hidden row i with ids[i+1]):
// returns the head's logits [T-1, V]; `hidden` gets the post-norm rows [T, H].
std::vector<float> prefill_with_mtp(Fixture& f, SequenceState& seq, std::span<const int32_t> ids,
                                    std::vector<float>* hidden_out = nullptr) {
  std::vector<float> logits, hidden, mtp_logits, m;
  f.backend->forward_hidden(seq, ids, LogitsWanted::last, logits, LogitsWanted::all, hidden);
  const int64_t T = int64_t(ids.size());
  f.backend->forward_mtp(seq, std::span<const float>(hidden).first(size_t((T - 1) * f.H)), ids.subspan(1),
                         LogitsWanted::all, mtp_logits, m);
  if (hidden_out) *hidden_out = hidden;
  return mtp_logits;
}

// One chained step: the head's (logits, m) for hidden row `h` and `token`.
std::pair<std::vector<float>, std::vector<float>> mtp_step(Fixture& f, SequenceState& seq, std::span<const float> h,
                                                           int32_t token) {
  std::vector<float> logits, m;
  f.backend->forward_mtp(seq, h, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits, m);
  return {logits, m};
}

// The rows forward_hidden hands back are AFTER the final norm: they give the logits through
// lm_head alone, and divided by the norm's gain they have unit RMS. The rows before the norm
// fail both.
TEST(MtpBackend, HiddenRowsAreAfterTheFinalNorm) {
  Fixture f = load_fixture();
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> logits, hidden;
  f.backend->forward_hidden(*seq, f.ids, LogitsWanted::all, logits, LogitsWanted::all, hidden);
  const int64_t T = int64_t(f.ids.size());
  ASSERT_EQ(int64_t(hidden.size()), T * f.H);
  std::vector<float> through_head(size_t(T * f.V));
  cpu::linear(f.weights->lm_head, hidden.data(), T, through_head.data());
  EXPECT_LE(max_diff(through_head, logits), 1e-5 * max_abs(logits));
  const std::vector<float>& gain = f.weights->final_norm;
  for (int64_t t = 0; t < T; ++t) {
    double ms = 0;
    for (int64_t i = 0; i < f.H; ++i) ms += std::pow(double(hidden[size_t(t * f.H + i)]) / gain[size_t(i)], 2);
    ASSERT_NEAR(ms / double(f.H), 1.0, 1e-3) << "row " << t;
  }
}

TEST(MtpBackend, ForwardHiddenGivesForwardsLogitsAndItsRows) {
  Fixture f = load_fixture();
  auto a = f.backend->new_sequence(4096), b = f.backend->new_sequence(4096), c = f.backend->new_sequence(4096);
  std::vector<float> plain, logits, all, last_logits, last;
  f.backend->forward(*a, f.ids, LogitsWanted::all, plain);
  f.backend->forward_hidden(*b, f.ids, LogitsWanted::all, logits, LogitsWanted::all, all);
  EXPECT_EQ(plain, logits);
  f.backend->forward_hidden(*c, f.ids, LogitsWanted::none, last_logits, LogitsWanted::last, last);
  EXPECT_TRUE(last_logits.empty());
  EXPECT_EQ(last, rows(all, f.H, int64_t(f.ids.size()) - 1, 1));
  EXPECT_EQ(c->length(), int64_t(f.ids.size()));
  EXPECT_EQ(c->mtp_length(), 0) << "the main forward does not run the head";
}

// The head's logits are m @ lm_head^T, with m the row its chained next step takes.
TEST(MtpBackend, LogitsAreTheHeadsRowThroughLmHead) {
  Fixture f = load_fixture();
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> hidden;
  prefill_with_mtp(f, *seq, f.ids, &hidden);
  const int64_t T = int64_t(f.ids.size());
  auto [logits, m] = mtp_step(f, *seq, std::span<const float>(hidden).last(size_t(f.H)), 7);
  ASSERT_EQ(int64_t(m.size()), f.H);
  std::vector<float> through_head(size_t(f.V));
  cpu::linear(f.weights->lm_head, m.data(), 1, through_head.data());
  EXPECT_LE(max_diff(through_head, logits), 1e-5 * max_abs(logits));
  EXPECT_EQ(seq->mtp_length(), T);
  // The chained step: m back as the hidden row, at the next position.
  auto [next, m2] = mtp_step(f, *seq, m, 9);
  EXPECT_EQ(seq->mtp_length(), T + 1);
  EXPECT_GT(max_diff(next, logits), 1e-3);
}

// Rows appended in pieces (across the 256-row chunk of the backend) equal rows appended at once.
// The head needs no main-model rows beyond the hidden rows it is given: 300 rows made of the
// prompt's post-norm rows over and over.
TEST(MtpBackend, RowsInPiecesEqualRowsAtOnce) {
  Fixture f = load_fixture();
  auto main = f.backend->new_sequence(4096);
  std::vector<float> logits, prompt_hidden;
  f.backend->forward_hidden(*main, f.ids, LogitsWanted::none, logits, LogitsWanted::all, prompt_hidden);
  const int64_t T = 300, P = int64_t(f.ids.size());
  std::vector<float> hidden;
  std::vector<int32_t> tokens;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row = rows(prompt_hidden, f.H, t % P, 1);
    hidden.insert(hidden.end(), row.begin(), row.end());
    tokens.push_back(f.ids[size_t((t + 1) % P)]);
  }
  auto whole = f.backend->new_sequence(4096);
  std::vector<float> at_once, m;
  f.backend->forward_mtp(*whole, hidden, tokens, LogitsWanted::all, at_once, m);
  EXPECT_EQ(whole->mtp_length(), T);
  EXPECT_EQ(whole->length(), 0);

  auto pieces = f.backend->new_sequence(4096);
  std::vector<float> got;
  int64_t row = 0;
  for (int64_t n : {1, 62, 200, 1, 36}) {
    f.backend->forward_mtp(*pieces, std::span<const float>(hidden).subspan(size_t(row * f.H), size_t(n * f.H)),
                           std::span<const int32_t>(tokens).subspan(size_t(row), size_t(n)), LogitsWanted::all, logits,
                           m);
    got.insert(got.end(), logits.begin(), logits.end());
    row += n;
  }
  ASSERT_EQ(row, T);
  EXPECT_LE(max_diff(got, at_once), 1e-5 * max_abs(at_once));
}

// The fresh sequence every cache test compares against: the first n ids, the head over them,
// then a chain of three steps from the last hidden row with tokens 11, 12, 13.
struct MtpRun {
  std::vector<float> prefill;             // [n-1, V]
  std::vector<std::vector<float>> chain;  // 3 x [V]
};

MtpRun chain_after(Fixture& f, SequenceState& seq, const std::vector<float>& last_hidden) {
  MtpRun r;
  std::vector<float> h = last_hidden;
  for (int32_t token : {11, 12, 13}) {
    auto [logits, m] = mtp_step(f, seq, h, token);
    r.chain.push_back(logits);
    h = m;
  }
  return r;
}

MtpRun fresh_run(Fixture& f, int64_t n) {
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> hidden;
  MtpRun r;
  const std::vector<float> prefill = prefill_with_mtp(f, *seq, std::span<const int32_t>(f.ids).first(size_t(n)),
                                                      &hidden);
  r = chain_after(f, *seq, rows(hidden, f.H, n - 1, 1));
  r.prefill = prefill;
  return r;
}

TEST(MtpCache, FollowsClone) {
  Fixture f = load_fixture();
  const int64_t n = 30;
  const MtpRun want = fresh_run(f, n);
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> hidden;
  EXPECT_EQ(prefill_with_mtp(f, *seq, std::span<const int32_t>(f.ids).first(size_t(n)), &hidden), want.prefill);
  auto copy = seq->clone();
  EXPECT_EQ(copy->mtp_length(), n - 1);
  EXPECT_EQ(copy->memory_bytes(), seq->memory_bytes());
  const MtpRun from_copy = chain_after(f, *copy, rows(hidden, f.H, n - 1, 1));
  EXPECT_EQ(from_copy.chain, want.chain) << "the clone carries the head's cache";
  EXPECT_EQ(seq->mtp_length(), n - 1) << "the clone's steps leave the original alone";
  EXPECT_EQ(chain_after(f, *seq, rows(hidden, f.H, n - 1, 1)).chain, want.chain);
}

// A restore cuts the head's cache back to the snapshot's length: the head then gives what a
// fresh sequence fed the same tokens gives, bit for bit.
TEST(MtpCache, FollowsSnapshotAndRestore) {
  Fixture f = load_fixture();
  const int64_t n = 30;
  const MtpRun want = fresh_run(f, n);
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> hidden;
  prefill_with_mtp(f, *seq, std::span<const int32_t>(f.ids).first(size_t(n)), &hidden);
  const std::vector<float> last = rows(hidden, f.H, n - 1, 1);
  auto snap = seq->snapshot();
  const uint64_t bytes = seq->memory_bytes();
  // Diverge: a chain of drafts, then more tokens through the main model and the head.
  chain_after(f, *seq, last);
  prefill_with_mtp(f, *seq, std::span<const int32_t>(f.ids).subspan(size_t(n), 15));
  EXPECT_EQ(seq->mtp_length(), n - 1 + 3 + 14);
  seq->restore(*snap);
  EXPECT_EQ(seq->length(), n);
  EXPECT_EQ(seq->mtp_length(), n - 1);
  EXPECT_EQ(seq->memory_bytes(), bytes);
  EXPECT_EQ(chain_after(f, *seq, last).chain, want.chain);
}

TEST(MtpCache, RestorePastItsLengthIsRefused) {
  Fixture f = load_fixture();
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> logits, hidden, mtp_logits, m;
  const std::span<const int32_t> ids = std::span<const int32_t>(f.ids).first(40);
  f.backend->forward_hidden(*seq, ids, LogitsWanted::none, logits, LogitsWanted::all, hidden);
  auto before = seq->snapshot();  // the head at 0 positions
  f.backend->forward_mtp(*seq, std::span<const float>(hidden).first(size_t(39 * f.H)), ids.subspan(1),
                         LogitsWanted::none, mtp_logits, m);
  auto after = seq->snapshot();  // at 39
  seq->restore(*before);
  EXPECT_EQ(seq->mtp_length(), 0);
  const std::string err = error_of([&] { seq->restore(*after); });
  EXPECT_NE(err.find("restore: the snapshot's MTP cache at 39 positions is past this sequence's 0"), std::string::npos)
      << err;
  EXPECT_EQ(seq->length(), 40) << "a refused restore changes nothing";
  EXPECT_EQ(seq->mtp_length(), 0);
}

TEST(MtpCache, FollowsReset) {
  Fixture f = load_fixture();
  const int64_t n = 30;
  const MtpRun want = fresh_run(f, n);
  auto seq = f.backend->new_sequence(4096);
  prefill_with_mtp(f, *seq, std::span<const int32_t>(f.ids).subspan(10, 38));  // other tokens first
  const uint64_t empty_bytes = f.backend->new_sequence(4096)->memory_bytes();
  seq->reset();
  EXPECT_EQ(seq->mtp_length(), 0);
  EXPECT_EQ(seq->memory_bytes(), empty_bytes);
  std::vector<float> hidden;
  EXPECT_EQ(prefill_with_mtp(f, *seq, std::span<const int32_t>(f.ids).first(size_t(n)), &hidden), want.prefill);
  EXPECT_EQ(chain_after(f, *seq, rows(hidden, f.H, n - 1, 1)).chain, want.chain);
}

// spec §4: the head's KV is 2 x nkv x head_dim values a position (2 KB at bf16 for the model;
// the CPU backend keeps fp32).
TEST(MtpCache, MemoryGrowsByOneKvRowAPosition) {
  Fixture f = load_fixture();
  auto seq = f.backend->new_sequence(4096);
  std::vector<float> ignored;
  f.backend->forward(*seq, std::span<const int32_t>(f.ids).first(10), LogitsWanted::none, ignored);
  const uint64_t before = seq->memory_bytes();
  std::vector<float> hidden(size_t(4 * f.H), 0.5f), logits, m;
  f.backend->forward_mtp(*seq, hidden, std::span<const int32_t>(f.ids).first(4), LogitsWanted::none, logits, m);
  const ModelConfig& c = f.weights->config;
  EXPECT_EQ(seq->memory_bytes() - before, uint64_t(4 * 2 * c.num_key_value_heads * c.head_dim * 4));
  EXPECT_TRUE(logits.empty());
  EXPECT_TRUE(m.empty());
}

TEST(MtpBackend, BadArgumentsAreRefusedBeforeAnythingChanges) {
  Fixture f = load_fixture();
  auto seq = f.backend->new_sequence(8);
  std::vector<float> logits, m, hidden(size_t(3 * f.H), 0.f);
  const int32_t tokens[3] = {1, 2, 3};
  std::string err = error_of([&] {
    f.backend->forward_mtp(*seq, std::span<const float>(hidden).first(size_t(2 * f.H)), tokens, LogitsWanted::all,
                           logits, m);
  });
  EXPECT_NE(err.find("forward_mtp: 256 hidden values for 3 tokens; expected [3, 128]"), std::string::npos) << err;
  const int32_t bad[3] = {1, int32_t(f.V), 3};
  err = error_of([&] { f.backend->forward_mtp(*seq, hidden, bad, LogitsWanted::all, logits, m); });
  EXPECT_NE(err.find("token id 384 is outside the vocabulary [0, 384)"), std::string::npos) << err;
  std::vector<float> nine(size_t(9 * f.H), 0.f);
  std::vector<int32_t> nine_tokens(9, 1);
  err = error_of([&] { f.backend->forward_mtp(*seq, nine, nine_tokens, LogitsWanted::all, logits, m); });
  EXPECT_NE(err.find("the MTP cache of 0 positions plus 9 new ones exceeds the sequence's capacity of 8"),
            std::string::npos)
      << err;
  EXPECT_EQ(seq->mtp_length(), 0);
  EXPECT_EQ(seq->length(), 0);
}

// ---- Without the head --------------------------------------------------------------------

TEST(MtpBackend, AModelWithoutTheHeadSaysSo) {
  Fixture f = load_fixture("mlx-q4");  // mlx conversions drop mtp.*
  EXPECT_FALSE(f.backend->has_mtp());
  const std::string why = f.backend->mtp_unavailable();
  EXPECT_NE(why.find("the model has no MTP head: " + kTiny + "/mlx-q4 has no mtp.* tensors"), std::string::npos) << why;
  EXPECT_NE(why.find("--mtp DIR"), std::string::npos) << why;
  auto seq = f.backend->new_sequence(64);
  std::vector<float> logits, m, hidden(size_t(f.H), 0.f);
  const int32_t token = 1;
  EXPECT_EQ(error_of([&] {
              f.backend->forward_mtp(*seq, hidden, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits, m);
            }),
            why);
  EXPECT_EQ(seq->mtp_length(), 0);
  // The main model runs as ever, forward_hidden included.
  f.backend->forward_hidden(*seq, std::span<const int32_t>(f.ids).first(5), LogitsWanted::last, logits,
                            LogitsWanted::last, hidden);
  EXPECT_EQ(int64_t(logits.size()), f.V);
  EXPECT_EQ(int64_t(hidden.size()), f.H);

  // With the head from the HF checkpoint beside it (--mtp DIR), it runs.
  LoadOptions options;
  options.mtp_dir = kTiny + "/hf-fused";
  Fixture with = load_fixture("mlx-q4", options);
  EXPECT_TRUE(with.backend->has_mtp());
  EXPECT_EQ(with.backend->mtp_unavailable(), "");
  auto s = with.backend->new_sequence(64);
  EXPECT_EQ(prefill_with_mtp(with, *s, std::span<const int32_t>(with.ids).first(5)).size(), size_t(4 * with.V));
}

// The fast CPU backend runs the head too (tests/cpu_fast/test_mtp_fast.cpp compares it with this
// one); a backend that does not keeps the contract's default: forward_hidden throws its
// mtp_unavailable() before touching the state.
TEST(MtpBackend, ABackendWithoutTheHeadSaysSo) {
  auto weights = load_model(kTiny + "/hf-fused");
  EXPECT_TRUE(make_cpu_fast_backend(weights)->has_mtp());
  struct NoHead final : Backend {
    std::shared_ptr<ModelWeights> w;
    std::string name() const override { return "plain"; }
    const ModelConfig& config() const override { return w->config; }
    std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return nullptr; }
    void forward(SequenceState&, std::span<const int32_t>, LogitsWanted, std::vector<float>&) override {}
  } plain;
  plain.w = weights;
  EXPECT_FALSE(plain.has_mtp());
  EXPECT_EQ(plain.mtp_unavailable(), "the plain backend does not run the MTP head");
  auto seq = make_cpu_backend(weights)->new_sequence(64);
  std::vector<float> logits, hidden;
  const int32_t token = 1;
  EXPECT_EQ(error_of([&] {
              plain.forward_hidden(*seq, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits,
                                   LogitsWanted::last, hidden);
            }),
            plain.mtp_unavailable());
  EXPECT_EQ(seq->length(), 0);
  EXPECT_EQ(seq->mtp_length(), 0);
}

// ---- Against the PyTorch reference (tools/mtp_reference.py) -------------------------------
//
// Tolerance as the golden logits tests (test_golden.cpp): max |lily - reference| <= 1e-3 * max
// |reference| over the rows, and the same argmax in every row.

struct ReferenceCase {
  const char* layout;
  const char* mtp_dir;    // LoadOptions::mtp_dir under tiny-a ("" for the model's own)
  const char* reference;  // the JSON tools/mtp_reference.py writes, under tiny-a
  const char* command;    // what makes it
};

class MtpReference : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(MtpReference, LogitsMatchThePyTorchReference) {
  const ReferenceCase rc = GetParam();
  const std::string json_path = kTiny + "/" + rc.reference;
  if (!std::filesystem::exists(json_path))
    GTEST_SKIP() << json_path << " is missing; make it with torch and a built lily: " << rc.command;
  const nlohmann::json ref = test::read_json(json_path);
  LoadOptions options;
  if (*rc.mtp_dir) options.mtp_dir = kTiny + "/" + rc.mtp_dir;
  Fixture f = load_fixture(rc.layout, options);
  const auto ids = ref["ids"].get<std::vector<int32_t>>();
  const auto chain_tokens = ref["chain"]["tokens"].get<std::vector<int32_t>>();
  const auto drafted = ref["chain"]["drafted"].get<std::vector<int32_t>>();
  const int64_t T = int64_t(ids.size()), K = int64_t(chain_tokens.size());
  ASSERT_EQ(ref["vocab_size"].get<int64_t>(), f.V);
  const std::vector<float> want = test::read_f32(kTiny + "/" + ref["logits"].get<std::string>());
  ASSERT_EQ(int64_t(want.size()), (T - 1 + K) * f.V) << "the reference's shape";

  auto seq = f.backend->new_sequence(4096);
  std::vector<float> hidden;
  std::vector<float> got = prefill_with_mtp(f, *seq, ids, &hidden);
  std::vector<float> h = rows(hidden, f.H, T - 1, 1);
  std::vector<int32_t> lily_drafted;
  for (int32_t token : chain_tokens) {
    auto [logits, m] = mtp_step(f, *seq, h, token);
    lily_drafted.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    got.insert(got.end(), logits.begin(), logits.end());
    h = m;
  }
  ASSERT_EQ(got.size(), want.size());
  const double diff = max_diff(got, want), scale = max_abs(want);
  int64_t argmax_mismatches = 0;
  for (int64_t r = 0; r < T - 1 + K; ++r) {
    auto row = [&](const std::vector<float>& v) { return v.begin() + r * f.V; };
    argmax_mismatches += (std::max_element(row(got), row(got) + f.V) - row(got)) !=
                         (std::max_element(row(want), row(want) + f.V) - row(want));
  }
  std::printf("[%s] MTP: max |diff| = %.3g, max |ref| = %.3g, relative %.3g, argmax mismatches %lld of %lld rows\n",
              rc.layout, diff, scale, diff / scale, (long long)argmax_mismatches, (long long)(T - 1 + K));
  EXPECT_LE(diff, 1e-3 * scale);
  EXPECT_EQ(argmax_mismatches, 0);
  EXPECT_EQ(lily_drafted, drafted);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MtpReference,
    ::testing::Values(
        ReferenceCase{"hf-fused", "", "mtp-logits-hf.json",
                      "python3 tools/mtp_reference.py --model tests/fixtures/models/tiny-a/hf-fused --lily build/lily "
                      "--out tests/fixtures/models/tiny-a/mtp-logits-hf.f32"},
        ReferenceCase{"hf-per-expert", "", "mtp-logits-hf.json",
                      "python3 tools/mtp_reference.py --model tests/fixtures/models/tiny-a/hf-fused --lily build/lily "
                      "--out tests/fixtures/models/tiny-a/mtp-logits-hf.f32"},
        ReferenceCase{
            "mlx-q4", "hf-fused", "mtp-logits-mlx.json",
            "python3 tools/mtp_reference.py --model tests/fixtures/models/tiny-a/mlx-q4 --lily build/lily --mtp "
            "tests/fixtures/models/tiny-a/hf-fused --out tests/fixtures/models/tiny-a/mtp-logits-mlx.f32"}),
    [](const auto& info) {
      std::string n = info.param.layout;
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

}  // namespace
}  // namespace lily
