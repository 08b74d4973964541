// The whole model on the GPU against the CPU backend and the transformers reference
// (issue 6): max |gpu - reference| <= 2e-2 * max |reference|, the same arg max at >= 99% of
// positions, and greedy decoding that matches; the decode step the kernel plan describes is the
// one captured, and bench's decode-skip leaves out exactly the launches of its parts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "../model/fixture.h"
#include "../runtime/candidate_backends.h"
#include "backend/backend.h"
#include "backend/cuda/bench/cuda_bench.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/checkpoint/load.h"
#include "tokenizer/tokenizer.h"

namespace lily {
namespace {

std::string fixture(const std::string& rel) { return test::fixture_dir("tiny-a") + "/" + rel; }

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

struct Layout {
  const char* dir;
  const char* reference;
};

class CudaForward : public ::testing::TestWithParam<Layout> {};

// Per position: max over the vocabulary of |a - b|.
std::vector<double> position_max_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t T, int64_t V) {
  std::vector<double> d(size_t(T), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < V; ++i)
      d[size_t(t)] = std::max(d[size_t(t)], double(std::fabs(a[size_t(t * V + i)] - b[size_t(t * V + i)])));
  return d;
}

// Positions whose max |diff| exceeds `bound`.
int64_t count_above(const std::vector<double>& d, double bound) {
  return std::count_if(d.begin(), d.end(), [&](double v) { return v > bound; });
}

// Logits of every position, one decode step (T = 1) at a time: the decode kernels, fp32-level
// arithmetic from the 4-bit weights.
std::vector<float> decode_steps(Backend& b, const std::vector<int32_t>& ids, int64_t capacity) {
  auto s = b.new_sequence(capacity);
  std::vector<float> all, row;
  for (int32_t id : ids) {
    b.forward(*s, std::span<const int32_t>(&id, 1), LogitsWanted::last, row);
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

void print_worst(const char* what, const std::vector<double>& d) {
  std::vector<std::pair<double, size_t>> w;
  for (size_t t = 0; t < d.size(); ++t) w.emplace_back(d[t], t);
  std::sort(w.rbegin(), w.rend());
  std::printf("%s worst positions:", what);
  for (size_t i = 0; i < std::min<size_t>(5, w.size()); ++i) std::printf(" %zu (%.3g)", w[i].second, w[i].first);
  std::printf("; median %.3g\n", w[w.size() / 2].first);
}

// Prefill on the tensor cores rounds every GEMM input to bf16 (~1e-3 relative per product).
// On this random fixture the routers are nearly uniform, so that rounding flips a near-tie
// expert choice now and then (one token takes other experts and its logits move by ~0.2 x max,
// the next few tokens a little): measured at 1 token of 150 (position 23). So here the decode
// steps (fp32-level arithmetic, one token at a time through the same caches) must meet the bound
// everywhere, which separates rounding from errors, and the tensor-core prefill gets a sanity bound
// (arg max >= 95%, median position within 2e-2 x max). The strict bound on the tensor-core prefill
// is checked on the trained lily-tiny (CudaForwardLilyTiny.TensorCorePrefillMatchesCpu).
TEST_P(CudaForward, LogitsMatchReferenceAndCpu) {
  REQUIRE_GPU();
  const Layout layout = GetParam();
  auto ref_json = test::read_json(fixture("reference.json"));
  std::vector<int32_t> ids = ref_json["ids"].get<std::vector<int32_t>>();
  const int64_t V = ref_json["vocab_size"].get<int64_t>(), T = int64_t(ids.size());
  std::vector<float> ref = test::read_f32(fixture(ref_json["logits"][layout.reference].get<std::string>()));

  auto weights = load_model(fixture(layout.dir));
  auto gpu = make_cuda_backend(weights);
  auto cpu = make_cpu_backend(weights);
  std::vector<float> c;
  auto cs = cpu->new_sequence(4096);
  cpu->forward(*cs, ids, LogitsWanted::all, c);
  double max_ref = 0;
  for (float v : ref) max_ref = std::max(max_ref, double(std::fabs(v)));

  for (bool steps : {true, false}) {
    SCOPED_TRACE(steps ? "decode steps" : "tensor-core prefill");
    std::vector<float> g;
    if (steps) {
      g = decode_steps(*gpu, ids, 4096);
    } else {
      auto gs = gpu->new_sequence(4096);
      gpu->forward(*gs, ids, LogitsWanted::all, g);
    }
    ASSERT_EQ(g.size(), ref.size());
    for (size_t i = 0; i < g.size(); ++i) ASSERT_FALSE(std::isnan(g[i])) << "NaN at " << i;
    // The GPU runs the bf16 KV cache and (for HF layouts) weights quantized to 4 bits at
    // upload, so it is compared with the CPU backend running the same 4-bit weights where the
    // checkpoint is mlx, and with the reference of the same weights.
    const auto d_ref = position_max_diff(g, ref, T, V), d_cpu = position_max_diff(g, c, T, V);
    int64_t agree_ref = 0;
    for (int64_t t = 0; t < T; ++t) agree_ref += argmax(&g[size_t(t * V)], V) == argmax(&ref[size_t(t * V)], V);
    const double max_diff_ref = *std::max_element(d_ref.begin(), d_ref.end());
    const double max_diff_cpu = *std::max_element(d_cpu.begin(), d_cpu.end());
    std::printf("[%s, %s] gpu vs reference: max |diff| %.4g (%.4g of max |ref| %.4g), argmax agreement %lld/%lld; "
                "gpu vs cpu: %.4g; positions over 2e-2 x max |ref|: %lld\n",
                layout.dir, steps ? "decode steps" : "tensor cores", max_diff_ref, max_diff_ref / max_ref, max_ref,
                (long long)agree_ref, (long long)T, max_diff_cpu, (long long)count_above(d_ref, 2e-2 * max_ref));
    print_worst(steps ? "  decode steps" : "  tensor cores", d_ref);
    if (std::string(layout.dir) != "mlx-q4") continue;
    if (steps) {
      EXPECT_GE(double(agree_ref), 0.99 * double(T));
      EXPECT_LE(max_diff_ref, 2e-2 * max_ref);
      EXPECT_LE(max_diff_cpu, 2e-2 * max_ref);
    } else {
      EXPECT_GE(double(agree_ref), 0.95 * double(T));
      EXPECT_LE(double(count_above(d_ref, 2e-2 * max_ref)), 0.5 * double(T));
    }
  }
}

TEST_P(CudaForward, GreedyDecodeMatchesCpuOnTheSameWeights) {
  REQUIRE_GPU();
  const Layout layout = GetParam();
  if (std::string(layout.dir) != "mlx-q4") GTEST_SKIP() << "4-bit on both sides only for the mlx layout";
  auto ref_json = test::read_json(fixture("reference.json"));
  std::vector<int32_t> prompt = ref_json["greedy_prompt"].get<std::vector<int32_t>>();
  std::vector<int32_t> expected = ref_json["greedy_mlx"].get<std::vector<int32_t>>();
  auto weights = load_model(fixture(layout.dir));
  auto gpu = make_cuda_backend(weights);
  const int64_t V = weights->config.vocab_size;

  // The prompt as the CPU computes it (fp32-level: decode steps; see above). Then through the
  // host-sampling path (forward per token) ...
  auto s = gpu->new_sequence(256);
  std::vector<float> logits;
  for (int32_t id : prompt) gpu->forward(*s, std::span<const int32_t>(&id, 1), LogitsWanted::last, logits);
  std::vector<int32_t> host_path;
  for (size_t i = 0; i < expected.size(); ++i) {
    int32_t next = int32_t(argmax(logits.data(), V));
    host_path.push_back(next);
    gpu->forward(*s, std::span<const int32_t>(&next, 1), LogitsWanted::last, logits);
  }
  EXPECT_EQ(host_path, expected);

  // ... and through the on-device greedy loop (graph replay, token written on the GPU).
  auto s2 = gpu->new_sequence(256);
  for (size_t i = 0; i + 1 < prompt.size(); ++i)
    gpu->forward(*s2, std::span<const int32_t>(&prompt[i], 1), LogitsWanted::none, logits);
  std::vector<int32_t> device_path = gpu->decode_greedy(*s2, prompt.back(), int(expected.size()));
  EXPECT_EQ(device_path, expected);
}

// Token-by-token decode (T = 1: the fused decode kernels, rms_norm_gemv over the concatenated
// projections, graph replay) against one prefill of the same tokens (T > 1: gemm_q4 on the
// tensor cores with bf16 inputs, the grouped MoE), row by row, and against the CPU backend's
// decode. Decode computes in fp32 from the 4-bit weights; prefill rounds every GEMM input to
// bf16 (~1e-3 relative per product), hence the looser bound between the two.
TEST_P(CudaForward, DecodeStepsMatchPrefill) {
  REQUIRE_GPU();
  const Layout layout = GetParam();
  auto ref_json = nlohmann::json::parse(std::ifstream(fixture("reference.json")));
  std::vector<int32_t> ids = ref_json["ids"].get<std::vector<int32_t>>();
  ids.resize(std::min<size_t>(ids.size(), 40));
  auto weights = load_model(fixture(layout.dir));
  auto gpu = make_cuda_backend(weights);
  auto cpu = make_cpu_backend(weights);
  const int64_t V = weights->config.vocab_size, T = int64_t(ids.size());
  std::vector<float> prefill;
  gpu->forward(*gpu->new_sequence(256), ids, LogitsWanted::all, prefill);
  const std::vector<float> steps = decode_steps(*gpu, ids, 256), cpu_steps = decode_steps(*cpu, ids, 256);
  ASSERT_EQ(steps.size(), size_t(T * V));
  for (float v : steps) ASSERT_FALSE(std::isnan(v));
  double max_ref = 0;
  for (float v : cpu_steps) max_ref = std::max(max_ref, double(std::fabs(v)));
  const auto d_tc = position_max_diff(steps, prefill, T, V), d_cpu = position_max_diff(steps, cpu_steps, T, V);
  const double max_cpu = *std::max_element(d_cpu.begin(), d_cpu.end());
  std::printf("[%s] decode vs tensor-core prefill: max |diff| %.4g of max |logit| %.4g (positions over 2e-2 x max: "
              "%lld); decode vs cpu decode: %.4g\n",
              layout.dir, *std::max_element(d_tc.begin(), d_tc.end()), max_ref,
              (long long)count_above(d_tc, 2e-2 * max_ref), max_cpu);
  EXPECT_LE(double(count_above(d_tc, 2e-2 * max_ref)), 0.5 * double(T));  // sanity (see above)
  if (std::string(layout.dir) == "mlx-q4") {
    EXPECT_LE(max_cpu, 2e-2 * max_ref);
  }
}

// Forwards of 2 to 4 tokens are passes (from the plan's prefill.decode_steps_below), the state
// carried between them: every row of logits in its place (LogitsWanted::all), the last one alone
// (last) within 1e-2 of max |logit| of all's last row, and the rows against the decode steps' as
// DecodeStepsMatchPrefill holds one pass (lily-tiny's TensorCorePrefillMatchesCpu holds such
// passes to the CPU's logits at the strict bound).
TEST_P(CudaForward, ShortForwardsArePasses) {
  REQUIRE_GPU();
  const Layout layout = GetParam();
  auto ref_json = nlohmann::json::parse(std::ifstream(fixture("reference.json")));
  std::vector<int32_t> ids = ref_json["ids"].get<std::vector<int32_t>>();
  ids.resize(std::min<size_t>(ids.size(), 24));
  auto weights = load_model(fixture(layout.dir));
  auto gpu = make_cuda_backend(weights);
  const size_t V = size_t(weights->config.vocab_size);
  const std::vector<float> steps = decode_steps(*gpu, ids, 256);
  double max_ref = 0;
  for (float v : steps) max_ref = std::max(max_ref, double(std::fabs(v)));
  auto s = gpu->new_sequence(256), s_last = gpu->new_sequence(256);
  std::vector<float> all, rows, last;
  size_t t = 0;
  for (size_t piece = 0; t < ids.size(); ++piece) {
    const size_t n = std::min(ids.size() - t, size_t(2 + piece % 3));  // 2, 3, 4, 2, ...
    const std::span<const int32_t> part(ids.data() + t, n);
    gpu->forward(*s, part, LogitsWanted::all, rows);
    gpu->forward(*s_last, part, LogitsWanted::last, last);
    ASSERT_EQ(rows.size(), n * V);
    ASSERT_EQ(last.size(), V);
    // last's row comes from the decode lm_head kernel, all's from the prefill GEMM: both round x
    // and the weights to bf16, in different orders (measured 0.0044 of max |logit| 6.3).
    double diff = 0, top = 0;
    for (size_t i = 0; i < V; ++i) {
      diff = std::max(diff, double(std::fabs(last[i] - rows[(n - 1) * V + i])));
      top = std::max(top, double(std::fabs(last[i])));
    }
    ASSERT_LE(diff, 1e-2 * top) << "piece " << piece;
    for (float v : rows) ASSERT_FALSE(std::isnan(v)) << "piece " << piece;
    all.insert(all.end(), rows.begin(), rows.end());
    t += n;
  }
  const int64_t T = int64_t(ids.size());
  const auto d = position_max_diff(all, steps, T, int64_t(V));
  std::printf("[%s] passes of 2-4 tokens vs decode steps: max |diff| %.4g of max |logit| %.4g (positions over 2e-2 x "
              "max: %lld)\n",
              layout.dir, *std::max_element(d.begin(), d.end()), max_ref, (long long)count_above(d, 2e-2 * max_ref));
  EXPECT_LE(double(count_above(d, 2e-2 * max_ref)), 0.5 * double(T));  // as DecodeStepsMatchPrefill
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaForward, ::testing::Values(Layout{"hf-fused", "hf"}, Layout{"mlx-q4", "mlx"}),
                         [](const auto& info) {
                           std::string n = info.param.dir;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// The embedded model: 64 greedy tokens on the GPU equal the CPU backend's.
TEST(CudaForwardLilyTiny, Greedy64MatchesCpu) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  auto gpu = make_cuda_backend(weights);
  auto cpu = make_cpu_backend(weights);
  std::vector<int32_t> prompt = {4001, 882, 198, 1532, 3, 220, 24, 19, 22, 10, 18, 22, 22, 4002, 198, 4001, 77, 198};
  for (int32_t& t : prompt) t = std::min<int32_t>(t, weights->config.vocab_size - 1);
  auto run = [&](Backend& b) {
    auto s = b.new_sequence(256);
    std::vector<float> logits;
    // A decode test: the prompt as the CPU computes it (fp32-level), one step at a time.
    for (int32_t id : prompt) b.forward(*s, std::span<const int32_t>(&id, 1), LogitsWanted::last, logits);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      int32_t next = int32_t(argmax(logits.data(), weights->config.vocab_size));
      out.push_back(next);
      b.forward(*s, std::span<const int32_t>(&next, 1), LogitsWanted::last, logits);
    }
    return out;
  };
  std::vector<int32_t> g = run(*gpu), c = run(*cpu);
  int first_diff = -1;
  for (int i = 0; i < 64; ++i)
    if (g[size_t(i)] != c[size_t(i)]) {
      first_diff = i;
      break;
    }
  std::printf("lily-tiny greedy 64: first divergence at %d\n", first_diff);
  EXPECT_EQ(g, c);
}

// Backend::chain_tokens on the GPU (steps chained there, each token chosen by choose_token)
// against the same steps one at a time on the host (each step's logits, the penalties, the
// selection and draw of candidate_backends.h: what generate() does without chains): the same
// tokens, greedy and sampled, with and without penalties, over the whole vocabulary and below a
// limit. A chain left early leaves the state holding its first token and every token returned:
// a probe token then gives the logits of a sequence stepped through exactly those.
TEST(CudaForwardLilyTiny, ChainsMatchStepwiseCandidates) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  CudaBackendOptions chained;
  chained.plan_edits = {"chain=1"};  // as the default plan has it (a test of the chain whatever the default)
  auto gpu = make_cuda_backend(weights, chained);
  const int32_t V = weights->config.vocab_size;
  const std::vector<int32_t> prompt = {11, 882, 198, 1532, 3, 220, 24, 19, 22, 10, 18, 22};
  const int steps = 40;
  auto start = [&] {
    auto s = gpu->new_sequence(256);
    std::vector<float> unused;
    gpu->forward(*s, prompt, LogitsWanted::none, unused);
    return s;
  };
  auto choice = [](int count, int32_t limit, DrawParams draw, uint64_t seed, uint64_t first_draw,
                   Penalties penalties = {}, std::vector<int32_t> history = {}, int top_logprobs = -1) {
    return ChainChoice{count, limit, draw, seed, first_draw, penalties, std::move(history), nullptr, top_logprobs};
  };
  struct Case {
    const char* name;
    ChainChoice choice;
  };
  const Case cases[] = {
      {"greedy", choice(1, V, {0.0f, 1.0f, 0.0f}, 0, 0)},
      {"greedy below 1000", choice(1, 1000, {0.0f, 1.0f, 0.0f}, 0, 0)},
      {"qwen", choice(20, V, {0.6f, 0.95f, 0.0f}, 1234, 1)},
      {"hot, below 1500", choice(50, 1500, {2.0f, 1.0f, 0.0f}, 99, 5)},
      {"wide", choice(256, V, {1.5f, 1.0f, 0.01f}, 7, 1)},
      {"qwen, presence 1.5", choice(20, V, {1.0f, 0.95f, 0.0f}, 3, 1, {1.5f, 0.0f, 1.0f}, {1532})},
      {"greedy, presence -5", choice(1, V, {0.0f, 1.0f, 0.0f}, 0, 0, {-5.0f, 0.0f, 1.0f}, {1532, 9, 9})},
      {"greedy, repetition", choice(1, V, {0.0f, 1.0f, 0.0f}, 0, 0, {0.0f, 0.5f, 1.3f}, {})},
      {"qwen, presence, 5 logprobs", choice(20, 1500, {1.0f, 0.95f, 0.0f}, 3, 1, {1.5f, 0.0f, 1.0f}, {1532}, 5)},
      {"greedy, 0 logprobs", choice(1, V, {0.0f, 1.0f, 0.0f}, 0, 0, {}, {}, 0)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int32_t first = 1532;
    // One step at a time, on the host.
    auto ref = start();
    std::vector<int32_t> want;
    std::map<int32_t, int> counts;
    for (int32_t t : c.choice.history) ++counts[t];
    int32_t token = first;
    std::vector<float> row;
    std::vector<std::vector<float>> raw_rows;  // each step's logits before the penalties
    for (int i = 0; i < steps; ++i) {
      gpu->forward(*ref, std::span<const int32_t>(&token, 1), LogitsWanted::last, row);
      raw_rows.push_back(row);
      if (c.choice.penalties.any())
        for (auto [id, n] : counts) row[size_t(id)] = penalized_logit(row[size_t(id)], n, c.choice.penalties);
      token = test::choose_candidate(test::select_candidates(row, c.choice.count, c.choice.vocab_limit), c.choice,
                                     uint64_t(i));
      ++counts[token];
      want.push_back(token);
    }
    // Chained, to the end.
    auto s = start();
    std::vector<int32_t> got;
    {
      auto chain = gpu->chain_tokens(*s, first, steps, c.choice);
      ASSERT_NE(chain, nullptr);
      for (int i = 0; i < steps; ++i) {
        const ChainedToken t = chain->next();
        got.push_back(t.id);
        if (c.choice.top_logprobs < 0 || t.id != want[size_t(i)]) continue;
        // The raw row's log-softmax (a host loop in double): the pick's and the best ones'.
        const std::vector<float>& raw = raw_rows[size_t(i)];
        const int32_t n = c.choice.vocab_limit;
        const double best = *std::max_element(raw.begin(), raw.begin() + n);
        double total = 0;
        for (int32_t j = 0; j < n; ++j) total += std::exp(double(raw[size_t(j)]) - best);
        const double log_z = best + std::log(total);
        EXPECT_NEAR(t.logprob, double(raw[size_t(t.id)]) - log_z, 2e-5) << "token " << i;
        const auto best_ids = test::select_candidates(raw, c.choice.top_logprobs, n);
        ASSERT_EQ(t.top.size(), best_ids.size());
        for (size_t j = 0; j < best_ids.size(); ++j) {
          EXPECT_EQ(t.top[j].token, best_ids[j].token);
          EXPECT_NEAR(t.top[j].logit, double(best_ids[j].logit) - log_z, 2e-5);
        }
      }
      EXPECT_THROW(chain->next(), Error) << "past its steps";
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(s->length(), int64_t(prompt.size()) + steps) << "the first token and all but the last returned";
    for (int32_t t : got) EXPECT_LT(t, c.choice.vocab_limit);
    // Left after 5 tokens: the state holds the first and those 5.
    auto early = start();
    {
      auto chain = gpu->chain_tokens(*early, first, steps, c.choice);
      for (int i = 0; i < 5; ++i) ASSERT_EQ(chain->next().id, want[size_t(i)]);
    }
    ASSERT_EQ(early->length(), int64_t(prompt.size()) + 6);
    auto stepped = start();
    std::vector<float> a, b;
    std::vector<int32_t> fed = {first};
    fed.insert(fed.end(), want.begin(), want.begin() + 5);
    for (int32_t t : fed) gpu->forward(*stepped, std::span<const int32_t>(&t, 1), LogitsWanted::none, a);
    const int32_t probe = 77;
    gpu->forward(*stepped, std::span<const int32_t>(&probe, 1), LogitsWanted::last, a);
    gpu->forward(*early, std::span<const int32_t>(&probe, 1), LogitsWanted::last, b);
    EXPECT_EQ(a, b);
  }
}

// The tensor-core prefill (bf16 GEMM inputs, grouped MoE) against the CPU backend on the same
// 4-bit weights, every position of an 872-token text of nine conversations in the training
// format (tests/fixtures/eval/lily_tiny_conversations.txt): the bound, max |diff| <=
// 2e-2 x max |cpu| and the same arg max at >= 99% of positions, on a trained model (decisive
// routers); a prompt cut into passes of 64 tokens (14 passes, the last of one token) gives the
// same logits as one pass; and passes of 2 to 16 tokens (the few-row kernels) meet the bounds against the
// CPU too.
TEST(CudaForwardLilyTiny, TensorCorePrefillMatchesCpu) {
  REQUIRE_GPU();
  const std::string dir = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";
  auto weights = load_model(dir);
  std::ifstream in(std::string(LILY_SOURCE_DIR) + "/tests/fixtures/eval/lily_tiny_conversations.txt", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = Tokenizer::load_from_model_dir(dir).encode(text);
  const int64_t T = int64_t(ids.size()), V = weights->config.vocab_size;
  ASSERT_GT(T, 800);
  auto cpu = make_cpu_backend(weights);
  std::vector<float> c;
  cpu->forward(*cpu->new_sequence(T + 1), ids, LogitsWanted::all, c);
  double max_cpu = 0;
  for (float v : c) max_cpu = std::max(max_cpu, double(std::fabs(v)));
  auto gpu = make_cuda_backend(weights);
  std::vector<float> g;
  gpu->forward(*gpu->new_sequence(T + 1), ids, LogitsWanted::all, g);
  ASSERT_EQ(g.size(), c.size());
  const auto d = position_max_diff(g, c, T, V);
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) agree += argmax(&g[size_t(t * V)], V) == argmax(&c[size_t(t * V)], V);
  const double max_diff = *std::max_element(d.begin(), d.end());
  std::printf("[lily-tiny, tensor cores] gpu vs cpu over %lld tokens: max |diff| %.4g (%.4g of max |cpu| %.4g), arg "
              "max agreement %lld/%lld, positions over 2e-2 x max: %lld\n",
              (long long)T, max_diff, max_diff / max_cpu, max_cpu, (long long)agree, (long long)T,
              (long long)count_above(d, 2e-2 * max_cpu));
  print_worst("  tensor cores", d);
  EXPECT_LE(max_diff, 2e-2 * max_cpu);
  EXPECT_GE(double(agree), 0.99 * double(T));

  // Passes of 64 tokens: the caches carry the context from pass to pass, a last pass of one token.
  const std::vector<int32_t> head(ids.begin(), ids.begin() + 13 * 64 + 1);
  CudaBackendOptions options;
  options.prefill_chunk_tokens = 64;
  auto small_passes = make_cuda_backend(weights, options);
  std::vector<float> one, many;
  gpu->forward(*gpu->new_sequence(T + 1), head, LogitsWanted::all, one);
  small_passes->forward(*small_passes->new_sequence(T + 1), head, LogitsWanted::all, many);
  ASSERT_EQ(one.size(), many.size());
  const auto dp = position_max_diff(many, one, int64_t(head.size()), V);
  EXPECT_LE(*std::max_element(dp.begin(), dp.end()), 2e-2 * max_cpu) << "passes of 64 tokens against one pass";

  // Passes of 2 to 16 tokens (the few-row kernels, programmatic launches), every row against the
  // CPU's at the same bounds: as the plan has them (replayed as captured graphs, pass_graphs_up_to:
  // each length comes back two or three times, replays of one graph; the MoE of passes of up to 4
  // on the decode kernels, the rows a grid dimension, moe_slots_up_to), then with neither, and
  // with the slots at every length, with and without the graphs.
  const std::pair<const char*, std::vector<std::string>> variants[] = {
      {"passes of 2-16 tokens, graphs and MoE slots to 4 (the plan)", {}},
      {"passes of 2-16 tokens", {"pass_graphs_up_to=0", "moe_slots_up_to=0"}},
      {"passes of 2-16 tokens, MoE slots", {"pass_graphs_up_to=0", "moe_slots_up_to=16"}},
      {"passes of 2-16 tokens, graphs and MoE slots", {"moe_slots_up_to=16"}},
  };
  for (const auto& [what, edits] : variants) {
    SCOPED_TRACE(what);
    CudaBackendOptions variant;
    variant.plan_edits = edits;
    auto b = make_cuda_backend(weights, variant);
    auto s = b->new_sequence(T + 1);
    std::vector<float> rows;
    const size_t lengths[] = {5, 16, 2, 9, 12, 3, 8, 15, 4, 7, 11};
    size_t t = 0, short_agree = 0;
    double short_diff = 0;
    for (size_t piece = 0; t < 240; ++piece) {
      const size_t n = lengths[piece % std::size(lengths)];
      b->forward(*s, std::span<const int32_t>(ids.data() + t, n), LogitsWanted::all, rows);
      ASSERT_EQ(rows.size(), n * size_t(V));
      for (size_t i = 0; i < n; ++i) {
        const float* g_row = &rows[i * size_t(V)];
        const float* c_row = &c[(t + i) * size_t(V)];
        for (int64_t v = 0; v < V; ++v) short_diff = std::max(short_diff, double(std::fabs(g_row[v] - c_row[v])));
        short_agree += argmax(g_row, V) == argmax(c_row, V);
      }
      t += n;
    }
    std::printf("[lily-tiny, %s] gpu vs cpu over %zu tokens: max |diff| %.4g (%.4g of max |cpu|), arg max agreement "
                "%zu/%zu\n",
                what, t, short_diff, short_diff / max_cpu, short_agree, t);
    EXPECT_LE(short_diff, 2e-2 * max_cpu);
    EXPECT_GE(double(short_agree), 0.99 * double(t));
  }
}

// Counts the kernels of each captured decode step, after `inner` (decode-skip) has edited it.
class KernelCount final : public cuda::DecodeStepObserver {
 public:
  explicit KernelCount(cuda::DecodeStepObserver* inner) : inner_(inner) {}
  void begin(cuda::DecodePart part, cudaStream_t stream) override {
    if (inner_) inner_->begin(part, stream);
  }
  void end(cudaStream_t stream) override {
    if (inner_) inner_->end(stream);
  }
  void captured(cudaGraph_t graph) override {
    if (inner_) inner_->captured(graph);
    size_t n = 0;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
    std::vector<cudaGraphNode_t> nodes(n);
    ASSERT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
    kernels = 0;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
      kernels += type == cudaGraphNodeTypeKernel;
    }
  }
  int kernels = -1;

 private:
  cuda::DecodeStepObserver* inner_;
};

// The decode step the plan describes ("N launches") is the one captured; decode-skip (lily bench
// --decode-skip) leaves out exactly its parts' launches: per layer one input projection, one core
// launch (two for attention: split and combine), one output projection, three MoE launches.
TEST(CudaForwardLilyTiny, DecodeGraphIsThePlansAndSkipLeavesOutItsParts) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  auto gpu = make_cuda_backend(weights);
  const std::string plan = gpu->describe_kernels();
  std::printf("%s", plan.c_str());
  const size_t at = plan.find("decode step (");
  ASSERT_NE(at, std::string::npos);
  const int launches = std::stoi(plan.substr(at + 13));
  int deltanet = 0, attention = 0;
  for (LayerKind kind : weights->config.layer_types) (kind == LayerKind::full_attention ? attention : deltanet)++;
  EXPECT_EQ(launches, 1 + deltanet * 6 + attention * 7 + 3);
  struct Case {
    const char* skip;
    int left_out;
  };
  for (const Case& c : {Case{"", 0}, Case{"lm_head", 1}, Case{"moe", 3 * (deltanet + attention)},
                        Case{"mixer", deltanet + 2 * attention}, Case{"in_proj,out_proj", 2 * (deltanet + attention)},
                        Case{"embed,advance", 2}}) {
    SCOPED_TRACE(c.skip);
    std::unique_ptr<cuda::DecodeStepObserver> skip = *c.skip ? cuda::bench::decode_skip(c.skip) : nullptr;
    KernelCount count(skip.get());
    gpu->observe_decode_step(&count);
    auto s = gpu->new_sequence(16);
    gpu->decode_greedy(*s, 1, 2);  // captures this sequence's step, replays it
    gpu->observe_decode_step(nullptr);
    EXPECT_EQ(count.kernels, launches - c.left_out);
  }
  EXPECT_THROW(cuda::bench::decode_skip("in_proj,nonsense"), Error);
}

}  // namespace
}  // namespace lily
