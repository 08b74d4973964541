// test_norm.cu: embed_tokens, rms_norm (common/norm.cu) and argmax (sampling/argmax.cu) against host
// references (Matrix::dequantize_row, cpu::rms_norm, a plain loop).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/norm.h"
#include "backend/cuda/sampling/next_token.h"

#include <algorithm>
#include <limits>

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

TEST(CudaNorm, EmbedTokens) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int H : {64, 128, 2048}) {
      SCOPED_TRACE(testing::Message() << "bits " << bits << " H " << H);
      const int V = 1000;
      TestQMatrix table(1, V, H, bits, uint32_t(H + bits));
      const std::vector<int32_t> tokens = {0, 999, 17, 17, 500, 1};
      const int T = int(tokens.size());
      std::vector<float> expected(size_t(T) * H);
      for (int t = 0; t < T; ++t) table.cpu().dequantize_row(tokens[size_t(t)], expected.data() + size_t(t) * H);
      DeviceArray<int32_t> dt(tokens);
      DeviceArray<float> h(expected.size());
      h.poison();
      cuda::embed_tokens(table.gpu(), dt.get(), T, h.get(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const double err = relative_error(h.download(), expected);
      EXPECT_LT(err, 1e-6) << "max |gpu - cpu| / max |cpu| = " << err;
    }
}

void check_rms_norm(int rows, int n, bool in_place) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " n " << n << (in_place ? " in place" : ""));
  const auto x = random_floats(size_t(rows) * n, uint32_t(rows * 100 + n), 3.f);
  auto gain = random_floats(size_t(n), uint32_t(n));
  for (auto& g : gain) g += 1.f;
  std::vector<float> expected(x.size());
  cpu::rms_norm(x.data(), gain.data(), rows, n, 1e-6f, expected.data());
  DeviceArray<float> dx(x), dg(gain), dy(x.size());
  dy.poison();
  float* y = in_place ? dx.get() : dy.get();
  cuda::rms_norm(dx.get(), dg.get(), rows, n, 1e-6f, y, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = in_place ? dx.download() : dy.download();
  const double err = relative_error(got, expected);
  EXPECT_LT(err, 1e-5) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaNorm, RmsNorm) {
  REQUIRE_GPU();
  for (int rows : {1, 3, 64})
    for (int n : {1, 33, 64, 128, 256, 1000, 2048, 4096}) check_rms_norm(rows, n, false);
}

TEST(CudaNorm, RmsNormInPlace) {
  REQUIRE_GPU();
  for (int n : {128, 256, 2048}) check_rms_norm(5, n, true);
}

int32_t gpu_argmax(const std::vector<float>& logits, int vocab_limit) {
  DeviceArray<float> d(logits);
  DeviceArray<int32_t> out(1);
  out.poison();
  cuda::argmax(d.get(), vocab_limit, out.get(), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.download()[0];
}

int32_t host_argmax(const std::vector<float>& logits, int vocab_limit) {
  return int32_t(std::max_element(logits.begin(), logits.begin() + vocab_limit) - logits.begin());  // first maximum
}

TEST(CudaNorm, Argmax) {
  REQUIRE_GPU();
  for (int vocab : {1, 7, 1000, 4096, 248317, 248320}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    auto logits = random_floats(size_t(vocab), uint32_t(vocab), 5.f);
    EXPECT_EQ(gpu_argmax(logits, vocab), host_argmax(logits, vocab));
    // The maximum at the last id, then at the first.
    logits[size_t(vocab - 1)] = 100.f;
    EXPECT_EQ(gpu_argmax(logits, vocab), vocab - 1);
    logits[0] = 100.f;
    EXPECT_EQ(gpu_argmax(logits, vocab), 0);
  }
}

TEST(CudaNorm, ArgmaxTiesToLowestId) {
  REQUIRE_GPU();
  const int vocab = 248320;
  auto logits = random_floats(size_t(vocab), 7);
  for (int id : {200000, 123457, 123456, 70000}) logits[size_t(id)] = 50.f;  // ties spread over blocks
  EXPECT_EQ(gpu_argmax(logits, vocab), 70000);
  std::vector<float> flat(size_t(vocab), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(gpu_argmax(flat, vocab), 0);
  std::vector<float> equal(size_t(vocab), 1.f);
  EXPECT_EQ(gpu_argmax(equal, vocab), 0);
}

// Ids at or past vocab_limit are never chosen (the padded tail of the lm_head).
TEST(CudaNorm, ArgmaxRespectsLimit) {
  REQUIRE_GPU();
  auto logits = random_floats(5000, 11);
  logits[4500] = 1000.f;
  EXPECT_EQ(gpu_argmax(logits, 4000), host_argmax(logits, 4000));
  EXPECT_EQ(gpu_argmax(logits, 5000), 4500);
}

// NaN logits are skipped, not chosen.
TEST(CudaNorm, ArgmaxSkipsNaN) {
  REQUIRE_GPU();
  auto logits = random_floats(10000, 12);
  logits[3] = std::numeric_limits<float>::quiet_NaN();
  logits[9000] = 77.f;
  EXPECT_EQ(gpu_argmax(logits, 10000), 9000);
}

}  // namespace
}  // namespace lily::test
