// bench_cpu_fast: decode and prefill tokens/s of lily-tiny on the fast and the reference CPU
// backend, batch steps of N sequences and speculative verify steps of K + 1 rows with their
// rewind (lily-tiny, 4 full-size layers), and the GEMV kernels per
// instruction set and kind (fp32, integer) at the full-size model's shapes.
//
//   LILY_THREADS=2 build/bench/cpu_fast/bench_cpu_fast
//
// Decode: a 16-token prompt is prefilled once; each iteration restores the sequence to it and
// decodes 64 greedy tokens (the restore, a copy of the DeltaNet state, is inside the timing).
// items_per_second is decoded tokens/s. Prefill: a 128-token prompt. GEMV: bytes_per_second
// counts the weights read (codes + scales + biases) per product; GemvTeamFromMemory also
// reports the read bandwidth of the same threads (read_GBps), measured in the same run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <deque>
#include <random>

#include "backend/backend.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "backend/cpu_fast/gemm.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "backend/cpu_fast/machine_probe.h"
#include "model/checkpoint/load.h"
#include "model/quant.h"
#include "model/weights.h"
#include "runtime/cost_model.h"

namespace lily {
namespace {

constexpr int kDecodeTokens = 64;

std::shared_ptr<ModelWeights> lily_tiny() {
  static auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  return weights;
}

void decode(benchmark::State& state, bool fast) {
  auto weights = lily_tiny();
  auto backend = fast ? make_cpu_fast_backend(weights) : make_cpu_backend(weights);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) prompt.push_back(int32_t((i * 7919 + 13) % weights->config.vocab_size));
  auto seq = backend->new_sequence(int64_t(prompt.size()) + kDecodeTokens + 1);
  std::vector<float> prompt_logits, logits;
  backend->forward(*seq, prompt, LogitsWanted::last, prompt_logits);
  auto at_prompt = seq->snapshot();
  for (auto _ : state) {
    seq->restore(*at_prompt);
    logits = prompt_logits;
    for (int i = 0; i < kDecodeTokens; ++i) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      backend->forward(*seq, std::span<const int32_t>(&next, 1), LogitsWanted::last, logits);
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * kDecodeTokens);
}
void BM_DecodeLilyTinyFast(benchmark::State& state) { decode(state, true); }
void BM_DecodeLilyTinyReference(benchmark::State& state) { decode(state, false); }
BENCHMARK(BM_DecodeLilyTinyFast)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeLilyTinyReference)->Unit(benchmark::kMillisecond)->UseRealTime();

// The full-size geometry (qwen36_35b_a3b_config) cut to 4 layers (3 DeltaNet, 1 attention) and
// a 16 K vocabulary, random 4-bit weights (8-bit router): a decode step moves what 4 of the 40
// layers of the real model move, ~140 MB, far beyond L3. The 256 experts' storage (450 MB) is
// shared by the layers; the routed experts of a step still come from memory.
struct SyntheticStore {  // deques: a new buffer leaves the others where they are
  std::deque<std::vector<uint32_t>> codes;
  std::deque<std::vector<bf16>> params;
};

uint64_t next_random(uint64_t& s) {  // xorshift64*
  s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
  return s * 2685821657736338717ull;
}

Matrix synthetic_matrix(SyntheticStore& store, int64_t rows, int64_t cols, int bits, uint64_t seed) {
  auto& codes = store.codes.emplace_back(size_t(rows * cols * bits / 32));
  for (auto& w : codes) w = uint32_t(next_random(seed) >> 32);
  const float scale = 0.02f / float((1 << bits) - 1);
  auto& scales = store.params.emplace_back(size_t(rows * cols / 64), to_bf16(scale));
  auto& biases = store.params.emplace_back(size_t(rows * cols / 64), to_bf16(-0.01f));
  Matrix m;
  m.rows = rows, m.cols = cols, m.format = MatrixFormat::affine, m.bits = bits, m.group_size = 64;
  m.data = codes.data(), m.scales = scales.data(), m.biases = biases.data();
  return m;
}

std::shared_ptr<ModelWeights> full_size_layers() {
  static std::shared_ptr<ModelWeights> weights = [] {
    auto w = std::make_shared<ModelWeights>();
    auto store = std::make_shared<SyntheticStore>();
    ModelConfig c = qwen36_35b_a3b_config();
    c.num_layers = 4;
    c.layer_types = {LayerKind::linear_attention, LayerKind::linear_attention, LayerKind::linear_attention,
                     LayerKind::full_attention};
    c.vocab_size = 16384;
    const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    auto m = [&](int64_t rows, int64_t cols, int bits = 4) {
      return synthetic_matrix(*store, rows, cols, bits, ++seed);
    };
    w->config = c;
    w->embed_tokens = m(c.vocab_size, H);
    w->lm_head = m(c.vocab_size, H);
    w->final_norm.assign(size_t(H), 1.f);
    ExpertWeights experts;
    for (int64_t e = 0; e < E; ++e) {
      experts.gate_proj.push_back(m(I, H));
      experts.up_proj.push_back(m(I, H));
      experts.down_proj.push_back(m(H, I));
    }
    for (LayerKind kind : c.layer_types) {
      LayerWeights& l = w->layers.emplace_back();
      l.kind = kind;
      l.input_layernorm.assign(size_t(H), 1.f);
      l.post_attention_layernorm.assign(size_t(H), 1.f);
      if (kind == LayerKind::full_attention) {
        const int64_t d = c.head_dim;
        l.attention.q_proj = m(2 * c.num_attention_heads * d, H);
        l.attention.k_proj = m(c.num_key_value_heads * d, H);
        l.attention.v_proj = m(c.num_key_value_heads * d, H);
        l.attention.o_proj = m(H, c.num_attention_heads * d);
        l.attention.q_norm.assign(size_t(d), 1.f);
        l.attention.k_norm.assign(size_t(d), 1.f);
      } else {
        DeltaNetWeights& d = l.deltanet;
        const int64_t Hv = c.linear_num_value_heads;
        d.in_proj_qkv = m(c.linear_conv_dim(), H);
        d.in_proj_z = m(c.linear_value_dim(), H);
        d.in_proj_b = m(Hv, H);
        d.in_proj_a = m(Hv, H);
        d.out_proj = m(H, c.linear_value_dim());
        d.conv1d.assign(size_t(c.linear_conv_dim() * c.linear_conv_kernel_dim), 0.25f);
        d.A_log.assign(size_t(Hv), 0.f);
        d.dt_bias.assign(size_t(Hv), 0.f);
        d.norm.assign(size_t(c.linear_value_head_dim), 1.f);
      }
      l.moe.router = m(E, H, 8);
      l.moe.experts = experts;
      l.moe.shared_gate_proj = m(c.shared_expert_intermediate_size, H);
      l.moe.shared_up_proj = m(c.shared_expert_intermediate_size, H);
      l.moe.shared_down_proj = m(H, c.shared_expert_intermediate_size);
      l.moe.shared_expert_gate = m(1, H, 8);
    }
    w->storage.push_back(store);
    return w;
  }();
  return weights;
}

// Decode steps of the 4 full-size layers at depth 16: tokens/s, and the bytes a step moves
// (decode_bytes_per_token) per second beside the read bandwidth of the same threads. Arg: the
// instruction set of the products (cpu_fast::Isa: 1 avx2, 2 avx512).
void BM_DecodeFullSizeLayers(benchmark::State& state) {
  const auto isa = cpu_fast::Isa(state.range(0));
  if (!cpu_fast::isa_supported(isa)) {
    state.SkipWithError("this processor does not run the kernels");
    return;
  }
  cpu_fast::use_isa(isa);
  state.SetLabel(cpu_fast::to_string(isa));
  auto weights = full_size_layers();
  auto backend = make_cpu_fast_backend(weights);
  auto seq = backend->new_sequence(16 + 256);  // depth 16 .. 272: attention a small part of a step
  std::vector<float> logits;
  std::vector<int32_t> prompt(16, 7);
  backend->forward(*seq, prompt, LogitsWanted::none, logits);
  auto at_prompt = seq->snapshot();
  int32_t token = 1;
  int64_t steps = 0;
  for (auto _ : state) {
    if (seq->length() + 1 >= seq->capacity()) seq->restore(*at_prompt);
    backend->forward(*seq, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits);
    token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ++steps;
  }
  state.SetItemsProcessed(steps);
  state.SetBytesProcessed(int64_t(double(steps) * decode_bytes_per_token(weights->config, 16)));
  state.counters["read_GBps"] = cpu_fast::measure_read_bandwidth() / 1e9;
  cpu_fast::use_isa(cpu_fast::best_isa());
}
BENCHMARK(BM_DecodeFullSizeLayers)->Arg(2)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// Prefill of a 128-token prompt through the 4 full-size layers (llama-bench -p 128 runs 40):
// every expert of a layer is routed ~4 tokens, so the layers' 450 MB of experts stream once.
void BM_PrefillFullSizeLayers(benchmark::State& state) {
  auto weights = full_size_layers();
  auto backend = make_cpu_fast_backend(weights);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 128; ++i) prompt.push_back(int32_t((i * 7919 + 13) % weights->config.vocab_size));
  auto seq = backend->new_sequence(int64_t(prompt.size()));
  std::vector<float> logits;
  for (auto _ : state) {
    seq->reset();
    backend->forward(*seq, prompt, LogitsWanted::last, logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(prompt.size()));
}
BENCHMARK(BM_PrefillFullSizeLayers)->Unit(benchmark::kMillisecond)->UseRealTime();

// Batch steps (Backend::forward_batch, parallel requests): one token of each of N sequences at
// depths 100 + 17 i, each step's logits, the sequences rolled back to their depth when full.
// items_per_second: the tokens of all the streams together; ms a step. Args: N, and 1 for the
// backend's batch step or 0 for the default of Backend (the sequences one after another), the
// baseline in the same run.
void decode_batch(benchmark::State& state, const std::shared_ptr<ModelWeights>& weights) {
  const int N = int(state.range(0));
  const bool batched = state.range(1) != 0;
  state.SetLabel(batched ? "batched" : "one after another");
  auto backend = make_cpu_fast_backend(weights);
  const int32_t V = weights->config.vocab_size;
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<std::unique_ptr<RecurrentSnapshot>> at_depth;
  std::vector<SequenceState*> states;
  std::vector<float> logits;
  for (int i = 0; i < N; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 100 + 17 * i; ++t) prompt.push_back(int32_t((t * 7919 + 13 * i + 1) % V));
    seqs.push_back(backend->new_sequence(int64_t(prompt.size()) + 128));
    backend->forward(*seqs.back(), prompt, LogitsWanted::none, logits);
    at_depth.push_back(seqs.back()->snapshot());
    states.push_back(seqs.back().get());
  }
  std::vector<int32_t> tokens(size_t(N), 1);
  int64_t steps = 0;
  for (auto _ : state) {
    if (seqs[0]->length() + 1 >= seqs[0]->capacity())
      for (int i = 0; i < N; ++i) seqs[size_t(i)]->restore(*at_depth[size_t(i)]);
    if (batched) backend->forward_batch(states, tokens, logits);
    else backend->Backend::forward_batch(states, tokens, logits);
    for (int i = 0; i < N; ++i) {
      const float* row = logits.data() + size_t(i) * size_t(V);
      tokens[size_t(i)] = int32_t(std::max_element(row, row + V) - row);
    }
    ++steps;
  }
  state.SetItemsProcessed(steps * N);
}
void batch_args(benchmark::internal::Benchmark* b) {
  for (int batched : {0, 1})
    for (int n : {1, 2, 4, 8}) b->Args({n, batched});
}
void BM_DecodeBatchLilyTiny(benchmark::State& state) { decode_batch(state, lily_tiny()); }
void BM_DecodeBatchFullSizeLayers(benchmark::State& state) { decode_batch(state, full_size_layers()); }
BENCHMARK(BM_DecodeBatchLilyTiny)->Apply(batch_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeBatchFullSizeLayers)->Apply(batch_args)->Unit(benchmark::kMillisecond)->UseRealTime();

// A speculative verify step (issue 37): one forward of K + 1 rows of a sequence at depth ~100 with
// every row's logits, the rows' DeltaNet states kept (keep_row_states), then a rewind to its first
// row (every draft rejected: the rewind restores the most); K + 1 = 1 is a decode step. Args: the
// rows, and 1 to keep and rewind or 0 for the forward alone (what keeping costs, in the same
// run). items_per_second: rows; bytes_per_second: decode_step_bytes (the weights once, the
// union of the rows' experts, the state); read_GBps: the same threads' read bandwidth.
void verify_step(benchmark::State& state, const std::shared_ptr<ModelWeights>& weights) {
  const int rows = int(state.range(0));
  const bool keep = state.range(1) != 0;
  state.SetLabel(keep ? "keep + rewind" : "forward only");
  auto backend = make_cpu_fast_backend(weights);
  const int32_t V = weights->config.vocab_size;
  std::vector<int32_t> prompt, tokens;
  for (int t = 0; t < 100; ++t) prompt.push_back(int32_t((t * 7919 + 13) % V));
  for (int t = 0; t < rows; ++t) tokens.push_back(int32_t((t * 104729 + 7) % V));
  auto seq = backend->new_sequence(int64_t(prompt.size()) + 256);
  std::vector<float> logits;
  backend->forward(*seq, prompt, LogitsWanted::none, logits);
  auto at_prompt = seq->snapshot();
  int64_t steps = 0;
  for (auto _ : state) {
    if (seq->length() + rows > seq->capacity()) {
      state.PauseTiming();
      seq->restore(*at_prompt);
      state.ResumeTiming();
    }
    if (keep && !seq->keep_row_states(rows)) state.SkipWithError("keep_row_states refused");
    backend->forward(*seq, tokens, LogitsWanted::all, logits);
    if (keep && !seq->rewind(seq->length() - rows + 1, seq->mtp_length())) state.SkipWithError("rewind refused");
    benchmark::DoNotOptimize(logits.data());
    ++steps;
  }
  state.SetItemsProcessed(steps * rows);
  state.SetBytesProcessed(int64_t(double(steps) * decode_step_bytes(weights->config, 100, rows)));
  state.counters["read_GBps"] = cpu_fast::measure_read_bandwidth() / 1e9;
}
void verify_args(benchmark::internal::Benchmark* b) {
  for (int rows : {1, 2, 3, 4, 8})
    for (int keep : {0, 1}) b->Args({rows, keep});
}
void BM_VerifyLilyTiny(benchmark::State& state) { verify_step(state, lily_tiny()); }
void BM_VerifyFullSizeLayers(benchmark::State& state) { verify_step(state, full_size_layers()); }
BENCHMARK(BM_VerifyLilyTiny)->Apply(verify_args)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_VerifyFullSizeLayers)->Apply(verify_args)->Unit(benchmark::kMillisecond)->UseRealTime();

// Prefill of a 128-token prompt (llama-bench -p 128), logits of the last token; items: tokens.
void prefill(benchmark::State& state, bool fast) {
  auto weights = lily_tiny();
  auto backend = fast ? make_cpu_fast_backend(weights) : make_cpu_backend(weights);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 128; ++i) prompt.push_back(int32_t((i * 7919 + 13) % weights->config.vocab_size));
  auto seq = backend->new_sequence(int64_t(prompt.size()));
  std::vector<float> logits;
  for (auto _ : state) {
    seq->reset();
    backend->forward(*seq, prompt, LogitsWanted::last, logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(prompt.size()));
}
void BM_PrefillLilyTinyFast(benchmark::State& state) { prefill(state, true); }
void BM_PrefillLilyTinyReference(benchmark::State& state) { prefill(state, false); }
BENCHMARK(BM_PrefillLilyTinyFast)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PrefillLilyTinyReference)->Unit(benchmark::kMillisecond)->UseRealTime();

// One product y = W x on one thread (x's preparation included): args rows, cols, bits, isa, dot.
void BM_Gemv(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const int bits = int(state.range(2));
  const auto isa = cpu_fast::Isa(state.range(3));
  const auto dot = cpu_fast::Dot(state.range(4));
  if (!cpu_fast::isa_supported(isa)) {
    state.SkipWithError("this processor does not run the kernel");
    return;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> w(size_t(rows * cols)), x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  for (auto& v : w) v = dist(rng);
  for (auto& v : x) v = dist(rng);
  QuantizedMatrix q = quantize_affine(w, rows, cols, bits, 64);
  Matrix m;
  m.rows = rows, m.cols = cols, m.format = MatrixFormat::affine, m.bits = bits, m.group_size = 64;
  m.data = q.codes.data(), m.scales = q.scales.data(), m.biases = q.biases.data();
  for (auto _ : state) {
    cpu_fast::gemv(m, x.data(), y.data(), isa, dot);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.bytes()));
  state.SetLabel(std::string(cpu_fast::to_string(isa)) + "/" + cpu_fast::to_string(dot));
}
// Full-size shapes: an expert's gate/up [512, 2048] and down [2048, 512] (q4, in L2 or L3 when
// repeated), the router [256, 2048] (q8), and a 32 MB q4 matrix [16384, 4096] that streams from memory.
void gemv_args(benchmark::internal::Benchmark* b) {
  for (int isa = 0; isa < 3; ++isa)
    for (int dot = 0; dot < 2; ++dot) {
      b->Args({512, 2048, 4, isa, dot});
      b->Args({2048, 512, 4, isa, dot});
      b->Args({256, 2048, 8, isa, dot});
      b->Args({16384, 4096, 4, isa, dot});
    }
}
BENCHMARK(BM_Gemv)->Apply(gemv_args)->Unit(benchmark::kMicrosecond);

// The prefill product on one thread (gemm.h; the tokens' preparation outside the timing):
// args rows, cols, bits, tokens. items: multiply-adds (rows x cols x tokens); bytes: weights.
void BM_Gemm(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), n = state.range(3);
  const int bits = int(state.range(2));
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> word;
  std::vector<uint32_t> codes(size_t(rows * cols * bits / 32));
  for (auto& w : codes) w = word(rng);
  std::vector<bf16> scales(size_t(rows * cols / 64), to_bf16(0.01f)), biases(scales.size(), to_bf16(-0.08f));
  std::normal_distribution<float> dist;
  std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
  for (auto& v : x) v = dist(rng);
  Matrix m;
  m.rows = rows, m.cols = cols, m.format = MatrixFormat::affine, m.bits = bits, m.group_size = 64;
  m.data = codes.data(), m.scales = scales.data(), m.biases = biases.data();
  cpu_fast::TokenBatch batch;
  cpu_fast::prepare_tokens(x.data(), n, cols, batch);
  cpu_fast::GemmScratch scratch;
  for (auto _ : state) {
    cpu_fast::gemm_rows(m, batch, 0, rows, y.data(), rows, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * rows * cols * n);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.bytes()));
  state.SetLabel(cpu_fast::to_string(cpu_fast::active_isa()));
}
// An expert's gate [512, 2048] and down [2048, 512] against the ~4 tokens routed to it in a
// 128-token prefill (and 1, 2, 8, 16); a DeltaNet in_proj [8192, 2048] against 128 tokens; the router (q8).
BENCHMARK(BM_Gemm)
    ->Args({512, 2048, 4, 1})
    ->Args({512, 2048, 4, 2})
    ->Args({512, 2048, 4, 4})
    ->Args({512, 2048, 4, 8})
    ->Args({512, 2048, 4, 16})
    ->Args({2048, 512, 4, 4})
    ->Args({8192, 2048, 4, 128})
    ->Args({2048, 4096, 4, 128})
    ->Args({256, 2048, 8, 128})
    ->Unit(benchmark::kMicrosecond);

// The prefill product of an expert's gate [512, 2048] against 4 tokens, cycling through 192
// such matrices (105 MB, beyond L3), as the experts of a prefill come from memory; one thread.
// bytes: weights read, beside the read bandwidth of one thread.
void BM_GemmFromMemory(benchmark::State& state) {
  const int64_t rows = 512, cols = 2048, n = state.range(0), count = 192;
  SyntheticStore store;
  std::vector<Matrix> mats;
  for (int64_t i = 0; i < count; ++i) mats.push_back(synthetic_matrix(store, rows, cols, 4, 1000 + uint64_t(i)));
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
  for (auto& v : x) v = dist(rng);
  cpu_fast::TokenBatch batch;
  cpu_fast::prepare_tokens(x.data(), n, cols, batch);
  cpu_fast::GemmScratch scratch;
  int64_t i = 0;
  for (auto _ : state) {
    cpu_fast::gemm_rows(mats[size_t(i++ % count)], batch, 0, rows, y.data(), rows, scratch);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * rows * cols * n);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(mats[0].bytes()));
}
BENCHMARK(BM_GemmFromMemory)->Arg(1)->Arg(4)->Arg(8)->Unit(benchmark::kMicrosecond);

// The delta rule of one DeltaNet layer (32 value heads, 128 x 128 states) over T tokens, one
// thread: arg 0 delta_rule_step per token, 1 delta_rule_tokens (gemv.h's active ISA); T 1
// (decode) or 128 (prefill). items: token-heads.
void BM_DeltaRule(benchmark::State& state) {
  const bool tokens = state.range(0) == 1;
  const int64_t T = state.range(1), heads = 32, dk = 128, dv = 128, stride = 2 * dk + dv;
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.f, 0.1f);
  std::vector<float> S(size_t(heads * dk * dv)), rows(size_t(T * stride)), o(size_t(T * dv)), m(dv), r(dv);
  for (auto& v : S) v = dist(rng);
  for (auto& v : rows) v = dist(rng);
  std::vector<float> g(size_t(T), -0.05f), beta(size_t(T), 0.5f);
  const cpu::DeltaRuleInputs in{
      rows.data(), rows.data() + dk, rows.data() + 2 * dk, g.data(), beta.data(), stride, stride, stride, 1, T, dk, dv};
  for (auto _ : state) {
    for (int64_t h = 0; h < heads; ++h) {
      float* Sh = S.data() + h * dk * dv;
      if (tokens) cpu_fast::delta_rule_tokens(in, Sh, o.data(), dv, m.data(), r.data());
      else
        for (int64_t t = 0; t < T; ++t)
          cpu_fast::delta_rule_step(in.q + t * stride, in.k + t * stride, in.v + t * stride, g[size_t(t)],
                                    beta[size_t(t)], dk, dv, Sh, o.data() + t * dv, m.data(), r.data());
    }
    benchmark::DoNotOptimize(o.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * heads * T);
  state.SetLabel(tokens ? "delta_rule_tokens" : "delta_rule_step");
}
BENCHMARK(BM_DeltaRule)->Args({0, 1})->Args({1, 1})->Args({0, 128})->Args({1, 128})->Unit(benchmark::kMicrosecond);

// The delta rule of one DeltaNet layer over the T rows of a verify, one thread, delta_rule_tokens
// keeping the states after the first T - 1 rows (1) or not (0): what keep_row_states adds to a
// verify's delta rule, 2 MB written a kept row beyond the update. Args: T, keep. bytes: kept.
void BM_DeltaRuleKept(benchmark::State& state) {
  const int64_t T = state.range(0), heads = 32, dk = 128, dv = 128, stride = 2 * dk + dv;
  const bool keep = state.range(1) != 0;
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.f, 0.1f);
  std::vector<float> S(size_t(heads * dk * dv)), rows(size_t(T * stride)), o(size_t(T * dv)), m(dv), r(dv);
  std::vector<float> kept(size_t((T - 1) * heads * dk * dv));
  for (auto& v : S) v = dist(rng);
  for (auto& v : rows) v = dist(rng);
  std::vector<float> g(size_t(T), -0.05f), beta(size_t(T), 0.5f);
  const cpu::DeltaRuleInputs in{
      rows.data(), rows.data() + dk, rows.data() + 2 * dk, g.data(), beta.data(), stride, stride, stride, 1, T, dk, dv};
  for (auto _ : state) {
    for (int64_t h = 0; h < heads; ++h) {
      const cpu_fast::KeptStates k{kept.data() + h * dk * dv, 0, keep ? T - 1 : 0, heads * dk * dv};
      cpu_fast::delta_rule_tokens(in, S.data() + h * dk * dv, o.data(), dv, m.data(), r.data(), k);
    }
    benchmark::DoNotOptimize(S.data());
    benchmark::DoNotOptimize(kept.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * T * heads);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kept.size() * 4) * (keep ? 1 : 0));
}
BENCHMARK(BM_DeltaRuleKept)
    ->Args({2, 0})
    ->Args({2, 1})
    ->Args({4, 0})
    ->Args({4, 1})
    ->Args({8, 0})
    ->Args({8, 1})
    ->Unit(benchmark::kMicrosecond);

// A 151 MB q4 matrix [65536, 4096] (far beyond L3) through gemv_parallel on every thread of the
// team, against the read bandwidth of the same threads (machine_probe.h): the fraction of the
// memory's speed a decode step's products can reach.
void BM_GemvTeamFromMemory(benchmark::State& state) {
  const int64_t rows = 65536, cols = 4096;
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> word;
  std::vector<uint32_t> codes(size_t(rows * cols / 8));
  for (auto& w : codes) w = word(rng);
  std::vector<bf16> scales(size_t(rows * cols / 64), to_bf16(0.01f)), biases(scales.size(), to_bf16(-0.08f));
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  Matrix m;
  m.rows = rows, m.cols = cols, m.format = MatrixFormat::affine, m.bits = 4, m.group_size = 64;
  m.data = codes.data(), m.scales = scales.data(), m.biases = biases.data();
  const cpu_fast::GemvTask task{&m, x.data(), y.data()};
  for (auto _ : state) {
    cpu_fast::gemv_parallel({&task, 1});
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.bytes()));
  state.counters["read_GBps"] = cpu_fast::measure_read_bandwidth() / 1e9;
}
BENCHMARK(BM_GemvTeamFromMemory)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace lily

BENCHMARK_MAIN();
