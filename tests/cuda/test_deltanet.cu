// test_deltanet.cu: the Gated DeltaNet cores (deltanet/deltanet_decode.h, deltanet/deltanet_prefill.h)
// against a host reference built from backend/cpu (delta_rule_recurrent, gated_rms_norm; conv and
// l2norm written out below as in deltanet.cpp), for decode (T = 1), prefill of odd and
// chunk-crossing lengths (a prefill of one token too), and prefill then decode, with random initial
// conv and SSM states. Prefill runs the chunked delta rule (deltanet_chunked.cu) and the recurrent
// scan, each by name; both are checked against the CPU token loop. Outputs (and the scratch) are
// poisoned before each launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/deltanet/deltanet_decode.h"
#include "backend/cuda/deltanet/deltanet_prefill.h"
#include "backend/cuda/gemm/gemm_w4_wgmma.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr int kD = 128, kK = 4;
constexpr double kTolerance = 1e-4;
// The chunked form multiplies on the tensor cores in tf32 (deltanet_chunked.cu): its outputs and
// state carry tf32's rounding (2^-11 of each operand), not fp32's: the worst of every test below
// was 8.9e-4 on the H200 (2026-12-03); a wrong index or decay is off by 1e-1 and more.
constexpr double kTf32Tolerance = 2e-3;

using Mode = cuda::DeltaRulePrefill;

struct Layer {
  int Hk, Hv;
  int C() const { return 2 * Hk * kD + Hv * kD; }
  std::vector<float> conv_w, A_log, dt_bias, norm_w;
  // decay_shift moves every A_log: g = -exp(A_log) softplus(..) scales by exp(decay_shift).
  Layer(int hk, int hv, uint32_t seed, float decay_shift = 0.f) : Hk(hk), Hv(hv) {
    conv_w = random_floats(size_t(C()) * kK, seed, 0.5f);
    A_log = random_floats(size_t(Hv), seed + 1, 0.5f);
    for (auto& x : A_log) x += decay_shift;
    dt_bias = random_floats(size_t(Hv), seed + 2, 0.5f);
    norm_w = random_floats(kD, seed + 3, 0.2f);
    for (auto& w : norm_w) w += 1.f;
  }
};

struct State {
  std::vector<float> conv, ssm;  // [K-1, C], [Hv, 128, 128]
};

struct Inputs {
  std::vector<float> mixed, z, b, a;
  Inputs(const Layer& l, int T, uint32_t seed)
      : mixed(random_floats(size_t(T) * l.C(), seed)),
        z(random_floats(size_t(T) * l.Hv * kD, seed + 1)),
        b(random_floats(size_t(T) * l.Hv, seed + 2)),
        a(random_floats(size_t(T) * l.Hv, seed + 3)) {}
};

// The host reference (spec §2.6): y [T, Hv*128]; advances st.
std::vector<float> reference(const Layer& l, State& st, const Inputs& in, int T) {
  const int C = l.C(), key_dim = l.Hk * kD;
  std::vector<float> u(size_t(T) * C);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      float s = 0;
      for (int i = 0; i < kK; ++i) {
        const int row = t + i;  // of [conv_state; mixed]
        const float x = row < kK - 1 ? st.conv[size_t(row) * C + c] : in.mixed[size_t(row - (kK - 1)) * C + c];
        s += l.conv_w[size_t(c) * kK + i] * x;
      }
      u[size_t(t) * C + c] = cpu::silu(s);
    }
  std::vector<float> next(size_t(kK - 1) * C);
  for (int r = 0; r < kK - 1; ++r)
    for (int c = 0; c < C; ++c) {
      const int row = T + r;
      next[size_t(r) * C + c] = row < kK - 1 ? st.conv[size_t(row) * C + c] : in.mixed[size_t(row - (kK - 1)) * C + c];
    }
  st.conv = next;
  auto l2 = [](float* x, float scale) {
    double ss = 0;
    for (int i = 0; i < kD; ++i) ss += double(x[i]) * x[i];
    const float inv = 1.f / std::sqrt(float(ss) + 1e-6f) * scale;
    for (int i = 0; i < kD; ++i) x[i] *= inv;
  };
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < l.Hk; ++h) {
      l2(&u[size_t(t) * C + h * kD], 1.f / std::sqrt(float(kD)));
      l2(&u[size_t(t) * C + key_dim + h * kD], 1.f);
    }
  std::vector<float> beta(size_t(T) * l.Hv), g(size_t(T) * l.Hv);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < l.Hv; ++h) {
      const size_t i = size_t(t) * l.Hv + h;
      beta[i] = cpu::sigmoid(in.b[i]);
      g[i] = -std::exp(l.A_log[size_t(h)]) * cpu::softplus(in.a[i] + l.dt_bias[size_t(h)]);
    }
  std::vector<float> o(size_t(T) * l.Hv * kD), y(o.size());
  const int ratio = l.Hv / l.Hk;
  for (int h = 0; h < l.Hv; ++h) {
    const int kh = h / ratio;
    cpu::DeltaRuleInputs dr{u.data() + kh * kD,
                            u.data() + key_dim + kh * kD,
                            u.data() + 2 * key_dim + h * kD,
                            g.data() + h,
                            beta.data() + h,
                            C,
                            C,
                            C,
                            l.Hv,
                            T,
                            kD,
                            kD};
    cpu::delta_rule_recurrent(dr, st.ssm.data() + size_t(h) * kD * kD, o.data() + h * kD, l.Hv * kD);
  }
  cpu::gated_rms_norm(o.data(), in.z.data(), l.norm_w.data(), int64_t(T) * l.Hv, kD, 1e-6f, y.data());
  return y;
}

// The layer's weights and state on the GPU.
struct GpuLayer {
  DeviceArray<float> conv_w, A_log, dt_bias, norm_w, conv, ssm;
  const Layer& l;
  GpuLayer(const Layer& layer, const State& st)
      : conv_w(layer.conv_w),
        A_log(layer.A_log),
        dt_bias(layer.dt_bias),
        norm_w(layer.norm_w),
        conv(st.conv),
        ssm(st.ssm),
        l(layer) {}
  cuda::DeltaNetParams params(int T) const {
    cuda::DeltaNetParams p;
    p.T = T, p.num_key_heads = l.Hk, p.num_value_heads = l.Hv, p.head_dim = kD, p.conv_kernel = kK, p.eps = 1e-6f;
    p.conv_weight = conv_w.get(), p.A_log = A_log.get(), p.dt_bias = dt_bias.get(), p.norm_weight = norm_w.get();
    return p;
  }
  // One token: the decode kernel (unless prefill_one); more: the prefill in `mode`.
  std::vector<float> run(const Inputs& in, int T, Mode mode, bool prefill_one = false) {
    DeviceArray<float> mixed(in.mixed), z(in.z), b(in.b), a(in.a), y(size_t(T) * l.Hv * kD);
    y.poison();
    const cuda::DeltaNetParams p = params(T);
    if (T == 1 && !prefill_one) {
      cuda::gated_deltanet_decode(p, mixed.get(), z.get(), b.get(), a.get(), conv.get(), ssm.get(), y.get(), nullptr);
    } else {
      DeviceArray<char> scratch(std::max<size_t>(1, cuda::deltanet_prefill_scratch_bytes(mode, p)));
      scratch.poison();
      // The bf16 copy of y for a wgmma out_proj: bit for bit x_to_bf16_permuted's of y.
      const bool bf16_y = mode != Mode::rows;
      DeviceArray<bf16> y16(bf16_y ? y.size() : 1), y16_want(bf16_y ? y.size() : 1);
      y16.poison();
      cuda::gated_deltanet_prefill(mode, p, mixed.get(), z.get(), b.get(), a.get(), conv.get(), ssm.get(), y.get(),
                                   mode == Mode::rows ? nullptr : scratch.get(), nullptr, bf16_y ? y16.get() : nullptr);
      if (bf16_y) {
        cuda::x_to_bf16_permuted(y.get(), y16_want.get(), T, l.Hv * kD, nullptr);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got16 = y16.download(), want16 = y16_want.download();
        for (size_t i = 0; i < got16.size(); ++i) EXPECT_EQ(got16[i].bits, want16[i].bits) << "bf16 y at " << i;
      }
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y.download();
  }
};

State random_state(const Layer& l, uint32_t seed) {
  return {random_floats(size_t(kK - 1) * l.C(), seed), random_floats(size_t(l.Hv) * kD * kD, seed + 1, 0.1f)};
}

// Runs blocks of the given lengths one after another (each a decode step or a prefill of its own,
// state carried, comparing each block's y and the states after it.
void check_blocks(int Hk, int Hv, const std::vector<int>& lengths, uint32_t seed, Mode mode = Mode::chunked,
                  float decay_shift = 0.f, bool prefill_one = false) {
  Layer layer(Hk, Hv, seed, decay_shift);
  State host = random_state(layer, seed + 10);
  GpuLayer gpu(layer, host);
  bool tf32 = false;  // from the first chunked block on, the state carries tf32's rounding
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int T = lengths[i];
    Inputs in(layer, T, seed + 100 + uint32_t(i) * 7);
    const auto want = reference(layer, host, in, T);
    const auto got = gpu.run(in, T, mode, prefill_one);
    SCOPED_TRACE(testing::Message() << cuda::kernel_name(mode) << " Hk " << Hk << " Hv " << Hv << " block " << i
                                    << " T " << T << " decay shift " << decay_shift);
    const double ey = relative_error(got, want), ec = relative_error(gpu.conv.download(), host.conv),
                 es = relative_error(gpu.ssm.download(), host.ssm);
    tf32 = tf32 || (mode == Mode::chunked && (T > 1 || prefill_one));
    const double bound = tf32 ? kTf32Tolerance : kTolerance;
    EXPECT_LT(ey, bound) << "y";
    EXPECT_LT(ec, kTolerance) << "conv state";
    EXPECT_LT(es, bound) << "ssm state";
  }
}

// The prompt lengths of issue 7: chunk (64) and prefill-block (512) edges on both sides.
const std::vector<int> kLengths = {1, 2, 63, 64, 65, 127, 128, 129, 511, 512, 513, 1000, 1025, 4095, 4096, 4100};

TEST(CudaDeltaNet, DecodeSmall) {
  REQUIRE_GPU();
  check_blocks(2, 4, {1}, 1);
}

TEST(CudaDeltaNet, DecodeFull) {
  REQUIRE_GPU();
  check_blocks(16, 32, {1}, 2);
}

TEST(CudaDeltaNet, PrefillSmall) {
  REQUIRE_GPU();
  for (int T : {2, 3, 63, 64, 65, 200}) check_blocks(2, 4, {T}, 3 + uint32_t(T));
}

TEST(CudaDeltaNet, PrefillFull) {
  REQUIRE_GPU();
  for (int T : {2, 63, 64, 65, 200}) check_blocks(16, 32, {T}, 5 + uint32_t(T));
}

// Longer than one 512-token prefill chunk: the conv state and SSM state carry across chunks.
TEST(CudaDeltaNet, PrefillAcrossChunks) {
  REQUIRE_GPU();
  check_blocks(2, 4, {1100}, 7);
}

// deltanet_conv_kernel's boundaries: a warp per (head, run of 16 tokens), 4 heads per block, so
// lengths at run edges (one chunk and across the 512-token chunk), and head counts 2 Hk + Hv that
// are not a multiple of 4 (3 and 9 heads: warps past the last head); gated_norm_kernel's 8 rows
// per block end inside a block when n * Hv is not a multiple of 8 (Hv = 1, 3, odd n).
TEST(CudaDeltaNet, PrefillConvRunsAndHeadCounts) {
  REQUIRE_GPU();
  for (int T : {3, 15, 16, 17, 31, 33}) check_blocks(2, 4, {T}, 61 + uint32_t(T));
  check_blocks(2, 4, {527, 16, 17, 1, 529}, 62);
  check_blocks(1, 1, {17, 1, 40, 3}, 63);
  check_blocks(3, 3, {15, 1, 70, 2}, 64);
  check_blocks(3, 3, {600}, 65, Mode::recurrent);
}

// Passes of 1 .. 16 tokens on the decode kernel (DeltaRulePrefill::rows): every length across
// its 8- and 16-token forms, fewer tokens than the conv window (1, 2: the new conv state keeps
// old rows), states carried from pass to pass and into decode steps, one and two v-heads per key
// head, and a key-head count of 3.
TEST(CudaDeltaNet, RowsForm) {
  REQUIRE_GPU();
  for (int T = 1; T <= 16; ++T) check_blocks(2, 4, {T}, 71 + uint32_t(T), Mode::rows);
  for (int T : {2, 5, 8, 9, 16}) check_blocks(16, 32, {T}, 91 + uint32_t(T), Mode::rows);
  check_blocks(2, 4, {16, 1, 2, 3, 16, 9, 1}, 95, Mode::rows);
  check_blocks(16, 32, {7, 16, 1, 2}, 96, Mode::rows);
  check_blocks(3, 3, {4, 13, 1}, 97, Mode::rows);
}

// The rows form keeping the state after each of its last rows (DeltaNetKept: a speculative
// verify's rewind): every kept conv and recurrent state against the host reference stepped one
// token at a time from the same start, the first kept row at 0, the middle and the last; y and the
// live states as without keeping. Poisoned kept buffers: every value must be written.
void check_kept_rows(int Hk, int Hv, int T, int first, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "Hk " << Hk << " Hv " << Hv << " T " << T << " kept from " << first);
  Layer layer(Hk, Hv, seed);
  const State start = random_state(layer, seed + 10);
  Inputs in(layer, T, seed + 100);
  const int C = layer.C(), width = Hv * kD;
  const size_t conv_size = size_t(kK - 1) * C, ssm_size = size_t(Hv) * kD * kD, rows = size_t(T - first);
  GpuLayer gpu(layer, start);
  DeviceArray<float> mixed(in.mixed), z(in.z), b(in.b), a(in.a), y(size_t(T) * width);
  DeviceArray<float> kept_conv(rows * conv_size), kept_ssm(rows * ssm_size);
  kept_conv.poison(), kept_ssm.poison();
  cuda::DeltaNetParams p = gpu.params(T);
  p.kept.conv = kept_conv.get(), p.kept.ssm = kept_ssm.get(), p.kept.first = first;
  cuda::gated_deltanet_prefill(Mode::rows, p, mixed.get(), z.get(), b.get(), a.get(), gpu.conv.get(), gpu.ssm.get(),
                               y.get(), nullptr, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got_conv = kept_conv.download(), got_ssm = kept_ssm.download();
  State host = start;
  std::vector<float> want_y;
  for (int t = 0; t < T; ++t) {
    Inputs row(layer, 1, seed + 200);
    row.mixed.assign(in.mixed.begin() + size_t(t) * C, in.mixed.begin() + size_t(t + 1) * C);
    row.z.assign(in.z.begin() + size_t(t) * width, in.z.begin() + size_t(t + 1) * width);
    row.b.assign(in.b.begin() + size_t(t) * Hv, in.b.begin() + size_t(t + 1) * Hv);
    row.a.assign(in.a.begin() + size_t(t) * Hv, in.a.begin() + size_t(t + 1) * Hv);
    const std::vector<float> yt = reference(layer, host, row, 1);
    want_y.insert(want_y.end(), yt.begin(), yt.end());
    if (t < first) continue;
    const size_t r = size_t(t - first);
    const std::vector<float> conv(got_conv.begin() + r * conv_size, got_conv.begin() + (r + 1) * conv_size);
    const std::vector<float> ssm(got_ssm.begin() + r * ssm_size, got_ssm.begin() + (r + 1) * ssm_size);
    EXPECT_LT(relative_error(conv, host.conv), kTolerance) << "kept conv state after row " << t;
    EXPECT_LT(relative_error(ssm, host.ssm), kTolerance) << "kept ssm state after row " << t;
  }
  EXPECT_LT(relative_error(y.download(), want_y), kTolerance) << "y";
  EXPECT_LT(relative_error(gpu.conv.download(), host.conv), kTolerance) << "live conv state";
  EXPECT_LT(relative_error(gpu.ssm.download(), host.ssm), kTolerance) << "live ssm state";
}

TEST(CudaDeltaNet, RowsFormKeepsEachRowsState) {
  REQUIRE_GPU();
  for (int T : {2, 3, 4, 8, 9, 16})
    for (int first : {0, T / 2, T - 1}) check_kept_rows(2, 4, T, first, 300 + uint32_t(T * 17 + first));
  check_kept_rows(16, 32, 4, 0, 401);
  check_kept_rows(16, 32, 9, 5, 402);
  check_kept_rows(3, 3, 5, 1, 403);
  // Refused where no kernel keeps them: one token, a first row past the pass, another form.
  Layer layer(2, 4, 404);
  GpuLayer gpu(layer, random_state(layer, 405));
  Inputs in(layer, 2, 406);
  DeviceArray<float> mixed(in.mixed), z(in.z), b(in.b), a(in.a), y(size_t(2) * 4 * kD), kept(1 << 20);
  cuda::DeltaNetParams p = gpu.params(2);
  p.kept.conv = kept.get(), p.kept.ssm = kept.get(), p.kept.first = 2;
  EXPECT_THROW(cuda::gated_deltanet_decode(p, mixed.get(), z.get(), b.get(), a.get(), gpu.conv.get(), gpu.ssm.get(),
                                           y.get(), nullptr),
               Error);
  p.kept.first = 0;
  DeviceArray<char> scratch(cuda::deltanet_prefill_scratch_bytes(Mode::recurrent, p));
  EXPECT_THROW(cuda::gated_deltanet_prefill(Mode::recurrent, p, mixed.get(), z.get(), b.get(), a.get(), gpu.conv.get(),
                                            gpu.ssm.get(), y.get(), scratch.get(), nullptr),
               Error);
}

TEST(CudaDeltaNet, PrefillThenDecode) {
  REQUIRE_GPU();
  check_blocks(2, 4, {65, 1, 1, 1, 2, 1}, 11);
  check_blocks(16, 32, {63, 1, 1, 1}, 13);
}

// A prefill pass of one token (the last pass of a prompt one longer than a multiple of the pass
// size), both forms, alone and between longer blocks.
TEST(CudaDeltaNet, PrefillOfOneToken) {
  REQUIRE_GPU();
  for (Mode mode : {Mode::chunked, Mode::recurrent}) {
    check_blocks(2, 4, {1}, 17, mode, 0.f, true);
    check_blocks(16, 32, {70, 1, 1}, 18, mode, 0.f, true);
  }
}

// The scratch the chunked form needs: u of one chunk plus 36,928 floats per v-head and
// 64-token chunk (W, U, Aqk, the chunk's start state, gamma).
TEST(CudaDeltaNet, ScratchBytes) {
  cuda::DeltaNetParams p;  // Hk 16, Hv 32
  constexpr int kChunk = cuda::kDeltaNetPrefillChunk;
  const size_t u_chunk = size_t(kChunk) * p.conv_dim() * sizeof(float);
  p.T = 1;
  EXPECT_EQ(cuda::deltanet_prefill_scratch_bytes(Mode::recurrent, p), size_t(p.conv_dim()) * 4);
  EXPECT_EQ(cuda::deltanet_prefill_scratch_bytes(Mode::rows, p), 0u);
  p.T = 1000;
  EXPECT_EQ(cuda::deltanet_prefill_scratch_bytes(Mode::chunked, p),
            size_t(1000) * p.conv_dim() * 4 + size_t(16) * 32 * 36928 * sizeof(float));
  p.T = 3 * kChunk;
  EXPECT_EQ(cuda::deltanet_prefill_scratch_bytes(Mode::chunked, p),
            u_chunk + size_t(kChunk / 64) * 32 * 36928 * sizeof(float));
  p.T = 65;
  EXPECT_EQ(cuda::deltanet_prefill_scratch_bytes(Mode::chunked, p),
            size_t(65) * p.conv_dim() * 4 + size_t(2) * 32 * 36928 * 4);
  p.T = 3 * kChunk;
  EXPECT_EQ(cuda::deltanet_prefill_scratch_bytes(Mode::recurrent, p), u_chunk);
}

// ---- The chunked delta rule (deltanet_chunked.cu) vs the CPU token loop ------------------------

TEST(CudaDeltaNet, ChunkedLengthsSmall) {
  REQUIRE_GPU();
  for (int T : kLengths) check_blocks(2, 4, {T}, 21 + uint32_t(T));
}

TEST(CudaDeltaNet, ChunkedLengthsFull) {
  REQUIRE_GPU();
  for (int T : kLengths) check_blocks(16, 32, {T}, 23 + uint32_t(T));
}

// A second call continues from the first's SSM and conv state: chunk and kDeltaNetPrefillChunk boundaries
// fall at different token positions than in one call.
TEST(CudaDeltaNet, ChunkedContinued) {
  REQUIRE_GPU();
  check_blocks(2, 4, {65, 100}, 25);
  check_blocks(2, 4, {64, 64, 1, 63}, 26);
  check_blocks(2, 4, {511, 513}, 27);
  check_blocks(2, 4, {1000, 129, 2}, 28);
  check_blocks(2, 4, {1023, 1026}, 31);
  check_blocks(2, 4, {4090, 4110}, 32);
  check_blocks(16, 32, {63, 65}, 29);
  check_blocks(16, 32, {513, 127, 1, 64}, 30);
}

// Decays far from 1 (exp(gamma) underflows to 0 inside a chunk) and close to 1 (the state keeps
// what it is given over a long prompt).
TEST(CudaDeltaNet, ChunkedDecayExtremes) {
  REQUIRE_GPU();
  check_blocks(2, 4, {200, 65}, 31, Mode::chunked, 4.f);   // g down to about -100 per token
  check_blocks(2, 4, {600, 65}, 32, Mode::chunked, -8.f);  // g about -3e-4
  check_blocks(16, 32, {129}, 33, Mode::chunked, 4.f);
}

// delta_rule_chunked alone: its raw o (before the gated norm, which would hide a per-row scale)
// and the final state, against cpu::delta_rule_recurrent on random q, k (l2-normalised), v, gates.
void check_chunked_rule(int Hk, int Hv, const std::vector<int>& lengths, uint32_t seed) {
  const int C = 2 * Hk * kD + Hv * kD, key_dim = Hk * kD;
  const auto A_log = random_floats(size_t(Hv), seed, 0.5f), dt_bias = random_floats(size_t(Hv), seed + 1, 0.5f);
  std::vector<float> S_host = random_floats(size_t(Hv) * kD * kD, seed + 2, 0.1f);
  DeviceArray<float> A_log_d(A_log), dt_bias_d(dt_bias), S(S_host);
  for (size_t call = 0; call < lengths.size(); ++call) {
    const int n = lengths[call];
    const uint32_t s = seed + 10 + uint32_t(call) * 5;
    auto u = random_floats(size_t(n) * C, s);
    const auto b = random_floats(size_t(n) * Hv, s + 1), a = random_floats(size_t(n) * Hv, s + 2);
    for (int t = 0; t < n; ++t)
      for (int head = 0; head < 2 * Hk; ++head) {  // q heads (times 1/sqrt(128)), then k heads
        float* x = &u[size_t(t) * C + head * kD];
        double ss = 0;
        for (int i = 0; i < kD; ++i) ss += double(x[i]) * x[i];
        const float inv = 1.f / std::sqrt(float(ss) + 1e-6f) * (head < Hk ? 1.f / std::sqrt(float(kD)) : 1.f);
        for (int i = 0; i < kD; ++i) x[i] *= inv;
      }
    std::vector<float> beta(size_t(n) * Hv), g(size_t(n) * Hv), want(size_t(n) * Hv * kD);
    for (size_t i = 0; i < beta.size(); ++i) {
      const size_t h = i % size_t(Hv);
      beta[i] = cpu::sigmoid(b[i]);
      g[i] = -std::exp(A_log[h]) * cpu::softplus(a[i] + dt_bias[h]);
    }
    for (int h = 0; h < Hv; ++h) {
      const int kh = h / (Hv / Hk);
      cpu::DeltaRuleInputs dr{u.data() + kh * kD,
                              u.data() + key_dim + kh * kD,
                              u.data() + 2 * key_dim + h * kD,
                              g.data() + h,
                              beta.data() + h,
                              C,
                              C,
                              C,
                              Hv,
                              n,
                              kD,
                              kD};
      cpu::delta_rule_recurrent(dr, S_host.data() + size_t(h) * kD * kD, want.data() + h * kD, Hv * kD);
    }
    DeviceArray<float> u_d(u), b_d(b), a_d(a), o(size_t(n) * Hv * kD);
    DeviceArray<char> scratch(cuda::delta_rule_chunked_scratch_bytes(n, Hv));
    o.poison();
    scratch.poison();
    cuda::DeltaRuleChunkedArgs args;
    args.n = n, args.num_key_heads = Hk, args.num_value_heads = Hv, args.conv_dim = C;
    args.u = u_d.get(), args.b = b_d.get(), args.a = a_d.get(), args.A_log = A_log_d.get();
    args.dt_bias = dt_bias_d.get(), args.ssm_state = S.get(), args.o = o.get(), args.scratch = scratch.get();
    cuda::delta_rule_chunked(args, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    SCOPED_TRACE(testing::Message() << "Hk " << Hk << " Hv " << Hv << " call " << call << " n " << n);
    EXPECT_LT(relative_error(o.download(), want), kTf32Tolerance) << "raw o";
    EXPECT_LT(relative_error(S.download(), S_host), kTf32Tolerance) << "ssm state";
  }
}

TEST(CudaDeltaNet, ChunkedRuleRawOutputs) {
  REQUIRE_GPU();
  check_chunked_rule(2, 4, kLengths, 41);  // one state carried through all the calls
  check_chunked_rule(16, 32, {1, 2, 63, 64, 65, 129, 1000}, 43);
}

// ---- The recurrent scan (DeltaRulePrefill::recurrent), kept to be measured against -------------

TEST(CudaDeltaNet, RecurrentPrefill) {
  REQUIRE_GPU();
  for (int T : {2, 63, 64, 65, 513}) check_blocks(2, 4, {T}, 35 + uint32_t(T), Mode::recurrent);
  for (int T : {2, 65, 200}) check_blocks(16, 32, {T}, 37 + uint32_t(T), Mode::recurrent);
  check_blocks(2, 4, {65, 1, 100, 1}, 39, Mode::recurrent);
}

// A batch step (gated_deltanet_decode_rows): one token of each of N sequences, each with its own
// random conv and recurrent state (from tables), against the host reference row by row: every
// row's y and both its states after the step, then a second step on the states the first left.
// N = 1, 3 and 16 (the most a step takes), at the model's heads (Hk 16, Hv 32) and two v-heads to a
// key head's smaller layer.
TEST(CudaDeltaNet, RowsOfSeveralSequences) {
  REQUIRE_GPU();
  for (const auto& [Hk, Hv] : {std::pair{16, 32}, std::pair{2, 4}})
    for (int N : {1, 3, 16}) {
      SCOPED_TRACE(testing::Message() << "Hk " << Hk << " Hv " << Hv << " rows " << N);
      const Layer layer(Hk, Hv, 70);
      std::vector<State> host;
      std::vector<std::unique_ptr<GpuLayer>> gpu;
      for (int r = 0; r < N; ++r) {
        host.push_back(random_state(layer, 80 + uint32_t(r) * 2));
        gpu.push_back(std::make_unique<GpuLayer>(layer, host.back()));
      }
      std::vector<float*> convs, ssms;
      for (auto& g : gpu) convs.push_back(g->conv.get()), ssms.push_back(g->ssm.get());
      DeviceArray<float*> d_conv(convs), d_ssm(ssms);
      const cuda::DeltaNetRows rows{d_conv.get(), d_ssm.get()};
      for (int step = 0; step < 2; ++step) {
        std::vector<float> mixed, z, b, a, want;
        for (int r = 0; r < N; ++r) {
          const Inputs in(layer, 1, 200 + uint32_t(r) * 5 + uint32_t(step) * 1000);
          mixed.insert(mixed.end(), in.mixed.begin(), in.mixed.end());
          z.insert(z.end(), in.z.begin(), in.z.end());
          b.insert(b.end(), in.b.begin(), in.b.end());
          a.insert(a.end(), in.a.begin(), in.a.end());
          const auto w = reference(layer, host[size_t(r)], in, 1);
          want.insert(want.end(), w.begin(), w.end());
        }
        DeviceArray<float> d_mixed(mixed), d_z(z), d_b(b), d_a(a), y(want.size());
        y.poison();
        cuda::gated_deltanet_decode_rows(gpu[0]->params(1), rows, N, d_mixed.get(), d_z.get(), d_b.get(), d_a.get(),
                                         y.get(), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<float> got = y.download();
        const size_t width = size_t(Hv) * kD;
        for (int r = 0; r < N; ++r) {
          SCOPED_TRACE(testing::Message() << "row " << r << " step " << step);
          const std::vector<float> g(got.begin() + long(size_t(r) * width), got.begin() + long(size_t(r + 1) * width)),
              w(want.begin() + long(size_t(r) * width), want.begin() + long(size_t(r + 1) * width));
          EXPECT_LT(relative_error(g, w), kTolerance) << "y";
          EXPECT_LT(relative_error(gpu[size_t(r)]->conv.download(), host[size_t(r)].conv), kTolerance) << "conv state";
          EXPECT_LT(relative_error(gpu[size_t(r)]->ssm.download(), host[size_t(r)].ssm), kTolerance) << "ssm state";
        }
      }
    }
}

}  // namespace
}  // namespace lily::test
