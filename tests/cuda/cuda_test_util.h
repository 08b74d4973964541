// cuda_test_util.h: helpers for CUDA tests: skip without a GPU, device buffers, random
// inputs, quantized random matrices in both CPU (Matrix) and GPU (QMatrix) form.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/gpu_types.h"
#include "base/bf16.h"
#include "model/quant.h"
#include "model/weights.h"

namespace lily::test {

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t _e = (expr);                                               \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)

// Whether a GPU is visible. The first call with one puts the kernels under LILY_DEVICE_PROFILE
// where it is set (sm86, ...: device_profile.h), as the backend does: the kernel tests then size
// their grids by that card's SMs and ask for no more shared memory than it has.
inline bool gpu_present() {
  static const bool present = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
    if (const char* forced = std::getenv("LILY_DEVICE_PROFILE"))
      cuda::set_current_device_profile(cuda::resolve_device_profile(cuda::query_device_profile(), forced));
    return true;
  }();
  return present;
}

#define REQUIRE_GPU() \
  if (!::lily::test::gpu_present()) GTEST_SKIP() << "no CUDA device"

// A device copy of a host vector, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) { cudaMalloc(&p_, std::max<size_t>(1, n) * sizeof(T)); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& host) {
    cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  // Poison: every byte 0xFF (NaN for floats) so unwritten outputs show.
  void poison() { cudaMemset(p_, 0xFF, n_ * sizeof(T)); }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A random affine-quantized stack of `batch` [rows, cols] matrices, held on host and device.
struct TestQMatrix {
  lily::QuantizedMatrix host;  // codes/scales/biases for all batch entries, concatenated
  int batch, rows, cols, bits;
  std::unique_ptr<DeviceArray<uint32_t>> codes;
  std::unique_ptr<DeviceArray<bf16>> scales, biases;

  TestQMatrix(int batch_, int rows_, int cols_, int bits_, uint32_t seed, float scale = 0.05f)
      : TestQMatrix(lily::quantize_affine(random_floats(size_t(batch_) * rows_ * cols_, seed, scale),
                                          int64_t(batch_) * rows_, cols_, bits_, 64),
                    batch_, rows_, cols_, bits_) {}
  // Given host codes/scales/biases of `batch_` matrices, copied to the device.
  TestQMatrix(lily::QuantizedMatrix host_, int batch_, int rows_, int cols_, int bits_)
      : host(std::move(host_)), batch(batch_), rows(rows_), cols(cols_), bits(bits_) {
    codes = std::make_unique<DeviceArray<uint32_t>>(host.codes);
    scales = std::make_unique<DeviceArray<bf16>>(host.scales);
    biases = std::make_unique<DeviceArray<bf16>>(host.biases);
  }
  // Batch entry e as its own matrix (batch 1): one expert of a grouped weight, for the
  // single-matrix references (bf16_reference, swiglu_reference).
  TestQMatrix entry(int e) const {
    const size_t words = size_t(rows) * cols * bits / 32, groups = size_t(rows) * (cols / 64);
    lily::QuantizedMatrix one;
    one.codes.assign(host.codes.begin() + size_t(e) * words, host.codes.begin() + size_t(e + 1) * words);
    one.scales.assign(host.scales.begin() + size_t(e) * groups, host.scales.begin() + size_t(e + 1) * groups);
    one.biases.assign(host.biases.begin() + size_t(e) * groups, host.biases.begin() + size_t(e + 1) * groups);
    return TestQMatrix(std::move(one), 1, rows, cols, bits);
  }
  cuda::QMatrix gpu() const {
    cuda::QMatrix m;
    m.batch = batch, m.rows = rows, m.cols = cols, m.bits = bits, m.group_size = 64;
    m.codes = codes->get(), m.scales = scales->get(), m.biases = biases->get();
    return m;
  }
  // The CPU view of batch entry i (for the reference ops in backend/cpu).
  lily::Matrix cpu(int i = 0) const {
    lily::Matrix m;
    m.rows = rows, m.cols = cols, m.format = lily::MatrixFormat::affine, m.bits = bits, m.group_size = 64;
    m.data = host.codes.data() + size_t(i) * rows * cols * bits / 32;
    m.scales = host.scales.data() + size_t(i) * rows * (cols / 64);
    m.biases = host.biases.data() + size_t(i) * rows * (cols / 64);
    return m;
  }
};

// max |a - b| / max |b|; NaN anywhere gives infinity.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isnan(a[i]) || std::isinf(a[i])) return INFINITY;
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    ref = std::max(ref, double(std::fabs(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

// Every output within its bound; reports the worst one (index, values, bound).
inline void expect_within(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) / (bound[i] + 1e-30) : INFINITY;
    if (excess > worst) worst = excess, at = i;
  }
  EXPECT_LE(worst, 1.0) << "output " << at << ": gpu " << got[at] << ", reference " << want[at] << ", bound "
                        << bound[at];
}

// A product as the tensor-core kernels compute it (gemm/gemm_q4.h, gemv/gemv_rows.h):
// y[t, n] = sum_k bf16(x[t, k]) * bf16(s * q + b), with l1[t, n] = sum_k |x w| (the scale of
// the rounding error) and max_term[t, n] = max_k |x w|.
struct Bf16Reference {
  std::vector<double> y, l1, max_term;
};

inline Bf16Reference bf16_reference(const TestQMatrix& W, const std::vector<float>& x, int T) {
  const int N = W.rows, K = W.cols, bits = W.bits, per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  std::vector<float> w(size_t(N) * K), xb(x.size());
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const size_t g = size_t(n) * (K / 64) + k / 64;
      const uint32_t word = W.host.codes[(size_t(n) * K + k) / per_word];
      const float q = float((word >> (bits * (k % per_word))) & mask);
      w[size_t(n) * K + k] = round_bf16(std::fmaf(to_float(W.host.scales[g]), q, to_float(W.host.biases[g])));
    }
  for (size_t i = 0; i < x.size(); ++i) xb[i] = round_bf16(x[i]);
  Bf16Reference r;
  r.y.assign(size_t(T) * N, 0.0);
  r.l1.assign(r.y.size(), 0.0);
  r.max_term.assign(r.y.size(), 0.0);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double acc = 0, l1 = 0, most = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(xb[size_t(t) * K + k]) * double(w[size_t(n) * K + k]);
        acc += p, l1 += std::fabs(p), most = std::max(most, std::fabs(p));
      }
      r.y[size_t(t) * N + n] = acc, r.l1[size_t(t) * N + n] = l1, r.max_term[size_t(t) * N + n] = most;
    }
  return r;
}

// A fused SwiGLU product as the tensor-core kernels compute it: want[t, i] = silu(g) * u with
// g, u the bf16_reference products of G and U [I, K] with x [T, K]; bound[t, i] the error that
// `rel` * sum_k |x w| in each of g and u (the tests' kBound) can move it by, plus 1e-6 of |want|.
struct SwigluReference {
  std::vector<double> want, bound;  // [T, I]
};

inline SwigluReference swiglu_reference(const TestQMatrix& G, const TestQMatrix& U, const std::vector<float>& x, int T,
                                        double rel) {
  const Bf16Reference g = bf16_reference(G, x, T), u = bf16_reference(U, x, T);
  SwigluReference r;
  r.want.resize(g.y.size());
  r.bound.resize(g.y.size());
  for (size_t i = 0; i < r.want.size(); ++i) {
    const double sg = g.y[i] / (1.0 + std::exp(-g.y[i]));
    r.want[i] = sg * u.y[i];
    // silu' <= 1.1: an error e_g in g moves silu(g) * u by at most 1.1 |u| e_g.
    r.bound[i] = 1.1 * std::fabs(u.y[i]) * rel * g.l1[i] + std::fabs(sg) * rel * u.l1[i] + 1e-6 * std::fabs(r.want[i]);
  }
  return r;
}

}  // namespace lily::test
