// test_top_candidates.cu: the GPU selection of sampling candidates (backend/cuda/top_candidates.cu)
// against a host partial sort in the sampler's order (descending value, ties to the lower id,
// NaN excluded). Rows with many ties (values rounded to a few levels), NaN and -inf logits; n
// at the 2048-entry block edges and the real vocabulary (248,320); k from 1 to 256 (one and
// several merge rounds); outputs poisoned before each launch. With a grammar's allowed-token
// mask: every id, none, one, a random half, a sparse 1%, one whose logit is NaN, and the bits
// past n in the last word set (ids that do not exist must not come back). choose_token (the
// token a chained step draws from those candidates) against token_draw.h's draw on the host:
// greedy, the filters, many uniforms, candidates cut short by NaN, none at all; the counts of a
// chain's tokens and the penalties on their logits against host loops.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/sampling/next_token.h"

#include "cuda_test_util.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <random>

namespace lily::test {
namespace {

std::vector<float> make_row(int n, uint32_t seed, bool ties, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> row(static_cast<size_t>(n));
  for (auto& x : row) x = ties ? std::round(normal(rng)) : normal(rng);  // ties: ~20 distinct values
  if (specials)
    for (int i = 0; i < n; i += 97) row[size_t(i)] = i % 2 ? NAN : -INFINITY;
  return row;
}

bool allowed(const std::vector<uint64_t>& mask, int32_t i) {
  return mask.empty() || ((mask[size_t(i) >> 6] >> (i & 63)) & 1);
}

// The reference: the k best allowed, non-NaN logits, padded to k with {-inf, INT32_MAX}.
std::vector<cuda::Candidate> host_top(const std::vector<float>& row, int k, const std::vector<uint64_t>& mask = {}) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < int32_t(row.size()); ++i)
    if (!std::isnan(row[size_t(i)]) && allowed(mask, i)) ids.push_back(i);
  const size_t keep = std::min(size_t(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(keep), ids.end(), [&](int32_t a, int32_t b) {
    return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
  });
  std::vector<cuda::Candidate> out;
  for (size_t i = 0; i < keep; ++i) out.push_back({row[size_t(ids[i])], ids[i]});
  while (out.size() < size_t(k)) out.push_back({-INFINITY, INT32_MAX});
  return out;
}

// Runs top_candidates (with the mask when not empty) on poisoned outputs; compares with host_top.
void compare(const std::vector<float>& row, int k, const std::vector<uint64_t>& mask = {}) {
  const int n = int(row.size());
  DeviceArray<float> d_row(row);
  DeviceArray<uint64_t> d_mask(mask.empty() ? std::vector<uint64_t>(1) : mask);
  DeviceArray<uint8_t> scratch(cuda::top_candidates_scratch_bytes(n));
  DeviceArray<cuda::Candidate> out(static_cast<size_t>(k));
  out.poison();
  cuda::top_candidates(d_row.get(), n, k, mask.empty() ? nullptr : d_mask.get(), scratch.get(), out.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = out.download();
  const auto want = host_top(row, k, mask);
  for (int i = 0; i < k; ++i) {
    ASSERT_EQ(got[size_t(i)].id, want[size_t(i)].id) << "rank " << i;
    if (want[size_t(i)].id != INT32_MAX) {
      EXPECT_EQ(got[size_t(i)].value, want[size_t(i)].value) << "rank " << i;
    }
  }
}

void check(int n, int k, bool ties, bool specials) {
  SCOPED_TRACE(testing::Message() << "n " << n << " k " << k << (ties ? " ties" : "") << (specials ? " nan/-inf" : ""));
  compare(make_row(n, uint32_t(n * 31 + k), ties, specials), k);
}

enum class MaskKind { all, none, one, half, sparse, one_nan };

// A mask over n ids (ceil(n / 64) words) of the kind asked; the bits past n in the last word are
// set (they name no token: the selection must not read them as ids). one_nan: the one allowed
// id's logit is made NaN in `row` (no candidate at all).
std::vector<uint64_t> make_mask(MaskKind kind, std::vector<float>& row, uint32_t seed) {
  const int n = int(row.size());
  std::mt19937 rng(seed);
  std::vector<uint64_t> mask((size_t(n) + 63) / 64, 0);
  auto set = [&](int i) { mask[size_t(i) >> 6] |= uint64_t(1) << (i & 63); };
  const int one = int(rng() % uint32_t(n));
  for (int i = 0; i < n; ++i) {
    const uint32_t r = rng() % 100;
    const bool on = kind == MaskKind::all || (kind == MaskKind::half && r < 50) ||
                    (kind == MaskKind::sparse && r < 1) ||
                    ((kind == MaskKind::one || kind == MaskKind::one_nan) && i == one);
    if (on) set(i);
  }
  if (kind == MaskKind::one_nan) row[size_t(one)] = NAN;
  for (int i = n; i < int(mask.size()) * 64; ++i) set(i);
  return mask;
}

TEST(CudaTopCandidates, EdgeSizes) {
  REQUIRE_GPU();
  for (int n : {1, 2, 63, 2047, 2048, 2049, 4097, 70000})
    for (int k : {1, 2, 20, 64, 256})
      for (bool ties : {false, true}) check(n, k, ties, n > 100);
}

TEST(CudaTopCandidates, RealVocabulary) {
  REQUIRE_GPU();
  for (int k : {1, 20, 50, 256}) {
    check(248320, k, false, false);
    check(248320, k, true, true);
  }
}

// The selection among a grammar's allowed ids (Backend::forward_candidates with AllowedTokens):
// the best allowed, fewer than k when fewer are allowed, none (only padding) when none is.
TEST(CudaTopCandidates, AllowedMask) {
  REQUIRE_GPU();
  const MaskKind kinds[] = {MaskKind::all,  MaskKind::none,   MaskKind::one,
                            MaskKind::half, MaskKind::sparse, MaskKind::one_nan};
  const char* const names[] = {"all", "none", "one", "half", "sparse 1%", "one, NaN"};
  for (int n : {1, 63, 64, 65, 2047, 2049, 248320})
    for (int k : {1, 20, 256})
      for (size_t kind = 0; kind < std::size(kinds); ++kind)
        for (bool ties : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "n " << n << " k " << k << " mask " << names[kind] << (ties ? " ties" : ""));
          std::vector<float> row = make_row(n, uint32_t(n * 7 + k + int(kind)), ties, n > 100);
          const std::vector<uint64_t> mask = make_mask(kinds[kind], row, uint32_t(n + k * 3 + int(kind)));
          compare(row, k, mask);
        }
}

// choose_token's pick on the host: token_draw.h over the candidates before the first padding.
int32_t host_choose(const std::vector<cuda::Candidate>& c, const cuda::ChooseArgs& a) {
  int n = 0;
  while (n < a.count && c[size_t(n)].id != INT32_MAX && (!a.usable_only || c[size_t(n)].value > -INFINITY)) ++n;
  if (n == 0) return -1;
  if (a.count == 1) return c[0].id;
  std::vector<double> w(size_t(n), 0.0);
  for (int j = 0; j < n; ++j) w[size_t(j)] = candidate_weight(c[size_t(j)].value, c[0].value, a.draw.temperature);
  return c[size_t(pick_weighted(w.data(), n, a.draw, draw_uniform(a.seed, a.index)))].id;
}

// Selects the row's candidates on the GPU, then chooses among them there (poisoned outputs);
// compares with host_choose over the same candidates.
void compare_choice(const std::vector<float>& row, const cuda::ChooseArgs& args) {
  const int n = int(row.size());
  DeviceArray<float> d_row(row);
  DeviceArray<uint8_t> scratch(cuda::top_candidates_scratch_bytes(n));
  DeviceArray<cuda::Candidate> candidates(static_cast<size_t>(args.count));
  DeviceArray<int32_t> token(1), chosen(1);
  token.poison(), chosen.poison();
  cuda::top_candidates(d_row.get(), n, args.count, nullptr, scratch.get(), candidates.get(), nullptr);
  cuda::choose_token(candidates.get(), args, token.get(), chosen.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const int32_t want = host_choose(candidates.download(), args);
  EXPECT_EQ(chosen.download()[0], want);
  EXPECT_EQ(token.download()[0], want < 0 ? 0 : want) << "the next step's input: a valid id";
}

TEST(CudaChooseToken, DrawsAsTheHostSampler) {
  REQUIRE_GPU();
  struct Case {
    int count;
    DrawParams draw;
  };
  const Case cases[] = {
      {1, {0.0f, 1.0f, 0.0f}},  {20, {0.6f, 0.95f, 0.0f}},  {20, {1.0f, 1.0f, 0.0f}},   {7, {1.3f, 1.0f, 0.2f}},
      {50, {2.0f, 1.0f, 0.0f}}, {256, {1.5f, 1.0f, 0.01f}}, {256, {0.05f, 0.5f, 0.0f}}, {2, {1.0f, 0.3f, 0.0f}},
  };
  const std::vector<float> row = make_row(248320, 11, false, true);
  const std::vector<float> tied = make_row(5000, 12, true, false);
  for (const Case& c : cases)
    for (uint64_t index : {0ull, 1ull, 2ull, 77ull, 1000003ull}) {
      SCOPED_TRACE(testing::Message() << "count " << c.count << " T " << c.draw.temperature << " top_p " << c.draw.top_p
                                      << " min_p " << c.draw.min_p << " draw " << index);
      compare_choice(row, {c.count, c.draw, 42, index, {}, false, {}});
      compare_choice(tied, {c.count, c.draw, 7, index, {}, false, {}});
    }
}

// Draws spread over the candidates: the uniforms are not stuck (a test of the draw, not just of
// host = device).
TEST(CudaChooseToken, DrawsVaryWithTheIndex) {
  REQUIRE_GPU();
  std::vector<float> row(64, 0.0f);  // 64 equal logits: every draw as likely
  DeviceArray<float> d_row(row);
  DeviceArray<uint8_t> scratch(cuda::top_candidates_scratch_bytes(64));
  DeviceArray<cuda::Candidate> candidates(64);
  DeviceArray<int32_t> token(1), chosen(1);
  cuda::top_candidates(d_row.get(), 64, 64, nullptr, scratch.get(), candidates.get(), nullptr);
  std::vector<int> seen(64, 0);
  for (uint64_t i = 0; i < 640; ++i) {
    cuda::choose_token(candidates.get(), {64, {1.0f, 1.0f, 0.0f}, 3, i, {}, false, {}}, token.get(), chosen.get(),
                       nullptr);
    const int32_t id = chosen.download()[0];
    ASSERT_TRUE(id >= 0 && id < 64) << id;
    ++seen[size_t(id)];
  }
  EXPECT_GT(std::count_if(seen.begin(), seen.end(), [](int n) { return n > 0; }), 56);
}

// Every logit NaN: no candidate; the chain's host side sees -1, the next step a valid id.
TEST(CudaChooseToken, NoCandidate) {
  REQUIRE_GPU();
  const std::vector<float> nan_row(300, NAN);
  compare_choice(nan_row, {1, {0.0f, 1.0f, 0.0f}, 1, 0, {}, false, {}});
  compare_choice(nan_row, {20, {0.7f, 0.9f, 0.0f}, 1, 0, {}, false, {}});
  // Under a mask, -inf candidates are no candidates: none at all, or only the finite few.
  const std::vector<float> masked_out(300, -INFINITY);
  compare_choice(masked_out, {1, {0.0f, 1.0f, 0.0f}, 1, 0, {}, true, {}});
  compare_choice(masked_out, {20, {0.7f, 0.9f, 0.0f}, 1, 0, {}, true, {}});
  compare_choice(masked_out, {1, {0.0f, 1.0f, 0.0f}, 1, 0, {}, false, {}});  // unmasked: id 0, a valid pick
  std::vector<float> three = masked_out;
  three[17] = 1.0f, three[250] = 1.5f, three[3] = 0.5f;
  for (uint64_t index = 0; index < 20; ++index) compare_choice(three, {20, {1.0f, 1.0f, 0.0f}, 9, index, {}, true, {}});
  DeviceArray<cuda::Candidate> c(1);
  DeviceArray<int32_t> t(1), o(1);
  EXPECT_THROW(cuda::choose_token(c.get(), {0, {}, 0, 0, {}, false, {}}, t.get(), o.get(), nullptr), Error);
  EXPECT_THROW(cuda::choose_token(c.get(), {2, {0.0f, 1.0f, 0.0f}, 0, 0, {}, false, {}}, t.get(), o.get(), nullptr),
               Error);
}

// count_tokens, choose_token's count of its pick and penalize_logits against host loops: the
// counts with repeats, the tokens seen in order of first use, every seen logit penalized with
// token_draw.h's formula and no other touched.
TEST(CudaChooseToken, CountsAndPenalties) {
  REQUIRE_GPU();
  const int V = 5000;
  const std::vector<int32_t> history = {7, 4999, 7, 0, 123, 7, 4999};
  DeviceArray<int32_t> counts{static_cast<size_t>(V)}, seen{static_cast<size_t>(V)}, seen_count{1}, d_history{history};
  CUDA_OK(cudaMemset(counts.get(), 0, size_t(V) * 4));
  CUDA_OK(cudaMemset(seen_count.get(), 0, 4));
  const cuda::TokenCounts c{counts.get(), seen.get(), seen_count.get()};
  cuda::count_tokens(d_history.get(), int(history.size()), c, nullptr);
  // A pick counted: the best of a row whose maximum is at 321 (new), then at 7 (seen).
  for (int32_t best : {321, 7}) {
    std::vector<float> row(size_t(V), 0.0f);
    row[size_t(best)] = 9.0f;
    DeviceArray<float> d_row(row);
    DeviceArray<uint8_t> scratch(cuda::top_candidates_scratch_bytes(V));
    DeviceArray<cuda::Candidate> candidates(1);
    DeviceArray<int32_t> token(1), chosen(1);
    cuda::top_candidates(d_row.get(), V, 1, nullptr, scratch.get(), candidates.get(), nullptr);
    cuda::choose_token(candidates.get(), {1, {0.0f, 1.0f, 0.0f}, 0, 0, c, false, {}}, token.get(), chosen.get(),
                       nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<int> want_counts(size_t(V), 0);
  std::vector<int32_t> want_seen;
  for (int32_t t : {7, 4999, 7, 0, 123, 7, 4999, 321, 7})
    if (want_counts[size_t(t)]++ == 0) want_seen.push_back(t);
  const auto got_counts = counts.download();
  for (int t = 0; t < V; ++t) ASSERT_EQ(got_counts[size_t(t)], want_counts[size_t(t)]) << "token " << t;
  ASSERT_EQ(seen_count.download()[0], int(want_seen.size()));
  const auto got_seen = seen.download();
  EXPECT_TRUE(std::equal(want_seen.begin(), want_seen.end(), got_seen.begin()));

  for (const Penalties& p : {Penalties{1.5f, 0.0f, 1.0f}, Penalties{0.0f, 0.7f, 1.3f}, Penalties{-2.0f, 0.25f, 0.8f}}) {
    SCOPED_TRACE(testing::Message() << "presence " << p.presence << " frequency " << p.frequency << " repetition "
                                    << p.repetition);
    const std::vector<float> row = make_row(V, 5, false, false);
    DeviceArray<float> d_row(row);
    DeviceArray<float> raw{static_cast<size_t>(V)};
    raw.poison();
    cuda::penalize_logits(d_row.get(), c, p, raw.get(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = d_row.download();
    const auto got_raw = raw.download();
    for (int t = 0; t < V; ++t) {
      const float want = want_counts[size_t(t)] > 0 ? penalized_logit(row[size_t(t)], want_counts[size_t(t)], p)
                                                    : row[size_t(t)];
      ASSERT_EQ(got[size_t(t)], want) << "token " << t;
      if (want_counts[size_t(t)] > 0) {
        ASSERT_EQ(got_raw[size_t(t)], row[size_t(t)]) << "the raw logit kept, " << t;
      }
    }
  }
}

// The logprobs of a pick (a chain asked for them): log Z from log_partition_partials' parts, the
// pick's raw logit (its backup when the penalties changed it) and the raw row's best, each minus
// log Z, against a host loop in double, over the real vocabulary and below a limit.
TEST(CudaChooseToken, LogprobsOfTheRawRow) {
  REQUIRE_GPU();
  const int V = 248320;
  for (int n : {V, 1000, 63}) {
    for (int top : {0, 1, 5, 20}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " top " << top);
      std::vector<float> row = make_row(V, uint32_t(n + top), false, false);
      double best = -INFINITY;
      for (int i = 0; i < n; ++i) best = std::max(best, double(row[size_t(i)]));
      double total = 0;
      for (int i = 0; i < n; ++i) total += std::exp(double(row[size_t(i)]) - best);
      const double log_z = best + std::log(total);
      // The pick: a sampled draw over 20 candidates of the row after a penalty on 3 tokens.
      DeviceArray<float> d_row(row), raw{static_cast<size_t>(V)};
      DeviceArray<double> partials{size_t(2 * cuda::kPartitionBlocks)};
      DeviceArray<uint8_t> scratch(cuda::top_candidates_scratch_bytes(V));
      DeviceArray<cuda::Candidate> raw_top{size_t(cuda::kMaxTopCandidates)}, candidates{20}, top_out{20};
      DeviceArray<int32_t> counts{static_cast<size_t>(V)}, seen{static_cast<size_t>(V)}, seen_count{1}, token{1},
          chosen{1};
      DeviceArray<float> logprob{1};
      CUDA_OK(cudaMemset(counts.get(), 0, size_t(V) * 4));
      CUDA_OK(cudaMemset(seen_count.get(), 0, 4));
      const std::vector<int32_t> history = {0, 5, 5, n - 1};
      DeviceArray<int32_t> d_history(history);
      const cuda::TokenCounts c{counts.get(), seen.get(), seen_count.get()};
      cuda::count_tokens(d_history.get(), int(history.size()), c, nullptr);
      cuda::log_partition_partials(d_row.get(), n, partials.get(), nullptr);
      if (top > 0) cuda::top_candidates(d_row.get(), n, top, nullptr, scratch.get(), raw_top.get(), nullptr);
      cuda::penalize_logits(d_row.get(), c, Penalties{-8.0f, 0.0f, 1.0f}, raw.get(), nullptr);  // favoured
      cuda::top_candidates(d_row.get(), n, 20, nullptr, scratch.get(), candidates.get(), nullptr);
      top_out.poison(), logprob.poison();
      const cuda::ChooseLogprobs lp{top,           d_row.get(),   raw.get(),    partials.get(),
                                    raw_top.get(), logprob.get(), top_out.get()};
      cuda::choose_token(candidates.get(), {20, {1.0f, 1.0f, 0.0f}, 5, 3, c, false, lp}, token.get(), chosen.get(),
                         nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const int32_t id = chosen.download()[0];
      ASSERT_TRUE(id >= 0 && id < n);
      EXPECT_NEAR(logprob.download()[0], double(row[size_t(id)]) - log_z, 2e-5) << "the raw logit's, id " << id;
      const auto got = top_out.download();
      std::vector<float> head(row.begin(), row.begin() + n);
      const auto want_n = host_top(head, std::max(top, 1));
      for (int j = 0; j < top; ++j) {
        ASSERT_EQ(got[size_t(j)].id, want_n[size_t(j)].id) << "rank " << j;
        EXPECT_NEAR(got[size_t(j)].value, double(want_n[size_t(j)].value) - log_z, 2e-5) << "rank " << j;
      }
    }
  }
}

TEST(CudaTopCandidates, RejectsBadK) {
  REQUIRE_GPU();
  DeviceArray<float> row(std::vector<float>(16, 1.f));
  DeviceArray<cuda::Candidate> out(1);
  EXPECT_THROW(cuda::top_candidates(row.get(), 16, 0, nullptr, nullptr, out.get(), nullptr), Error);
  EXPECT_THROW(cuda::top_candidates(row.get(), 16, cuda::kMaxTopCandidates + 1, nullptr, nullptr, out.get(), nullptr),
               Error);
}

}  // namespace
}  // namespace lily::test
