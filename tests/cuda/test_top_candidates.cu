// test_top_candidates.cu: the GPU selection of sampling candidates (backend/cuda/top_candidates.cu)
// against a host partial sort in the sampler's order (descending value, ties to the lower id,
// NaN excluded). Rows with many ties (values rounded to a few levels), NaN and -inf logits; n
// at the 2048-entry block edges and the real vocabulary (248,320); k from 1 to 256 (one and
// several merge rounds); outputs poisoned before each launch.
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

std::vector<cuda::Candidate> host_top(const std::vector<float>& row, int k) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < int32_t(row.size()); ++i)
    if (!std::isnan(row[size_t(i)])) ids.push_back(i);
  const size_t keep = std::min(size_t(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(keep), ids.end(), [&](int32_t a, int32_t b) {
    return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
  });
  std::vector<cuda::Candidate> out;
  for (size_t i = 0; i < keep; ++i) out.push_back({row[size_t(ids[i])], ids[i]});
  while (out.size() < size_t(k)) out.push_back({-INFINITY, INT32_MAX});
  return out;
}

void check(int n, int k, bool ties, bool specials) {
  SCOPED_TRACE(testing::Message() << "n " << n << " k " << k << (ties ? " ties" : "") << (specials ? " nan/-inf" : ""));
  const auto row = make_row(n, uint32_t(n * 31 + k), ties, specials);
  DeviceArray<float> d_row(row);
  DeviceArray<uint8_t> scratch(cuda::top_candidates_scratch_bytes(n));
  DeviceArray<cuda::Candidate> out(static_cast<size_t>(k));
  out.poison();
  cuda::top_candidates(d_row.get(), n, k, scratch.get(), out.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = out.download();
  const auto want = host_top(row, k);
  for (int i = 0; i < k; ++i) {
    ASSERT_EQ(got[size_t(i)].id, want[size_t(i)].id) << "rank " << i;
    if (want[size_t(i)].id != INT32_MAX) {
      EXPECT_EQ(got[size_t(i)].value, want[size_t(i)].value) << "rank " << i;
    }
  }
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

TEST(CudaTopCandidates, RejectsBadK) {
  REQUIRE_GPU();
  DeviceArray<float> row(std::vector<float>(16, 1.f));
  DeviceArray<cuda::Candidate> out(1);
  EXPECT_THROW(cuda::top_candidates(row.get(), 16, 0, nullptr, out.get(), nullptr), Error);
  EXPECT_THROW(cuda::top_candidates(row.get(), 16, cuda::kMaxTopCandidates + 1, nullptr, out.get(), nullptr), Error);
}

}  // namespace
}  // namespace lily::test
