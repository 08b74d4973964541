// Golden tests: the CPU forward against transformers (fp32) on checkpoints of the exact
// architecture in all three layouts (tools/make_fixtures.py, tests/fixtures/models/README.md).
//
// Tolerance (issue 2): max |lily - reference| <= 1e-3 * max |reference| and the same argmax
// at every position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "fixture.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily {
namespace {

struct Reference {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [T, V]
  int64_t vocab = 0;
  std::vector<int32_t> greedy_prompt, greedy;
};

Reference load_reference(const std::string& fixture, const std::string& which) {
  std::string dir = test::fixture_dir(fixture);
  auto ref = test::read_json(dir + "/reference.json");
  Reference r;
  r.ids = ref["ids"].get<std::vector<int32_t>>();
  r.vocab = ref["vocab_size"].get<int64_t>();
  r.logits = test::read_f32(dir + "/" + ref["logits"][which].get<std::string>());
  r.greedy_prompt = ref["greedy_prompt"].get<std::vector<int32_t>>();
  r.greedy = ref["greedy_" + which].get<std::vector<int32_t>>();
  return r;
}

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

struct Comparison {
  double max_abs_diff = 0, max_abs_ref = 0;
  int64_t argmax_mismatches = 0;
};

Comparison compare(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  Comparison c;
  for (size_t i = 0; i < want.size(); ++i) {
    c.max_abs_diff = std::max(c.max_abs_diff, double(std::fabs(got[i] - want[i])));
    c.max_abs_ref = std::max(c.max_abs_ref, double(std::fabs(want[i])));
    if (std::isnan(got[i])) c.max_abs_diff = INFINITY;
  }
  for (size_t t = 0; t < want.size() / size_t(vocab); ++t)
    c.argmax_mismatches += argmax(&got[t * size_t(vocab)], vocab) != argmax(&want[t * size_t(vocab)], vocab);
  return c;
}

struct Layout {
  const char* dir;
  const char* reference;  // which reference logits: hf or mlx (dequantized weights)
};

class GoldenTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GoldenTest, LogitsMatchTransformersAtEveryPosition) {
  const Layout layout = GetParam();
  auto weights = load_model(test::fixture_dir("tiny-a") + "/" + layout.dir);
  Reference ref = load_reference("tiny-a", layout.reference);
  auto backend = make_cpu_backend(weights);
  auto seq = backend->new_sequence(4096);
  std::vector<float> logits;
  backend->forward(*seq, ref.ids, LogitsWanted::all, logits);
  ASSERT_EQ(logits.size(), ref.logits.size());
  Comparison c = compare(logits, ref.logits, ref.vocab);
  RecordProperty("max_abs_diff", std::to_string(c.max_abs_diff));
  std::printf("[%s] max |diff| = %.3g, max |ref| = %.3g, relative %.3g, argmax mismatches %lld of %zu\n", layout.dir,
              c.max_abs_diff, c.max_abs_ref, c.max_abs_diff / c.max_abs_ref, (long long)c.argmax_mismatches,
              ref.ids.size());
  EXPECT_LE(c.max_abs_diff, 1e-3 * c.max_abs_ref);
  EXPECT_EQ(c.argmax_mismatches, 0);
}

TEST_P(GoldenTest, PrefillInPiecesThenDecodeEqualsOneForward) {
  const Layout layout = GetParam();
  auto weights = load_model(test::fixture_dir("tiny-a") + "/" + layout.dir);
  Reference ref = load_reference("tiny-a", layout.reference);
  auto backend = make_cpu_backend(weights);
  const int64_t V = ref.vocab, T = int64_t(ref.ids.size());

  auto whole = backend->new_sequence(4096);
  std::vector<float> all;
  backend->forward(*whole, ref.ids, LogitsWanted::all, all);

  // Pieces across the 64-token chunk boundary of the delta rule, then one token at a time.
  auto pieces = backend->new_sequence(4096);
  const std::vector<int64_t> cuts = {0, 1, 63, 65, 130, 131, T - 5};
  std::vector<float> out;
  int64_t pos = 0;
  std::vector<float> got(size_t(T * V));
  auto run = [&](int64_t n) {
    std::span<const int32_t> piece(ref.ids.data() + pos, size_t(n));
    backend->forward(*pieces, piece, LogitsWanted::all, out);
    std::copy(out.begin(), out.end(), got.begin() + pos * V);
    pos += n;
  };
  for (size_t i = 1; i < cuts.size(); ++i) run(cuts[i] - cuts[i - 1]);
  while (pos < T) run(1);
  EXPECT_EQ(pieces->length(), T);
  Comparison c = compare(got, all, V);
  EXPECT_LE(c.max_abs_diff, 1e-4 * c.max_abs_ref) << "pieces vs one forward";
  EXPECT_EQ(c.argmax_mismatches, 0);
}

TEST_P(GoldenTest, GreedyDecodeMatchesTransformers) {
  const Layout layout = GetParam();
  auto weights = load_model(test::fixture_dir("tiny-a") + "/" + layout.dir);
  Reference ref = load_reference("tiny-a", layout.reference);
  auto backend = make_cpu_backend(weights);
  auto seq = backend->new_sequence(4096);
  std::vector<float> logits;
  backend->forward(*seq, ref.greedy_prompt, LogitsWanted::last, logits);
  std::vector<int32_t> generated;
  for (size_t i = 0; i < ref.greedy.size(); ++i) {
    int32_t next = int32_t(argmax(logits.data(), ref.vocab));
    generated.push_back(next);
    backend->forward(*seq, std::span<const int32_t>(&next, 1), LogitsWanted::last, logits);
  }
  EXPECT_EQ(generated, ref.greedy);
}

TEST_P(GoldenTest, SnapshotRestoreReplaysIdentically) {
  const Layout layout = GetParam();
  auto weights = load_model(test::fixture_dir("tiny-a") + "/" + layout.dir);
  Reference ref = load_reference("tiny-a", layout.reference);
  auto backend = make_cpu_backend(weights);
  auto seq = backend->new_sequence(4096);
  std::vector<float> first, second, ignored;
  std::span<const int32_t> ids(ref.ids);
  backend->forward(*seq, ids.subspan(0, 70), LogitsWanted::none, ignored);
  auto snap = seq->snapshot();
  auto copy = seq->clone();
  backend->forward(*seq, ids.subspan(70, 30), LogitsWanted::all, first);
  backend->forward(*seq, ids.subspan(100, 10), LogitsWanted::none, ignored);  // diverge further
  seq->restore(*snap);
  EXPECT_EQ(seq->length(), 70);
  backend->forward(*seq, ids.subspan(70, 30), LogitsWanted::all, second);
  EXPECT_EQ(first, second) << "restore must give bit-identical results";
  std::vector<float> from_clone;
  backend->forward(*copy, ids.subspan(70, 30), LogitsWanted::all, from_clone);
  EXPECT_EQ(first, from_clone) << "clone must give bit-identical results";
}

INSTANTIATE_TEST_SUITE_P(Layouts, GoldenTest,
                         ::testing::Values(Layout{"hf-fused", "hf"}, Layout{"hf-per-expert", "hf"},
                                           Layout{"mlx-q4", "mlx"}),
                         [](const auto& info) {
                           std::string n = info.param.dir;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(GoldenLoad, LayoutsAreRecognised) {
  auto hf = load_model(test::fixture_dir("tiny-a") + "/hf-fused");
  auto mlx = load_model(test::fixture_dir("tiny-a") + "/mlx-q4");
  EXPECT_EQ(hf->layout, CheckpointLayout::hf);
  EXPECT_TRUE(hf->mtp.has_value());
  EXPECT_FALSE(mlx->mtp.has_value());  // mlx conversions drop mtp.*
  EXPECT_FALSE(hf->layers[0].moe.experts.gate_proj[0].quantized());
  EXPECT_EQ(mlx->layout, CheckpointLayout::mlx);
  EXPECT_TRUE(mlx->layers[0].moe.experts.gate_proj[0].quantized());
  EXPECT_EQ(mlx->layers[0].moe.experts.gate_proj[0].bits, 4);
  EXPECT_EQ(mlx->layers[0].moe.router.bits, 8);
  EXPECT_EQ(mlx->embed_tokens.bits, 4);
  // The same model: norms agree (mlx stores 1 + w rounded to bf16).
  for (size_t i = 0; i < hf->final_norm.size(); ++i) EXPECT_NEAR(hf->final_norm[i], mlx->final_norm[i], 1e-2);
  EXPECT_EQ(hf->parameter_count(), mlx->parameter_count());
}

// --quantize q4 on the HF checkpoint computes the same codes, scales and biases as the mlx
// conversion (both follow MLX's affine quantizer), matrix by matrix.
TEST(GoldenLoad, QuantizeAtLoadMatchesMlxConversion) {
  LoadOptions options;
  options.quantize_bits = 4;
  auto q = load_model(test::fixture_dir("tiny-a") + "/hf-fused", options);
  auto mlx = load_model(test::fixture_dir("tiny-a") + "/mlx-q4");
  auto check = [](const Matrix& a, const Matrix& b, const std::string& name) {
    ASSERT_TRUE(a.quantized()) << name;
    ASSERT_EQ(a.bits, b.bits) << name;
    ASSERT_EQ(a.rows, b.rows) << name;
    std::vector<float> ra(size_t(a.cols)), rb(size_t(b.cols));
    int64_t differ = 0;
    for (int64_t r = 0; r < a.rows; ++r) {
      a.dequantize_row(r, ra.data());
      b.dequantize_row(r, rb.data());
      for (int64_t c = 0; c < a.cols; ++c) differ += ra[size_t(c)] != rb[size_t(c)];
    }
    // A value may differ where rounding lands exactly between two codes; allow 1 in 1000.
    EXPECT_LE(differ, a.rows * a.cols / 1000)
        << name << ": " << differ << " of " << a.rows * a.cols << " values differ";
  };
  check(q->embed_tokens, mlx->embed_tokens, "embed_tokens");
  check(q->lm_head, mlx->lm_head, "lm_head");
  for (size_t i = 0; i < q->layers.size(); ++i) {
    const auto &lq = q->layers[i], &lm = mlx->layers[i];
    check(lq.moe.router, lm.moe.router, "router");
    check(lq.moe.shared_expert_gate, lm.moe.shared_expert_gate, "shared_expert_gate");
    check(lq.moe.experts.down_proj[3], lm.moe.experts.down_proj[3], "experts.3.down_proj");
    check(lq.moe.experts.up_proj[5], lm.moe.experts.up_proj[5], "experts.5.up_proj");
    if (lq.kind == LayerKind::full_attention) check(lq.attention.q_proj, lm.attention.q_proj, "q_proj");
    else check(lq.deltanet.in_proj_qkv, lm.deltanet.in_proj_qkv, "in_proj_qkv");
  }
}

}  // namespace
}  // namespace lily
