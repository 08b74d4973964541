// test_top_candidates.cu: the GPU selection of sampling candidates (backend/cuda/top_candidates.cu)
// against a host partial sort in the sampler's order (descending value, ties to the lower id,
// NaN excluded). Rows with many ties (values rounded to a few levels), NaN and -inf logits; n
// at the 2048-entry block edges and the real vocabulary (248,320); k from 1 to 256 (one and
// several merge rounds); outputs poisoned before each launch. With a grammar's allowed-token
// mask: every id, none, one, a random half, a sparse 1%, one whose logit is NaN, and the bits
// past n in the last word set (ids that do not exist must not come back).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/decode/next_token.h"

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
